//! The engine driving the Vulkan home (on lavapipe in CI) with the real SmolLM2, beyond the
//! scheduler's scenarios (those run on every home in crates/engine/tests/conformance.rs):
//! sampled streams drawing from the home's top candidates, and engines on a device each.

mod common;

use std::sync::atomic::Ordering;
use std::sync::Arc;

use common::Model;
use resin_core::{Counters, KvCodec, Need, RowOut, StepAll, StepOut};
use resin_engine::{Engine, EngineConfig, GenEvent, GenHandle, GenRequest};
use resin_vulkan::{VulkanHome, VulkanOptions, WideMode};

/// Tokens each stream generates (greedy, no stop ids: every run has this length).
const TOKENS: usize = 8;

/// An engine over a Vulkan home of `regions` regions on `gpu`.
fn engine(m: &Model, gpu: &Arc<resin_vulkan::Gpu>, regions: usize) -> Engine {
    let opts = VulkanOptions { n_ctx: Some(128), regions, codec: KvCodec::F16, q8_activations: true, progress: None, wide: WideMode::Lanes, ..VulkanOptions::default() };
    let home = VulkanHome::on(gpu.clone(), m.file.clone(), m.cfg.clone(), &opts, Arc::new(Counters::default())).unwrap();
    Engine::start(Box::new(home), m.tok.clone(), EngineConfig::default())
}

fn request(prompt: Vec<u32>) -> GenRequest {
    request_n(prompt, TOKENS)
}

fn request_n(prompt: Vec<u32>, tokens: usize) -> GenRequest {
    let mut r = GenRequest::new(prompt, tokens);
    r.stop_ids = Some(Vec::new());
    r
}

fn collect(mut h: GenHandle) -> Vec<u32> {
    let mut ids = Vec::new();
    while let Some(ev) = h.blocking_next() {
        match ev {
            GenEvent::Delta { ids: new, .. } => ids.extend(new),
            GenEvent::Done(_) => return ids,
            GenEvent::Error(e) => panic!("generation failed: {e}"),
        }
    }
    panic!("stream ended without Done");
}

/// The seventh session's crash on the H200 (3 of 3 runs): engines on a device each, dropped
/// by their threads one after another. Ignored (a device each is slow on lavapipe); run it on
/// the GPU machine: `bash scripts/gpu/gpu_tests.sh "engine engines_on_a_device_each --ignored"`.
#[test]
#[ignore]
fn engines_on_a_device_each_start_and_drop_in_turn() {
    let m = common::model("smollm2-135m");
    let p = m.tok.encode("Owls:", false, false).unwrap()[..2].to_vec();
    let mut first = None;
    for round in 0..4 {
        let Some(gpu) = common::gpu() else { return };
        let e = engine(&m, &gpu, 2);
        drop(gpu);
        let got = collect(e.submit(request(p.clone())).unwrap());
        drop(e);
        eprintln!("round {round}: {} tokens, the engine and its device dropped", got.len());
        match &first {
            None => first = Some(got),
            Some(f) => assert_eq!(&got, f, "round {round}: another device gave other tokens"),
        }
    }
}

/// The Vulkan home read as a home without a device selection would be: every row's whole
/// logits back, each row's result (argmax, top candidates, the row) made from them on the host.
struct WholeRows(VulkanHome);

impl resin_core::Home for WholeRows {
    fn spec(&self) -> &resin_core::HomeSpec {
        self.0.spec()
    }
    fn prefill(&mut self, segments: &[resin_core::Segment<'_>]) -> resin_core::Result<resin_core::Logits> {
        self.0.prefill(segments)
    }
    fn step(&mut self, rows: &[resin_core::Row], needs: &[Need]) -> resin_core::Result<StepOut> {
        let l = self.0.step_logits(rows)?;
        Ok(StepOut { rows: needs.iter().enumerate().map(|(i, &n)| RowOut::from_logits(n, l.row(i))).collect() })
    }
    fn counters(&self) -> &Arc<Counters> {
        self.0.counters()
    }
    fn save_region(&mut self, region: resin_core::RegionId, rows: usize) -> resin_core::Result<Vec<u8>> {
        self.0.save_region(region, rows)
    }
    fn load_region(&mut self, region: resin_core::RegionId, rows: usize, snapshot: &[u8]) -> resin_core::Result<()> {
        self.0.load_region(region, rows, snapshot)
    }
}

/// Sampled streams whose samplers keep at most 64 candidates (top_k 40, the server's
/// defaults otherwise) draw the same tokens when the Vulkan home reads back only each row's
/// top 64 (`Need::Top`) as when every row's logits come back (`WholeRows`): 7 concurrent
/// streams, 12 tokens each, two of them greedy (a step of both kinds takes the top path too:
/// the greedy rows' argmax ids come back with it), and two whose draws need their whole rows
/// (penalties; no top_k), which a step reads back for them alone. Controls: whole rows come
/// back for the two streams' 11 decode steps each and no others, and other seeds draw other
/// tokens.
#[test]
fn sampled_streams_draw_the_same_tokens_from_the_top_candidates() {
    // The home against itself: the model's depth adds only time (see tests/prefill.rs).
    let m = common::model_cut("smollm2-135m", 4);
    let Some(gpu) = common::gpu() else { return };
    let subjects = ["cats", "the sea", "bread", "trains", "winter", "a lamp", "rivers"];
    let ps: Vec<Vec<u32>> = subjects.iter().map(|s| m.tok.encode(&format!("A story about {s}:"), false, false).unwrap()).collect();
    const TOKENS: usize = 12;
    // Streams 5 and 6 need their whole rows: penalties, and top_p without a top_k.
    let whole = [5usize, 6];
    let run = |top_cut: bool, seed0: u64| -> Vec<Vec<u32>> {
        let opts =
            VulkanOptions { n_ctx: Some(128), regions: ps.len(), codec: KvCodec::F16, q8_activations: true, progress: None, wide: WideMode::Lanes, ..VulkanOptions::default() };
        let counters = Arc::new(Counters::default());
        let home = VulkanHome::on(gpu.clone(), m.file.clone(), m.cfg.clone(), &opts, counters.clone()).unwrap();
        let home: Box<dyn resin_core::Home> = if top_cut { Box::new(home) } else { Box::new(WholeRows(home)) };
        let e = Engine::start(home, m.tok.clone(), EngineConfig::default());
        let hs: Vec<GenHandle> = ps
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let mut r = request_n(p.clone(), TOKENS);
                let temperature = if i % 3 == 0 { 0.0 } else { 0.8 };
                r.params = resin_engine::SamplingParams { temperature, top_k: 40, top_p: 0.95, min_p: 0.05, seed: Some(seed0 + i as u64), ..Default::default() };
                match i {
                    5 => (r.params.repetition_penalty, r.params.frequency_penalty) = (1.3, 0.5),
                    6 => (r.params.temperature, r.params.top_k, r.params.top_p) = (0.8, 0, 0.9),
                    _ => {}
                }
                e.submit(r).unwrap()
            })
            .collect();
        let out: Vec<Vec<u32>> = hs.into_iter().map(collect).collect();
        assert!(out.iter().all(|o| o.len() == TOKENS));
        let n = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
        let (steps, top, argmax, rows) = (n(&counters.decode_steps), n(&counters.decode_top_steps), n(&counters.decode_argmax_steps), n(&counters.decode_logits_rows));
        // Whole rows come back for the two streams' decode steps alone (their first token
        // is the prefill's): a step holding other streams is a top step (greedy streams left
        // alone take argmax steps), and only a step of the two alone is a logits step.
        assert!(top > 0 && top + argmax <= steps, "{steps} steps: {top} top, {argmax} argmax");
        assert_eq!(rows as usize, whole.len() * (TOKENS - 1), "whole rows for the streams that need them alone");
        out
    };
    let full = run(false, 7);
    let cut = run(true, 7);
    assert_eq!(cut, full, "the top candidates draw what the logits draw");
    assert_ne!(run(true, 1007), cut, "control: other seeds draw other tokens");
}
