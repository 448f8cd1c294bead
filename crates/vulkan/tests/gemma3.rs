//! gemma3 on the Vulkan home.
//!
//! A small synthetic gemma3 (f32 weights: both homes keep activations in f32) against the CPU
//! home, whose own test (crates/cpu/tests/gemma3_synthetic.rs) holds it to an f64 pass: a
//! prompt past the sliding window through the window attention's tiles, then decode steps
//! through the split-key attention, every feature of the architecture on (scaled embedding,
//! q/k norms, a rope base a layer kind, sliding-window and global layers, post-norms, GeGLU,
//! tied embeddings, soft-capped logits). Controls: the CPU home without the window, and
//! without the soft-cap, must fail the bar.
//!
//! The real Gemma 3 270M against the independent float32 numpy reference
//! (testdata/reference/gemma3-270m.json, the CPU home's oracle test): greedy ids with the 8-bit
//! activations it serves with, up to the reference's first near-tie on every prompt (the CPU
//! home's bar, 0.3). With f32 activations the device's first-step logits are held to the
//! reference in tests/parity.rs (`gemma3_f32_activations_match_float32_reference`), and its
//! greedy ids up to the reference's own near-tie (0.1, issue 32's bar) on every prompt.
//!
//! Past the window on the real file: a 689-token prompt (testdata/text/paradise-lost.txt)
//! through Gemma 3 270M's first seven blocks (sliding layers on both sides of the global one)
//! on both homes, the CPU home with its window widened past the prompt as the control.

mod common;

use common::{argmax, rel_l2};

use std::sync::Arc;

use resin_core::{Counters, Home, KvCodec, RegionId, Row, Segment, StepAll};
use resin_cpu::{CpuHome, CpuOptions};
use resin_gguf::synthetic::{Shape, Weights};
use resin_gguf::{GgufFile, Value};
use resin_model::ModelConfig;
use resin_vulkan::{VulkanHome, VulkanOptions};

const D: usize = 64;
const H: usize = 2;
const HKV: usize = 1;
const HD: usize = 64;
const FF: usize = 96;
const L: usize = 3;
const WINDOW: usize = 4;
const V: usize = 64;
const SHAPE: Shape = Shape { layers: L, d: D, heads: H, heads_kv: HKV, head_dim: HD, ff: FF };

/// A gemma3 file with random f32 weights: layers 0 and 1 slide over WINDOW keys, layer 2 is
/// global, logits soft-capped at 4.
fn synthetic() -> Arc<GgufFile> {
    let mut w = Weights::new(0x9e37_79b9_7f4a_7c15);
    w.mat("token_embd.weight", V, D, 0.15);
    w.blocks(&SHAPE, &[("attn_norm", D), ("ffn_norm", D), ("post_attention_norm", D), ("post_ffw_norm", D), ("attn_q_norm", HD), ("attn_k_norm", HD)]);
    let mut g = SHAPE.writer("gemma3", 128);
    let u = |v: usize| Value::U32(v as u32);
    g.set("gemma3.attention.sliding_window", u(WINDOW));
    g.set("gemma3.attention.sliding_window_pattern", u(3));
    g.set("gemma3.rope.freq_base", Value::F32(1e6));
    g.set("gemma3.attention.layer_norm_rms_epsilon", Value::F32(1e-6));
    g.set("gemma3.final_logit_softcapping", Value::F32(4.0));
    Arc::new(GgufFile::from_bytes(w.write(g)).unwrap())
}

fn cpu_home(file: Arc<GgufFile>, cfg: ModelConfig, n_ctx: usize) -> CpuHome {
    CpuHome::new(file, cfg, &CpuOptions { n_ctx: Some(n_ctx), regions: 1, codec: KvCodec::F16, threads: None, progress: None }, Arc::new(Counters::default())).unwrap()
}

fn vk_home(gpu: Arc<resin_vulkan::Gpu>, file: Arc<GgufFile>, n_ctx: usize, q8_activations: bool) -> VulkanHome {
    let cfg = ModelConfig::from_gguf(&file).unwrap();
    let opts = VulkanOptions { n_ctx: Some(n_ctx), regions: 1, codec: KvCodec::F16, q8_activations, ..VulkanOptions::default() };
    VulkanHome::on(gpu, file, cfg, &opts, Arc::new(Counters::default())).unwrap()
}

/// Both homes in f32 through three small layers: the summation orders differ, nothing else.
const SYNTH_BAR: f64 = 1e-4;

#[test]
fn synthetic_gemma3_matches_the_cpu_home_past_its_window() {
    let Some(gpu) = common::gpu() else { return };
    let file = synthetic();
    let cfg = ModelConfig::from_gguf(&file).unwrap();
    assert_eq!((0..L).map(|l| cfg.layer_window(l)).collect::<Vec<_>>(), [Some(WINDOW), Some(WINDOW), None]);
    let mut vk = vk_home(gpu, file.clone(), 64, false);
    let mut cpu = cpu_home(file.clone(), cfg.clone(), 64);
    let mut no_window = cpu_home(file.clone(), ModelConfig { swa: None, ..cfg.clone() }, 64);
    let mut no_cap = cpu_home(file, ModelConfig { logit_softcap: None, ..cfg }, 64);
    // 20 rows: the window attention's tiles (16 rows and more), five times the window.
    let prompt: Vec<u32> = (0..20u32).map(|i| (i * 7 + 3) % V as u32).collect();
    let seg = [Segment { region: RegionId(0), start: 0, tokens: &prompt }];
    let (lv, lc) = (vk.prefill(&seg).unwrap(), cpu.prefill(&seg).unwrap());
    let (lw, lk) = (no_window.prefill(&seg).unwrap(), no_cap.prefill(&seg).unwrap());
    let e = rel_l2(lv.row(0), lc.row(0));
    let (cw, ck) = (rel_l2(lv.row(0), lw.row(0)), rel_l2(lv.row(0), lk.row(0)));
    eprintln!("gemma3 synthetic: prefill logits relative L2 {e:.2e}; controls: no window {cw:.2e}, no soft-cap {ck:.2e}");
    assert!(e < SYNTH_BAR, "prefill: relative L2 {e:.3e} >= {SYNTH_BAR}");
    assert!(cw >= SYNTH_BAR && ck >= SYNTH_BAR, "a control passed the bar: no window {cw:.3e}, no soft-cap {ck:.3e}");
    // Decode steps (the split-key attention), each home on its own greedy token.
    let mut tok = argmax(lc.row(0));
    for i in 0..6 {
        let row = [Row { region: RegionId(0), token: tok, pos: (prompt.len() + i) as u32 }];
        let (v, c) = (vk.step_logits(&row).unwrap(), cpu.step_logits(&row).unwrap());
        let w = no_window.step_logits(&row).unwrap();
        let (e, cw) = (rel_l2(v.row(0), c.row(0)), rel_l2(v.row(0), w.row(0)));
        eprintln!("  step {i}: relative L2 {e:.2e}; control (no window) {cw:.2e}");
        assert!(e < SYNTH_BAR, "step {i}: relative L2 {e:.3e} >= {SYNTH_BAR}");
        assert!(cw >= SYNTH_BAR, "step {i}: the no-window control passed the bar ({cw:.3e})");
        assert_eq!(argmax(v.row(0)), argmax(c.row(0)), "step {i}: greedy ids differ");
        tok = argmax(c.row(0));
    }
}

fn reference() -> serde_json::Value {
    reference_named("gemma3-270m")
}

fn reference_named(name: &str) -> serde_json::Value {
    let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("../../testdata/reference/{name}.json"));
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))).unwrap()
}

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

/// Greedy ids of the Vulkan home against the reference on every prompt, up to the first step
/// whose reference top-2 margin is under `near_tie`; returns the tokens compared.
fn greedy_against_reference(vk: &mut VulkanHome, near_tie: f64, what: &str) -> usize {
    let reference = reference();
    let mut compared = 0;
    for case in reference["cases"].as_array().unwrap() {
        let prompt = ids(&case["prompt_ids"]);
        let want = ids(&case["greedy_ids"]);
        let margins: Vec<f64> = case["margins"].as_array().unwrap().iter().map(|m| m.as_f64().unwrap()).collect();
        let upto = margins.iter().position(|&m| m < near_tie).unwrap_or(want.len());
        let r = RegionId(0);
        let first = vk.prefill(&[Segment { region: r, start: 0, tokens: &prompt }]).unwrap();
        let mut got = vec![argmax(first.row(0))];
        while got.len() < upto {
            let pos = (prompt.len() + got.len() - 1) as u32;
            let l = vk.step_logits(&[Row { region: r, token: *got.last().unwrap(), pos }]).unwrap();
            got.push(argmax(l.row(0)));
        }
        eprintln!("gemma3-270m ({what}): {:?}: {upto} tokens compared", case["prompt"].as_str().unwrap_or(""));
        assert_eq!(got[..upto], want[..upto], "gemma3-270m ({what}): greedy ids of {:?} before the first near-tie (step {upto})", case["prompt"]);
        compared += upto;
    }
    compared
}

/// 8-bit activations (as the home serves): the CPU home's bar for them, 0.3 (8-bit rounding
/// moves this model's logits by up to about 0.2: crates/cpu/tests/reference.rs).
#[test]
fn gemma3_270m_q8_activations_follow_the_float32_reference() {
    follows_reference(true, 0.3, "8-bit activations");
}

/// f32 activations: the reference's own near-tie, 0.1 (issue 32's bar), on every prompt.
#[test]
fn gemma3_270m_f32_activations_follow_the_float32_reference() {
    follows_reference(false, 0.1, "f32 activations");
}

/// Gemma 3 270M on the Vulkan home, 8-bit activations or not, against the reference's greedy
/// ids up to `near_tie`: at least 32 tokens compared over the prompts.
fn follows_reference(q8_activations: bool, near_tie: f64, what: &str) {
    let Some(gpu) = common::gpu() else { return };
    let m = common::model("gemma3-270m");
    let mut vk = vk_home(gpu, m.file, 64, q8_activations);
    let n = greedy_against_reference(&mut vk, near_tie, what);
    assert!(n >= 32, "only {n} tokens compared before near-ties");
}

/// Vulkan against the CPU home on Gemma 3 270M, both with 8-bit activations: tests/parity.rs's
/// bar for this model (its post-norms carry each rounding difference to the residual).
const GEMMA_BAR: f64 = 5e-2;
/// Blocks of the long prompt's model: five sliding layers, the global one (5), and a sliding
/// one after it, at a fraction of the whole model's time on lavapipe.
const LONG_BLOCKS: usize = 7;
/// Decode steps after the long prompt.
const LONG_STEPS: usize = 8;
/// Greedy ids are compared where the CPU home's top-2 margin is at least this: the near-tie
/// bar crates/cpu/tests/reference.rs gives 8-bit activations on this model.
const NEAR_TIE: f32 = 0.3;

fn margin(v: &[f32]) -> f32 {
    let top = argmax(v) as usize;
    v[top] - v.iter().enumerate().filter(|&(i, _)| i != top).map(|(_, &x)| x).fold(f32::NEG_INFINITY, f32::max)
}

/// Gemma 3 270M's first LONG_BLOCKS blocks past the 512-key window on both homes: the
/// 689-token prompt of testdata/reference/gemma3-270m-long.json (BOS and the first 72 lines of
/// testdata/text/paradise-lost.txt; crates/cpu/tests/reference.rs holds the whole model on the
/// CPU home to that float32 reference). Prefill is two windows of the chain, so the second
/// window's sliding layers drop keys the first stored; the decode steps run the split-key
/// attention over 689 keys and more. Both homes step the CPU home's greedy token; the first
/// logits and every step's within the bar of tests/parity.rs, and the same greedy id wherever
/// the CPU home's top-2 margin is clear of 8-bit noise. Control: the CPU home with its window
/// widened past the prompt (the same layers and rope bases) must fail the bar at every step.
#[test]
fn gemma3_270m_past_its_window_matches_the_cpu_home() {
    let Some(gpu) = common::gpu() else { return };
    let m = common::model_cut("gemma3-270m", LONG_BLOCKS);
    let prompt = ids(&reference_named("gemma3-270m-long")["cases"][0]["prompt_ids"]);
    let swa = m.cfg.swa.clone().expect("gemma3-270m slides");
    let global: Vec<usize> = (0..m.cfg.n_layer).filter(|&l| m.cfg.layer_window(l).is_none()).collect();
    assert_eq!((m.cfg.n_layer, global), (LONG_BLOCKS, vec![5]), "the cut holds both kinds of layer");
    assert!(prompt.len() >= swa.window + 128, "the prompt does not reach far past the window");
    let n_ctx = prompt.len() + LONG_STEPS;
    let t0 = std::time::Instant::now();
    let mut vk = vk_home(gpu, m.file.clone(), n_ctx, true);
    let mut cpu = cpu_home(m.file.clone(), m.cfg.clone(), n_ctx);
    let wide = resin_model::SlidingWindow { window: n_ctx, ..swa };
    let mut control = cpu_home(m.file.clone(), ModelConfig { swa: Some(wide), ..m.cfg.clone() }, n_ctx);
    let r = RegionId(0);
    let seg = [Segment { region: r, start: 0, tokens: &prompt }];
    let lv = vk.prefill(&seg).unwrap();
    let t_prefill = t0.elapsed().as_secs_f64();
    let (mut lc, lw) = (cpu.prefill(&seg).unwrap(), control.prefill(&seg).unwrap());
    let (e, cw) = (rel_l2(lv.row(0), lc.row(0)), rel_l2(lv.row(0), lw.row(0)));
    let n = prompt.len();
    eprintln!("gemma3-270m ({LONG_BLOCKS} blocks), {n} tokens: prefill logits relative L2 {e:.2e}; control (window widened) {cw:.2e} [{t_prefill:.1}s]");
    assert!(e < GEMMA_BAR, "prefill: relative L2 {e:.3e} >= {GEMMA_BAR}");
    assert!(cw >= GEMMA_BAR, "prefill: the control passed the bar ({cw:.3e})");
    let (mut lv, mut compared) = (lv, 0);
    for i in 0..LONG_STEPS {
        if i > 0 {
            let row = [Row { region: r, token: argmax(lc.row(0)), pos: (prompt.len() + i - 1) as u32 }];
            (lv, lc) = (vk.step_logits(&row).unwrap(), cpu.step_logits(&row).unwrap());
            let w = control.step_logits(&row).unwrap();
            let (e, cw) = (rel_l2(lv.row(0), lc.row(0)), rel_l2(lv.row(0), w.row(0)));
            eprintln!("  step {i}: relative L2 {e:.2e}; control {cw:.2e}");
            assert!(e < GEMMA_BAR, "step {i}: relative L2 {e:.3e} >= {GEMMA_BAR}");
            assert!(cw >= GEMMA_BAR, "step {i}: the control passed the bar ({cw:.3e})");
        }
        let (tv, tc, mc) = (argmax(lv.row(0)), argmax(lc.row(0)), margin(lc.row(0)));
        eprintln!("  step {i}: greedy id vulkan {tv}, cpu {tc} (CPU top-2 margin {mc:.2})");
        if mc >= NEAR_TIE {
            assert_eq!(tv, tc, "step {i}: greedy ids differ (CPU top-2 margin {mc:.2})");
            compared += 1;
        }
    }
    eprintln!("gemma3-270m ({LONG_BLOCKS} blocks): {compared} of {LONG_STEPS} greedy ids compared [{:.1}s in all]", t0.elapsed().as_secs_f64());
    assert!(compared * 2 >= LONG_STEPS, "only {compared} of {LONG_STEPS} steps clear of a near-tie");
}
