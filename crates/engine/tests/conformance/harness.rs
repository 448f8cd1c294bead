//! The conformance suite's plumbing: which home a scenario runs on, the model, requests and
//! their streams, the prompts, and each prompt's tokens alone (the reference most scenarios
//! compare with).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};

use resin_core::{Counters, Home, HomeSpec, KvCodec, Logits, Need, RegionId, Row, Segment, StepOut};
use resin_cpu::{CpuHome, CpuOptions};
use resin_engine::{Engine, EngineConfig, GenHandle};
use resin_gguf::GgufFile;
use resin_model::{ModelConfig, Tokenizer};
use resin_vulkan::{Gpu, VulkanHome, VulkanOptions, WideMode};

use crate::common::{collect, request};

/// The homes every scenario runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Cpu,
    /// On Mesa's lavapipe in CI.
    Vulkan,
}

/// Positions per region of the suite's homes.
pub const N_CTX: usize = 256;
/// Blocks of SmolLM2-135M the suite runs on.
const BLOCKS: usize = 4;
/// Tokens each stream generates (greedy, no stop ids: every run has this length).
pub const TOKENS: usize = 8;

/// One scenario's homes: its kind, the model (SmolLM2-135M's first BLOCKS blocks) and, for the Vulkan home, the
/// scenario's device. The homes a scenario builds on the device take turns: one is dropped
/// before the next is built (two homes' threads would submit to the same queue), which
/// `home` checks.
pub struct Suite {
    pub kind: Kind,
    pub tok: Arc<Tokenizer>,
    file: Arc<GgufFile>,
    cfg: ModelConfig,
    gpu: Option<(Arc<Gpu>, usize)>,
}

impl Suite {
    /// The suite for `kind`; None where the Vulkan home has no device (a SKIP line, or a
    /// failure when RESIN_REQUIRE_VULKAN=1).
    pub fn new(kind: Kind) -> Option<Suite> {
        let gpu = match kind {
            Kind::Cpu => None,
            Kind::Vulkan => match Gpu::start() {
                Ok(g) => {
                    let held = Arc::strong_count(&g);
                    Some((g, held))
                }
                Err(e) => {
                    if std::env::var("RESIN_REQUIRE_VULKAN").as_deref() == Ok("1") {
                        panic!("RESIN_REQUIRE_VULKAN=1 but there is no Vulkan device: {e}");
                    }
                    eprintln!("SKIP: no Vulkan device ({e}); apt-get install mesa-vulkan-drivers libvulkan1");
                    return None;
                }
            },
        };
        let path = resin_hub::ensure_first_blocks("smollm2-135m", BLOCKS, false).expect("fetching and cutting SmolLM2-135M");
        let file = Arc::new(GgufFile::open(path).unwrap());
        let cfg = ModelConfig::from_gguf(&file).unwrap();
        let tok = Arc::new(Tokenizer::from_gguf(&file).unwrap());
        Some(Suite { kind, tok, file, cfg, gpu })
    }

    /// A home of `regions` regions of `n_ctx` positions (the Vulkan home's wide steps in lanes).
    pub fn home(&self, regions: usize, n_ctx: usize) -> Box<dyn Home> {
        self.home_wide(regions, n_ctx, WideMode::Lanes)
    }

    /// As `home`, the Vulkan home's steps of more than NROW_MAX rows run as `wide` says.
    pub fn home_wide(&self, regions: usize, n_ctx: usize, wide: WideMode) -> Box<dyn Home> {
        let counters = Arc::new(Counters::default());
        match &self.gpu {
            None => {
                let opts = CpuOptions { n_ctx: Some(n_ctx), regions, codec: KvCodec::F16, threads: None, progress: None };
                Box::new(CpuHome::new(self.file.clone(), self.cfg.clone(), &opts, counters).unwrap())
            }
            Some((gpu, held)) => {
                assert_eq!(Arc::strong_count(gpu), *held, "a scenario's Vulkan homes take turns: drop the last engine before building the next");
                let opts = VulkanOptions { n_ctx: Some(n_ctx), regions, wide, ..VulkanOptions::default() };
                Box::new(VulkanHome::on(gpu.clone(), self.file.clone(), self.cfg.clone(), &opts, counters).unwrap())
            }
        }
    }

    /// An engine over a home of `regions` regions of N_CTX positions.
    pub fn engine(&self, regions: usize, config: EngineConfig) -> Engine {
        Engine::start(self.home(regions, N_CTX), self.tok.clone(), config)
    }

    pub fn encode(&self, text: &str) -> Vec<u32> {
        self.tok.encode(text, false, false).unwrap()
    }

    /// Each prompt's `tokens` tokens alone: one after another on an engine of one region,
    /// default settings. Kept for the process (scenarios share prompts); the prompts computed
    /// together share no first token, so none adopts another's rows.
    pub fn alone(&self, prompts: &[Vec<u32>], tokens: usize) -> Vec<Vec<u32>> {
        /// (tokens, prompt) -> the prompt's tokens alone, a map for each kind.
        type Known = Mutex<BTreeMap<(usize, Vec<u32>), Vec<u32>>>;
        static ALONE: [Known; 2] = [Mutex::new(BTreeMap::new()), Mutex::new(BTreeMap::new())];
        let mut known = ALONE[self.kind as usize].lock().unwrap_or_else(|e| e.into_inner());
        let mut missing: Vec<&Vec<u32>> = prompts.iter().filter(|p| !known.contains_key(&(tokens, p.to_vec()))).collect();
        missing.dedup();
        if !missing.is_empty() {
            assert_distinct_starts(&missing);
            let e = self.engine(1, EngineConfig::default());
            for p in missing {
                let (ids, f) = collect(e.submit(request(p.clone(), tokens)).unwrap());
                assert_eq!(f.reused_tokens, 0, "a prompt alone adopts nothing");
                known.insert((tokens, p.clone()), ids);
            }
        }
        prompts.iter().map(|p| known[&(tokens, p.clone())].clone()).collect()
    }
}

/// Every prompt submitted at once, each stream's `tokens` tokens.
pub fn together(e: &Engine, prompts: &[Vec<u32>], tokens: usize) -> Vec<Vec<u32>> {
    let hs: Vec<GenHandle> = prompts.iter().map(|p| e.submit(request(p.clone(), tokens)).unwrap()).collect();
    hs.into_iter().map(|h| collect(h).0).collect()
}

pub fn get(c: &AtomicU64) -> u64 {
    c.load(Ordering::Relaxed)
}

pub fn assert_distinct_starts(prompts: &[&Vec<u32>]) {
    let firsts: std::collections::BTreeSet<u32> = prompts.iter().map(|p| p[0]).collect();
    assert_eq!(firsts.len(), prompts.len(), "prompts run one after another on one region must not share a first token");
}

/// `n` (at most 12) prompts of two tokens that share no first token: the peel packs four a
/// tick, so the streams are soon decoding together.
pub fn short_prompts(s: &Suite, n: usize) -> Vec<Vec<u32>> {
    let subjects = ["Cats", "Dogs", "Birds", "Trees", "Fish", "Books", "Children", "People", "Students", "Doctors", "Teachers", "Winter"];
    let ps: Vec<Vec<u32>> = subjects[..n].iter().map(|x| s.encode(&format!("{x} are"))).collect();
    assert!(ps.iter().all(|p| p.len() == 2), "two tokens a prompt");
    assert_distinct_starts(&ps.iter().collect::<Vec<_>>());
    ps
}

/// A home between the engine and a real one, with the hooks a scenario sets: a cap on the rows
/// a step takes, a gate its first call waits at, a log of its calls.
pub struct Hooked {
    home: Box<dyn Home>,
    spec: HomeSpec,
    gate: Option<(mpsc::Sender<()>, mpsc::Receiver<()>)>,
    calls: Option<CallLog>,
}

/// The calls a home was given, in order: ("prefill", segments), ("step", rows) and
/// ("step_and_prefill", rows).
pub type CallLog = Arc<Mutex<Vec<(&'static str, usize)>>>;

/// What `Hooked::gated` gives the test: the home, a receiver told when the first call has come
/// in, the sender that opens the gate, and the log of calls.
pub type GatedParts = (Hooked, mpsc::Receiver<()>, mpsc::Sender<()>, CallLog);

impl Hooked {
    fn new(home: Box<dyn Home>) -> Hooked {
        let spec = home.spec().clone();
        Hooked { home, spec, gate: None, calls: None }
    }

    /// A home that takes at most `rows_max` rows a step: the engine steps more streams in
    /// balanced calls of its own.
    pub fn capped(home: Box<dyn Home>, rows_max: usize) -> Hooked {
        let mut h = Hooked::new(home);
        h.spec.step_rows_max = rows_max;
        h
    }

    /// A home whose first call waits until the test opens the gate: requests submitted while it
    /// waits are all in the engine's queue at its next tick (they arrive together). It logs the
    /// engine's calls.
    pub fn gated(home: Box<dyn Home>) -> GatedParts {
        let (entered_tx, entered_rx) = mpsc::channel();
        let (open_tx, open_rx) = mpsc::channel();
        let calls = Arc::new(Mutex::new(Vec::new()));
        let h = Hooked { gate: Some((entered_tx, open_rx)), calls: Some(calls.clone()), ..Hooked::new(home) };
        (h, entered_rx, open_tx, calls)
    }

    /// Before a call of `n` segments or rows: wait at the gate (the first call), then log it.
    fn enter(&mut self, call: &'static str, n: usize) {
        if let Some((entered, open)) = self.gate.take() {
            entered.send(()).expect("the test waits for the first call");
            open.recv().expect("the test opens the gate");
        }
        if let Some(calls) = &self.calls {
            calls.lock().unwrap_or_else(|e| e.into_inner()).push((call, n));
        }
    }
}

impl Home for Hooked {
    fn spec(&self) -> &HomeSpec {
        &self.spec
    }
    fn prefill(&mut self, segments: &[Segment<'_>]) -> resin_core::Result<Logits> {
        self.enter("prefill", segments.len());
        self.home.prefill(segments)
    }
    fn step(&mut self, rows: &[Row], needs: &[Need]) -> resin_core::Result<StepOut> {
        self.enter("step", rows.len());
        resin_core::check_step(&self.spec, rows, needs)?;
        self.home.step(rows, needs)
    }
    fn step_and_prefill(&mut self, rows: &[Row], needs: &[Need], segments: &[Segment<'_>]) -> resin_core::Result<(StepOut, Logits)> {
        self.enter("step_and_prefill", rows.len());
        resin_core::check_step(&self.spec, rows, needs)?;
        self.home.step_and_prefill(rows, needs, segments)
    }
    fn counters(&self) -> &Arc<Counters> {
        self.home.counters()
    }
    fn save_region(&mut self, region: RegionId, rows: usize) -> resin_core::Result<Vec<u8>> {
        self.home.save_region(region, rows)
    }
    fn load_region(&mut self, region: RegionId, rows: usize, snapshot: &[u8]) -> resin_core::Result<()> {
        self.home.load_region(region, rows, snapshot)
    }
}
