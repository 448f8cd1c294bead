//! The engine on the CPU home with the real SmolLM2, beyond the scheduler's scenarios (those
//! run on every home in `conformance.rs`): what a step's rows read back, sampled streams at
//! once, limits, stop strings, a dropped handle, shutdown.

mod common;

use std::sync::atomic::Ordering;
use std::sync::Arc;

use resin_core::{Counters, Home, KvCodec, Need};
use resin_cpu::{CpuHome, CpuOptions};
use resin_engine::{Engine, EngineConfig, FinishReason, GenEvent, GenHandle, PrefillQuantum, SamplingParams};
use resin_gguf::GgufFile;
use resin_model::{ModelConfig, Tokenizer};

use common::{collect, request};

struct Model {
    file: Arc<GgufFile>,
    cfg: ModelConfig,
    tok: Arc<Tokenizer>,
}

fn model() -> Model {
    let path = resin_hub::ensure("smollm2-135m", false).expect("fetching SmolLM2-135M");
    let file = Arc::new(GgufFile::open(path).unwrap());
    let cfg = ModelConfig::from_gguf(&file).unwrap();
    let tok = Arc::new(Tokenizer::from_gguf(&file).unwrap());
    Model { file, cfg, tok }
}

fn cpu_home(m: &Model, regions: usize) -> CpuHome {
    let opts = CpuOptions { n_ctx: Some(512), regions, codec: KvCodec::F16, threads: None, progress: None };
    CpuHome::new(m.file.clone(), m.cfg.clone(), &opts, Arc::new(Counters::default())).unwrap()
}

fn engine(m: &Model, regions: usize, config: EngineConfig) -> Engine {
    Engine::start(Box::new(cpu_home(m, regions)), m.tok.clone(), config)
}

/// An engine on a home that takes at most NROW_MAX rows a step.
fn grouped_engine(m: &Model, regions: usize) -> Engine {
    Engine::start(Box::new(Wrapped::new(cpu_home(m, regions)).rows_max(resin_core::NROW_MAX)), m.tok.clone(), EngineConfig::default())
}

fn prompts(m: &Model, n: usize) -> Vec<Vec<u32>> {
    let subjects = ["cats", "the sea", "bread", "trains", "winter", "music", "gardens", "rivers", "stars", "books", "tea", "clocks", "bridges", "owls", "salt", "paper", "maps"];
    (0..n).map(|i| m.tok.encode(&format!("Here is a short note about {}:", subjects[i % subjects.len()]), false, false).unwrap()).collect()
}

/// The decode steps are counted by what their rows needed: a greedy stream's 11 steps are
/// argmax steps, and a top-k stream's 11 are top steps; neither reads back a whole row. Each
/// step's time in the home is counted (a CPU forward pass takes at least a microsecond).
#[test]
fn decode_steps_count_what_the_rows_needed() {
    let m = model();
    let p = prompts(&m, 1).remove(0);
    let n = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
    for sampled in [false, true] {
        let e = engine(&m, 1, EngineConfig::default());
        let mut r = request(p.clone(), 12);
        if sampled {
            r.params = resin_engine::SamplingParams { temperature: 0.8, top_k: 40, seed: Some(1), ..Default::default() };
        }
        assert_eq!(collect(e.submit(r).unwrap()).0.len(), 12);
        let c = e.counters();
        let got = (n(&c.decode_steps), n(&c.decode_argmax_steps), n(&c.decode_top_steps), n(&c.decode_logits_rows));
        assert_eq!(got, (11, if sampled { 0 } else { 11 }, if sampled { 11 } else { 0 }, 0), "sampled {sampled}: (steps, argmax steps, top steps, logits rows)");
        assert!(n(&c.decode_home_microseconds) >= n(&c.decode_steps), "a CPU step takes at least a microsecond");
    }
}

/// A CPU home that says when it is dropped (`dropped`), with `whole` returns every row's
/// whole logits whatever its need (as a home that reads back only logits would), with
/// `rows_max` says it takes at most that many rows a step, and keeps each step's needs
/// (`calls`).
struct Wrapped {
    home: CpuHome,
    spec: resin_core::HomeSpec,
    whole: bool,
    dropped: Option<Arc<std::sync::atomic::AtomicBool>>,
    calls: Arc<std::sync::Mutex<Vec<Vec<Need>>>>,
}

impl Wrapped {
    fn new(home: CpuHome) -> Wrapped {
        Wrapped { spec: home.spec().clone(), home, whole: false, dropped: None, calls: Arc::default() }
    }
    fn rows_max(mut self, n: usize) -> Wrapped {
        self.spec.step_rows_max = n;
        self
    }
}

impl Drop for Wrapped {
    fn drop(&mut self) {
        if let Some(d) = &self.dropped {
            d.store(true, Ordering::SeqCst);
        }
    }
}

impl resin_core::Home for Wrapped {
    fn spec(&self) -> &resin_core::HomeSpec {
        &self.spec
    }
    fn prefill(&mut self, segments: &[resin_core::Segment<'_>]) -> resin_core::Result<resin_core::Logits> {
        self.home.prefill(segments)
    }
    fn step(&mut self, rows: &[resin_core::Row], needs: &[Need]) -> resin_core::Result<resin_core::StepOut> {
        resin_core::check_step(&self.spec, rows, needs)?;
        self.calls.lock().unwrap().push(needs.to_vec());
        if self.whole {
            return self.home.step(rows, &vec![Need::Logits; rows.len()]);
        }
        self.home.step(rows, needs)
    }
    fn counters(&self) -> &Arc<Counters> {
        self.home.counters()
    }
    fn save_region(&mut self, region: resin_core::RegionId, rows: usize) -> resin_core::Result<Vec<u8>> {
        self.home.save_region(region, rows)
    }
    fn load_region(&mut self, region: resin_core::RegionId, rows: usize, snapshot: &[u8]) -> resin_core::Result<()> {
        self.home.load_region(region, rows, snapshot)
    }
}

/// A step whose streams need different things of their rows reads each what it needs: greedy
/// streams the argmax id, top-k streams the largest logits, and streams with penalties or no
/// top_k their whole row, named to the home's top path, which then serves every step of
/// concurrent streams of all three kinds. The tokens equal those of the same streams on the
/// plain CPU home (every row's logits). Controls: the rows read back whole are exactly the two
/// whole-row streams' 11 decode steps each (an engine that named none, or all, or took the
/// logits path for mixed steps would count otherwise), and other seeds draw other tokens.
#[test]
fn a_step_reads_back_whole_rows_only_for_the_streams_that_need_them() {
    let m = model();
    let ps = prompts(&m, 5);
    let params = |i: usize, seed0: u64| {
        let mut p = SamplingParams { temperature: 0.8, top_k: 40, top_p: 0.95, min_p: 0.05, seed: Some(seed0 + i as u64), ..Default::default() };
        match i {
            0 => p.temperature = 0.0,
            3 => (p.repetition_penalty, p.presence_penalty) = (1.3, 0.4),
            4 => (p.top_k, p.top_p) = (0, 0.9),
            _ => {}
        }
        p
    };
    let run = |top: bool, seed0: u64| -> (Vec<Vec<u32>>, Vec<usize>, Arc<Counters>) {
        let opts = CpuOptions { n_ctx: Some(512), regions: ps.len(), codec: KvCodec::F16, threads: None, progress: None };
        let counters = Arc::new(Counters::default());
        let cpu = CpuHome::new(m.file.clone(), m.cfg.clone(), &opts, counters.clone()).unwrap();
        let mut home = Wrapped::new(cpu);
        home.whole = !top;
        let calls = home.calls.clone();
        let home: Box<dyn resin_core::Home> = Box::new(home);
        let e = Engine::start(home, m.tok.clone(), EngineConfig::default());
        let hs: Vec<GenHandle> = ps
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let mut r = request(p.clone(), 12);
                r.params = params(i, seed0);
                e.submit(r).unwrap()
            })
            .collect();
        let out = hs.into_iter().map(|h| collect(h).0).collect();
        drop(e);
        // Each step's count of rows that came back whole (a step with top rows).
        let named = calls.lock().unwrap().iter().filter(|n| n.contains(&Need::Top)).map(|n| n.iter().filter(|&&x| x == Need::Logits).count()).collect();
        (out, named, counters)
    };
    let n = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
    let (plain, _, _) = run(false, 11);
    let (topped, named, tc) = run(true, 11);
    assert_eq!(topped, plain, "the top path draws what the logits draw");
    // Whole rows come back for the two streams' 11 decode steps each and no others: beside
    // top rows in the steps that hold other streams too, or in a logits step of the two alone
    // (should the others have finished first). The home's calls with top rows are the decode
    // steps with them and the peels whose last rows draw from their tops.
    assert_eq!(n(&tc.decode_logits_rows), 2 * 11, "whole rows for the two streams' decode steps alone");
    assert!(n(&tc.decode_top_steps) as usize <= named.len() && named.len() <= n(&tc.decode_top_steps) as usize + n(&tc.peel_steps) as usize);
    let named_rows: usize = named.iter().sum();
    assert!(n(&tc.decode_top_steps) > 0 && named_rows > 0 && named_rows <= 2 * 11, "{named_rows} rows named");
    assert_ne!(run(true, 1011).0, topped, "control: other seeds draw other tokens");
}

#[test]
fn sampled_streams_at_once_draw_what_each_draws_alone() {
    // Seeded sampling: the streams' draws run in parallel on the host, each with its own
    // generator, so ten at once give each stream's tokens alone.
    let m = model();
    let ps = prompts(&m, 10);
    let req = |i: usize, seed: u64| {
        let mut r = request(ps[i].clone(), 12);
        r.params = SamplingParams { temperature: 0.9, top_p: 0.95, seed: Some(seed), ..SamplingParams::default() };
        r
    };
    let alone: Vec<Vec<u32>> = {
        let e = engine(&m, 1, EngineConfig::default());
        (0..ps.len()).map(|i| collect(e.submit(req(i, 100 + i as u64)).unwrap()).0).collect()
    };
    let e = grouped_engine(&m, ps.len());
    let handles: Vec<GenHandle> = (0..ps.len()).map(|i| e.submit(req(i, 100 + i as u64)).unwrap()).collect();
    for (i, h) in handles.into_iter().enumerate() {
        assert_eq!(collect(h).0, alone[i], "sampled stream {i} differs from the same request alone");
    }
    assert!(e.counters().grouped_steps.load(Ordering::Relaxed) > 0, "ten streams step in groups");
    // Control: other seeds draw other tokens (for some stream).
    let other: Vec<Vec<u32>> = (0..ps.len()).map(|i| collect(e.submit(req(i, 900 + i as u64)).unwrap()).0).collect();
    assert_ne!(other, alone, "the seed must matter");
}

/// `PrefillQuantum::Pace`: a prompt that comes while a stream decodes is prefilled in chunks
/// sized to a share of that stream's step (here a few rows a tick) and gives the tokens it
/// gives alone. Control: under `Auto` the same prompt beside the same stream is one chunk.
#[test]
fn paced_prefill_cuts_a_late_prompt_to_the_decoding_streams_step() {
    const ROWS: usize = 40;
    let m = model();
    let text = "The lighthouse keeper climbed the spiral stairs every evening at dusk, carrying a tin of oil, \
        a rag and a small notebook in which he wrote down the colour of the sky and the height of the waves.";
    let long = m.tok.encode(text, false, false).unwrap()[..ROWS].to_vec();
    let short = prompts(&m, 1).remove(0);
    let n = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
    let chunks = |e: &Engine| n(&e.counters().prefill_windows) + n(&e.counters().peel_steps);
    let alone = collect(engine(&m, 1, EngineConfig::default()).submit(request(long.clone(), 8)).unwrap()).0;
    let mut cuts = Vec::new();
    for mode in [PrefillQuantum::Pace, PrefillQuantum::Auto] {
        let e = engine(&m, 2, EngineConfig { prefill_quantum_busy: mode, ..EngineConfig::default() });
        let mut busy = e.submit(request(short.clone(), 400)).unwrap();
        // Its first token, then a few steps: the stream decodes and its step is timed.
        for _ in 0..4 {
            while !matches!(busy.blocking_next(), Some(GenEvent::Delta { .. })) {}
        }
        let c0 = chunks(&e);
        let (got, _) = collect(e.submit(request(long.clone(), 8)).unwrap());
        cuts.push(chunks(&e) - c0);
        let live = e.stats().active.load(Ordering::Relaxed);
        drop(busy);
        assert_eq!(live, 1, "{mode:?}: the short stream must still be decoding when the long prompt is done");
        assert_eq!(got, alone, "{mode:?}: the prompt beside a decoding stream must give the tokens it gives alone");
    }
    assert!(cuts[0] >= 3, "paced, the {ROWS}-row prompt must come in chunks of a few rows ({} chunks)", cuts[0]);
    assert_eq!(cuts[1], 1, "control: the automatic quantum takes the {ROWS} rows at once");
}

#[test]
fn a_dropped_handle_frees_its_region_and_limits_hold() {
    let m = model();
    let e = engine(&m, 1, EngineConfig::default());
    let p = m.tok.encode("Count slowly:", false, false).unwrap();
    let mut h = e.submit(request(p.clone(), 400)).unwrap();
    // Wait for the first token, then leave.
    while !matches!(h.blocking_next(), Some(GenEvent::Delta { .. })) {}
    drop(h);
    // With the only region freed, the next request is admitted and runs to its limit.
    let (ids, f) = collect(e.submit(request(p.clone(), 5)).unwrap());
    assert_eq!((ids.len(), f.reason), (5, FinishReason::Length));
    assert_eq!(e.stats().active.load(Ordering::Relaxed), 0);
    // A prompt as long as the context is refused with the counts.
    let long = vec![p[0]; 512];
    match e.submit(request(long, 4)) {
        Err(resin_engine::SubmitError::PromptTooLong { prompt, n_ctx }) => assert_eq!((prompt, n_ctx), (512, 512)),
        Err(other) => panic!("expected PromptTooLong, got {other}"),
        Ok(_) => panic!("expected PromptTooLong, got a stream"),
    }
}

#[test]
fn stop_strings_end_generation_without_leaking() {
    let m = model();
    let e = engine(&m, 1, EngineConfig::default());
    let p = m.tok.encode("The capital of France is", false, false).unwrap();
    let mut full = String::new();
    let mut h = e.submit(request(p.clone(), 12)).unwrap();
    while let Some(ev) = h.blocking_next() {
        match ev {
            GenEvent::Delta { text, .. } => full.push_str(&text),
            GenEvent::Done(_) => break,
            GenEvent::Error(e) => panic!("{e}"),
        }
    }
    assert!(full.starts_with(" Paris."), "{full:?}");
    let mut r = request(p, 12);
    r.stop = vec!["ris.".into()];
    let mut h = e.submit(r).unwrap();
    let mut text = String::new();
    let mut reason = None;
    while let Some(ev) = h.blocking_next() {
        match ev {
            GenEvent::Delta { text: t, .. } => text.push_str(&t),
            GenEvent::Done(f) => {
                reason = Some(f.reason);
                break;
            }
            GenEvent::Error(e) => panic!("{e}"),
        }
    }
    assert_eq!(text, " Pa");
    assert_eq!(reason, Some(FinishReason::Stop));
}

#[test]
fn shutdown_ends_live_streams_joins_the_thread_and_refuses_later_work() {
    let m = model();
    let e = engine(&m, 1, EngineConfig::default());
    let p = m.tok.encode("Count slowly:", false, false).unwrap();
    let mut h = e.submit(request(p.clone(), 400)).unwrap();
    while !matches!(h.blocking_next(), Some(GenEvent::Delta { .. })) {}
    // Returns once the engine thread has ended (and dropped the home).
    e.shutdown();
    // The live stream ends (its channel closes) rather than hanging or running to 400.
    let mut rest = 0;
    while let Some(ev) = h.blocking_next() {
        if let GenEvent::Delta { ids, .. } = ev {
            rest += ids.len();
        }
    }
    assert!(rest < 400, "the stream ran on after shutdown ({rest} more tokens)");
    match e.submit(request(p, 4)) {
        Err(resin_engine::SubmitError::Closed) => {}
        Err(other) => panic!("expected Closed, got {other}"),
        Ok(_) => panic!("expected Closed, got a stream"),
    }
    // A second shutdown (another clone's, or a drop guard's) is harmless.
    e.shutdown();
}

/// `serve` and `bench` end by dropping their handles: the last one dropped stops the engine
/// thread and returns only once the home is dropped (a GPU home torn down while the process
/// exits can crash it). A clone still held keeps the engine running.
#[test]
fn dropping_the_last_handle_stops_the_engine_and_drops_the_home() {
    let m = model();
    let dropped = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let opts = CpuOptions { n_ctx: Some(512), regions: 1, codec: KvCodec::F16, threads: None, progress: None };
    let home = CpuHome::new(m.file.clone(), m.cfg.clone(), &opts, Arc::new(Counters::default())).unwrap();
    let mut home = Wrapped::new(home);
    home.dropped = Some(dropped.clone());
    let e = Engine::start(Box::new(home), m.tok.clone(), EngineConfig::default());
    let other = e.clone();
    let p = m.tok.encode("Count slowly:", false, false).unwrap();
    let mut h = e.submit(request(p, 400)).unwrap();
    while !matches!(h.blocking_next(), Some(GenEvent::Delta { .. })) {}
    drop(e);
    // Control: another handle still holds the engine; its stream goes on.
    assert!(!dropped.load(Ordering::SeqCst), "the home was dropped while a handle remained");
    assert!(matches!(h.blocking_next(), Some(GenEvent::Delta { .. })), "the stream must go on while a handle remains");
    drop(other);
    assert!(dropped.load(Ordering::SeqCst), "dropping the last handle must return once the home is dropped");
    let mut rest = 0;
    while let Some(ev) = h.blocking_next() {
        if let GenEvent::Delta { ids, .. } = ev {
            rest += ids.len();
        }
    }
    assert!(rest < 400, "the stream ran on after the last handle was dropped");
}

/// Ids and log-probabilities of a stream.
fn collect_logprobs(mut h: GenHandle) -> (Vec<u32>, Vec<resin_engine::TokenLogprob>) {
    let (mut ids, mut lps) = (Vec::new(), Vec::new());
    while let Some(ev) = h.blocking_next() {
        match ev {
            GenEvent::Delta { ids: new, logprobs, .. } => {
                ids.extend(new);
                lps.extend(logprobs);
            }
            GenEvent::Done(_) => return (ids, lps),
            GenEvent::Error(e) => panic!("generation failed: {e}"),
        }
    }
    panic!("stream ended without Done");
}

/// A stream that asks for log-probabilities draws what it draws without them; greedy's pick
/// heads its top list; and the values are the raw row's whichever read-back gave them: a
/// greedy stream's (top candidates with the row's log-sum-exp) equal those of a stream whose
/// penalty makes it read whole rows (a penalty too small to change a pick).
#[test]
fn logprobs_ride_along_and_are_the_raw_rows() {
    let m = model();
    let e = engine(&m, 2, EngineConfig::default());
    let prompt = prompts(&m, 1).remove(0);
    let (plain, _) = collect(e.submit(request(prompt.clone(), 12)).unwrap());
    let mut r = request(prompt.clone(), 12);
    r.logprobs = Some(5);
    let (ids, lps) = collect_logprobs(e.submit(r).unwrap());
    assert_eq!(ids, plain);
    assert_eq!(lps.len(), ids.len());
    for (lp, &id) in lps.iter().zip(&ids) {
        assert_eq!(lp.id, id);
        assert_eq!(lp.top.len(), 5);
        assert_eq!(lp.top[0], (id, lp.logprob), "{lp:?}");
        assert!(lp.logprob <= 0.0 && lp.top.windows(2).all(|w| w[0].1 >= w[1].1), "{lp:?}");
        assert!(lp.top.iter().map(|t| f64::from(t.1).exp()).sum::<f64>() <= 1.0 + 1e-5, "{lp:?}");
    }
    let mut r = request(prompt, 12);
    r.logprobs = Some(5);
    r.params = SamplingParams { frequency_penalty: 1e-6, ..SamplingParams::greedy() };
    let (pen_ids, pen) = collect_logprobs(e.submit(r).unwrap());
    assert_eq!(pen_ids, ids);
    assert_eq!(pen, lps);
}
