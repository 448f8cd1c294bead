//! How far the 8-bit activation rounding alone moves a model's logits, beside how far the two
//! homes are apart: both round activations to 8 bits, so a float difference of 1e-7 upstream
//! flips some roundings, and the homes part by a share of what the rounding itself moves.
//! A diagnostic, ignored by default (it prints, the bars live in the parity tests). Measured on
//! lavapipe (2026-12-03), last-row logits after a counting prompt of 12 / 48 tokens:
//! - SmolLM2-135M: CPU vs Vulkan 3.1e-2 / 1.8e-2; Vulkan 8-bit vs f32 activations 2.1e-2 /
//!   8.6e-3; CPU vs Vulkan f32 activations 1.4e-2 / 1.5e-2.
//! - `resin synth` Llama-3.2-1B Q8_0 (random weights): 2.9e-2 / 2.7e-2; 3.5e-2 / 2.8e-2;
//!   3.4e-2 / 2.8e-2.
//!
//! So the homes sit about as far apart as the rounding alone moves the logits, on the random
//! model as on the real one: that is why the synthetic model's prefill comparisons on the GPU
//! machine land at 3.2e-2 to 3.7e-2, past bars made for the real models' prompts.
//! Run it on a registry model or a `resin synth` file:
//!   RESIN_TEST_GGUF=m1.gguf cargo test --release -p resin-vulkan --test rounding_noise -- --ignored --nocapture

mod common;

use common::rel_l2;

use std::sync::Arc;

use resin_core::{Counters, Home, KvCodec, RegionId, Segment};
use resin_cpu::{CpuHome, CpuOptions};
use resin_vulkan::{VulkanHome, VulkanOptions};

#[test]
#[ignore]
fn rounding_noise_beside_the_gap_between_homes() {
    let m = common::model("smollm2-135m");
    let Some(gpu) = common::gpu() else { return };
    let text: String = (1..40).map(|i| format!("{i}, ")).collect();
    let ids = m.tok.encode(&text, true, false).unwrap();
    for len in [12usize, 48] {
        let prompt = &ids[..len.min(ids.len())];
        let seg = [Segment { region: RegionId(0), start: 0, tokens: prompt }];
        let mut cpu = CpuHome::new(
            m.file.clone(),
            m.cfg.clone(),
            &CpuOptions { n_ctx: Some(128), regions: 1, codec: KvCodec::F16, threads: None, progress: None },
            Arc::new(Counters::default()),
        )
        .unwrap();
        let vk = |q8| {
            VulkanHome::on(
                gpu.clone(),
                m.file.clone(),
                m.cfg.clone(),
                &VulkanOptions { n_ctx: Some(128), q8_activations: q8, ..VulkanOptions::default() },
                Arc::new(Counters::default()),
            )
            .unwrap()
        };
        let (mut vq, mut vf) = (vk(true), vk(false));
        let c = cpu.prefill(&seg).unwrap();
        let q = vq.prefill(&seg).unwrap();
        let f = vf.prefill(&seg).unwrap();
        eprintln!(
            "{} tokens: CPU vs Vulkan (both 8-bit) {:.2e}; Vulkan 8-bit vs f32 activations {:.2e}; CPU vs Vulkan f32 activations {:.2e}",
            prompt.len(),
            rel_l2(c.row(0), q.row(0)),
            rel_l2(q.row(0), f.row(0)),
            rel_l2(c.row(0), f.row(0)),
        );
    }
}
