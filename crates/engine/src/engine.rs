use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use rayon::prelude::*;
use resin_core::regions::{Claim, RegionTable};
use resin_core::{balanced_groups, chunk_rows, Counters, Home, HomeError, Need, RegionId, Row, RowOut, Segment, TopCandidates, NROW_MAX, PF_WINDOW};
use resin_model::{StreamDecoder, Tokenizer};
use tokio::sync::mpsc as tmpsc;

pub use crate::error::SubmitError;
use crate::host_cache::HostCache;
use crate::sampling::{Sampler, SamplingParams};
use crate::stop::{StopMatcher, StopOutcome};

/// Restricts which tokens may come next (e.g. a JSON grammar for a forced tool call).
pub trait LogitsConstraint: Send {
    /// Set the logits of tokens that may not come next to negative infinity.
    fn mask(&mut self, logits: &mut [f32]);
    /// Advance past the chosen token; true when the constrained output is complete.
    fn accept(&mut self, token: u32) -> bool;
}

/// One generation request.
pub struct GenRequest {
    pub prompt: Vec<u32>,
    pub params: SamplingParams,
    /// Most tokens to generate (the context length also bounds it).
    pub max_tokens: usize,
    pub stop: Vec<String>,
    /// Ids that end generation; None: the tokenizer's end-of-generation ids.
    pub stop_ids: Option<Vec<u32>>,
    pub constraint: Option<Box<dyn LogitsConstraint>>,
    /// Some(k): every generated token carries its log-probability and the `k` most likely
    /// tokens at its position ([`TokenLogprob`]); None: no log-probabilities (the cheapest
    /// read-back).
    pub logprobs: Option<usize>,
}

impl GenRequest {
    pub fn new(prompt: Vec<u32>, max_tokens: usize) -> Self {
        GenRequest { prompt, params: SamplingParams::default(), max_tokens, stop: Vec::new(), stop_ids: None, constraint: None, logprobs: None }
    }
}

/// A generated token's log-probability and the most likely tokens at its position: the
/// log-softmax of the model's raw logits (before temperature, penalties and any constraint's
/// mask), `logit - logsumexp(row)`.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    pub id: u32,
    pub logprob: f32,
    /// The `k` most likely tokens (id, log-probability), best first (ties by id); at most
    /// [`resin_core::TOP_CANDIDATES`].
    pub top: Vec<(u32, f32)>,
}

impl TokenLogprob {
    /// Token `id`'s entry from a row's top candidates, or None where `id` is not among them
    /// (then its logit needs the whole row).
    fn from_top(t: &TopCandidates, id: u32, k: usize) -> Option<TokenLogprob> {
        let logit = t.top.iter().find(|&&(i, _)| i == id)?.1;
        Some(Self::of_logit(t, id, logit, k))
    }

    /// Token `id`'s entry from the whole raw logits row.
    fn from_row(row: &[f32], id: u32, k: usize) -> TokenLogprob {
        let logit = row.get(id as usize).copied().unwrap_or(f32::NEG_INFINITY);
        Self::of_logit(&TopCandidates::of(row), id, logit, k)
    }

    /// Token `id` of raw logit `logit`, with the `k` best of the row's candidates `t`.
    fn of_logit(t: &TopCandidates, id: u32, logit: f32, k: usize) -> TokenLogprob {
        TokenLogprob { id, logprob: logit - t.lse, top: t.top.iter().take(k).map(|&(i, l)| (i, l - t.lse)).collect() }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// A stop id or stop string, or a constraint completed.
    Stop,
    /// max_tokens or the context length.
    Length,
}

#[derive(Debug, Clone)]
pub struct Finish {
    pub reason: FinishReason,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// Prompt tokens whose K/V rows were adopted from a parked region (not prefilled again).
    pub reused_tokens: usize,
    pub time_to_first_token: Duration,
    /// The stop string that ended the generation, when one did.
    pub stop_string: Option<String>,
}

#[derive(Debug, Clone)]
pub enum GenEvent {
    /// New tokens and the text that is now safe to show (empty while a stop string may be forming).
    Delta {
        ids: Vec<u32>,
        text: String,
        /// One per id when the request asked for log-probabilities, else empty. The
        /// end-of-generation token that ends the output (it has no text) has none.
        logprobs: Vec<TokenLogprob>,
    },
    Done(Finish),
    Error(String),
}

/// The receiving end of a generation. Dropping it cancels the generation and frees its region.
pub struct GenHandle {
    rx: tmpsc::UnboundedReceiver<GenEvent>,
}

impl GenHandle {
    pub async fn next(&mut self) -> Option<GenEvent> {
        self.rx.recv().await
    }
    /// For synchronous callers (not from inside an async runtime).
    pub fn blocking_next(&mut self) -> Option<GenEvent> {
        self.rx.blocking_recv()
    }
}

#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Requests allowed to wait for a region before submit answers QueueFull.
    pub max_queue: usize,
    /// Run continuations of at most NROW_MAX rows through the token command.
    pub prefill_peel: bool,
    /// Prefill rows per tick while other streams are decoding.
    pub prefill_quantum_busy: PrefillQuantum,
    /// Sessions whose prompts may share one prefill window (segments); 1 prefills one session
    /// at a time (the comparison `resin bench --streams N --max-segments 1` makes).
    pub max_segments: usize,
    /// Bytes of host memory for sessions whose region was reused (their K/V rows, restored when
    /// their conversation continues); 0 keeps none.
    pub host_cache_bytes: usize,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig { max_queue: 256, prefill_peel: true, prefill_quantum_busy: PrefillQuantum::Auto, max_segments: usize::MAX, host_cache_bytes: 1 << 30 }
    }
}

/// The prompt rows a scheduler tick prefills while other streams decode: more start new
/// streams sooner, fewer keep the decoding ones' tokens closer together.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PrefillQuantum {
    /// What the home prefills in PREFILL_TICK_TARGET (`auto_quantum` without a pace): the
    /// waiting prompts' first tokens soonest.
    #[default]
    Auto,
    /// Streams that had their first token before a waiting prompt came keep their pace: a
    /// tick prefills what the home prefills in PACE_SHARE of their step, so their tokens come
    /// at most about twice as far apart, and the waiting prompts start later. Without such
    /// streams (a batch starting together), as Auto.
    Pace,
    /// A fixed count of rows, 1..=PF_WINDOW.
    Rows(usize),
}

/// The prefill time a tick aims at while streams decode, when the quantum is automatic and
/// no stream is kept at its pace: a decoding stream then gets a token at least every decode
/// step + this (about 40 a second).
pub const PREFILL_TICK_TARGET: std::time::Duration = std::time::Duration::from_millis(25);
/// The automatic quantum's least rows (a fixed quantum's former default) when no stream is
/// kept at its pace: a slow home still starts new streams at this pace.
pub const PREFILL_QUANTUM_MIN: usize = 128;
/// The share of the decoding streams' step a tick's prefill takes while they are kept at
/// their pace: their tokens then come at most about 1 + this times as far apart as without
/// the waiting prompts (issue 29 asks for under twice), the rest of the margin for the
/// tick's host work and the rate's drift.
pub const PACE_SHARE: f64 = 0.75;
/// The quantum while streams are kept at their pace and no window has been timed yet.
pub const PACE_QUANTUM_FIRST: usize = 16;

/// The automatic prefill quantum from `rows_per_s`, the rate the home's windows have run at
/// (None before the first). `pace`: the decoding streams' step time in seconds when some of
/// them were decoding before the waiting prompts came (they keep their pace: the rows the
/// home prefills in PACE_SHARE of their step, at least 1); None when every decoding stream
/// came with or after them, as a batch starting together, which takes the rows the home
/// prefills in PREFILL_TICK_TARGET (at least PREFILL_QUANTUM_MIN): larger quanta won both
/// such a batch's decoding rate and its time to first token (docs/lessons.md). At most
/// PF_WINDOW either way.
pub fn auto_quantum(rows_per_s: Option<f64>, pace: Option<f64>) -> usize {
    let rate = rows_per_s.filter(|r| r.is_finite() && *r > 0.0);
    match (rate, pace.filter(|p| p.is_finite() && *p > 0.0)) {
        (Some(rate), Some(step)) => ((rate * step * PACE_SHARE) as usize).clamp(1, PF_WINDOW),
        (None, Some(_)) => PACE_QUANTUM_FIRST,
        (Some(rate), None) => ((rate * PREFILL_TICK_TARGET.as_secs_f64()) as usize).clamp(PREFILL_QUANTUM_MIN, PF_WINDOW),
        (None, None) => PREFILL_QUANTUM_MIN,
    }
}

/// Whether a decoding stream (its first token's time, from `decoding`) had its first token
/// before one of the waiting streams was submitted (`pending`): it was decoding when that
/// prompt came, so PrefillQuantum::Pace keeps it at its pace. Streams of a batch submitted
/// together, whose first tokens all come after, are not kept.
fn pace_kept(pending: impl Iterator<Item = Instant>, decoding: impl Iterator<Item = Option<Instant>>) -> bool {
    let Some(latest) = pending.max() else { return false };
    decoding.flatten().any(|t| t < latest)
}

/// An average weighted to the latest figure.
fn ema(avg: Option<f64>, x: f64) -> f64 {
    avg.map_or(x, |a| 0.5 * a + 0.5 * x)
}

/// Seconds a kind of home call takes: an average weighted to the latest, the first call
/// left out (it pays page faults and pipeline builds that later calls do not).
#[derive(Debug, Default)]
struct CallTime {
    calls: u64,
    avg: Option<f64>,
}

impl CallTime {
    fn add(&mut self, secs: f64) {
        self.calls += 1;
        if self.calls > 1 {
            self.avg = Some(ema(self.avg, secs));
        }
    }
}

/// Live numbers for /metrics.
#[derive(Debug, Default)]
pub struct EngineStats {
    pub queued: AtomicUsize,
    pub active: AtomicUsize,
    /// Why the home is down, once its device failed (`HomeError::DeviceLost`): from then on
    /// every request ends at once with `SubmitError::HomeDown`.
    pub down: std::sync::OnceLock<String>,
}

enum Command {
    Submit(Box<GenRequest>, tmpsc::UnboundedSender<GenEvent>, Instant),
    /// Stop: queued and live streams end (their handles see the end), the home is dropped.
    Shutdown,
}

/// Shuts the engine down when dropped (every return path of a command that started one).
pub struct ShutdownOnDrop(pub Engine);

impl Drop for ShutdownOnDrop {
    fn drop(&mut self) {
        self.0.shutdown();
    }
}

/// The engine thread as every handle shares it. Dropping the last handle stops the thread and
/// waits until it has dropped the home, so the home is gone before the process exits: `serve`
/// and `bench` end by dropping their handles, never calling `shutdown`.
struct Worker {
    tx: mpsc::Sender<Command>,
    thread: std::sync::Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Worker {
    fn stop(&self) {
        let _ = self.tx.send(Command::Shutdown);
        let thread = self.thread.lock().ok().and_then(|mut w| w.take());
        // Never from the engine thread itself (it would wait for itself).
        if let Some(t) = thread.filter(|t| t.thread().id() != std::thread::current().id()) {
            let _ = t.join();
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A handle to the engine thread. Cheap to clone.
#[derive(Clone)]
pub struct Engine {
    worker: Arc<Worker>,
    stats: Arc<EngineStats>,
    counters: Arc<Counters>,
    n_ctx: usize,
    regions: usize,
    home_kind: &'static str,
    max_queue: usize,
}

impl Engine {
    /// Start the engine thread driving `home`.
    pub fn start(home: Box<dyn Home>, tokenizer: Arc<Tokenizer>, config: EngineConfig) -> Engine {
        let (tx, rx) = mpsc::channel();
        let stats = Arc::new(EngineStats::default());
        let spec = home.spec().clone();
        let counters = home.counters().clone();
        let sched = Scheduler {
            regions: RegionTable::new(spec.regions),
            host: HostCache::new(config.host_cache_bytes),
            home,
            tokenizer,
            config: config.clone(),
            stats: stats.clone(),
            queue: VecDeque::new(),
            streams: Vec::new(),
            next_id: 0,
            prefill_rate: None,
            step_time: CallTime::default(),
            peel_time: CallTime::default(),
            short_window_time: CallTime::default(),
            stop: false,
            lost: None,
        };
        let thread = std::thread::Builder::new().name("resin-engine".into()).spawn(move || sched.run(rx)).expect("spawning the engine thread");
        let worker = Arc::new(Worker { tx, thread: std::sync::Mutex::new(Some(thread)) });
        Engine { worker, stats, counters, n_ctx: spec.n_ctx, regions: spec.regions, home_kind: spec.kind, max_queue: config.max_queue }
    }

    /// Stop the engine thread and wait until it has dropped the home (dropping the last
    /// handle does the same): a GPU home torn down while the process is exiting (its driver's
    /// own exit handlers running) can crash it. Later submits fail with `SubmitError::Closed`.
    pub fn shutdown(&self) {
        self.worker.stop();
    }

    pub fn submit(&self, req: GenRequest) -> Result<GenHandle, SubmitError> {
        if let Some(why) = self.home_down() {
            return Err(SubmitError::HomeDown(why.to_string()));
        }
        if req.prompt.is_empty() {
            return Err(SubmitError::EmptyPrompt);
        }
        if req.prompt.len() >= self.n_ctx {
            return Err(SubmitError::PromptTooLong { prompt: req.prompt.len(), n_ctx: self.n_ctx });
        }
        req.params.validate().map_err(SubmitError::BadParams)?;
        let queued = self.stats.queued.load(Ordering::Relaxed);
        if queued >= self.max_queue {
            return Err(SubmitError::QueueFull(queued));
        }
        let (etx, erx) = tmpsc::unbounded_channel();
        self.stats.queued.fetch_add(1, Ordering::Relaxed);
        self.worker.tx.send(Command::Submit(Box::new(req), etx, Instant::now())).map_err(|_| {
            self.stats.queued.fetch_sub(1, Ordering::Relaxed);
            SubmitError::Closed
        })?;
        Ok(GenHandle { rx: erx })
    }

    pub fn stats(&self) -> &Arc<EngineStats> {
        &self.stats
    }
    /// Why the home is down (its device failed mid-run), once it is; it stays down.
    pub fn home_down(&self) -> Option<&str> {
        self.stats.down.get().map(String::as_str)
    }
    pub fn counters(&self) -> &Arc<Counters> {
        &self.counters
    }
    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }
    pub fn regions(&self) -> usize {
        self.regions
    }
    pub fn home_kind(&self) -> &'static str {
        self.home_kind
    }
}

enum Phase {
    /// Prompt tokens `fed..` still to prefill.
    Prefill,
    /// `next` was sampled and is fed at the next step.
    Decode { next: u32 },
}

struct Stream {
    req: GenRequest,
    tx: tmpsc::UnboundedSender<GenEvent>,
    region: RegionId,
    /// Tokens whose K/V rows the region holds (positions 0..len).
    fed: Vec<u32>,
    phase: Phase,
    generated: usize,
    reused: usize,
    sampler: Sampler,
    decoder: StreamDecoder,
    stop: StopMatcher,
    stop_ids: Vec<u32>,
    submitted: Instant,
    first_token: Option<Instant>,
    id: u64,
    /// The last picked token's log-probabilities (when the request asks for them), for `emit`.
    lp: Option<TokenLogprob>,
}

struct Scheduler {
    home: Box<dyn Home>,
    tokenizer: Arc<Tokenizer>,
    config: EngineConfig,
    stats: Arc<EngineStats>,
    regions: RegionTable,
    host: HostCache,
    queue: VecDeque<(Box<GenRequest>, tmpsc::UnboundedSender<GenEvent>, Instant)>,
    streams: Vec<Stream>,
    next_id: u64,
    /// Prompt rows a second the home's prefill windows have run at (an average weighted to
    /// the latest), for the automatic quantum.
    prefill_rate: Option<f64>,
    /// The decode step's time (all its home calls) while no prompt waits, for
    /// PrefillQuantum::Pace.
    step_time: CallTime,
    /// The time of a peel and of a window of at most NROW_MAX rows: the peel is taken only
    /// while it is not the slower of the two.
    peel_time: CallTime,
    short_window_time: CallTime,
    /// Set by `Command::Shutdown`: the loop returns.
    stop: bool,
    /// Why the home's device failed, when a call this tick said so (`HomeError::DeviceLost`):
    /// the tick ends every stream and the home is not called again (`go_down`).
    lost: Option<String>,
}

/// What a tick prefills (`Scheduler::plan_prefill`).
enum Prefill {
    /// Every waiting continuation (these streams) in one token command.
    Peel(Vec<usize>),
    /// The waiting prompts' next chunks, as segments of one window.
    Chunks(Chunks),
}

/// Prompt chunks a tick prefills: (stream, first position, rows) each, `rows` in all.
struct Chunks {
    plan: Vec<(usize, usize, usize)>,
    rows: usize,
}

/// The chunks as the home's segments.
fn segments<'a>(streams: &'a [Stream], c: &Chunks) -> Vec<Segment<'a>> {
    c.plan
        .iter()
        .map(|&(i, start, len)| {
            let s = &streams[i];
            Segment { region: s.region, start: start as u32, tokens: &s.req.prompt[start..start + len] }
        })
        .collect()
}

/// What a stream does after a sampled token.
enum After {
    Continue,
    Finish(FinishReason),
}

impl Scheduler {
    fn run(mut self, rx: mpsc::Receiver<Command>) {
        loop {
            // Block only when there is nothing to do.
            if self.streams.is_empty() && self.queue.is_empty() {
                match rx.recv() {
                    Ok(c) => self.command(c),
                    Err(_) => return,
                }
            }
            if self.stop {
                return;
            }
            loop {
                match rx.try_recv() {
                    Ok(c) => self.command(c),
                    Err(mpsc::TryRecvError::Empty) => break,
                    Err(mpsc::TryRecvError::Disconnected) => {
                        if self.streams.is_empty() && self.queue.is_empty() {
                            return;
                        }
                        break;
                    }
                }
            }
            if self.stop {
                return;
            }
            self.tick();
        }
    }

    fn command(&mut self, c: Command) {
        match c {
            Command::Submit(_, tx, _) if self.stats.down.get().is_some() => {
                // Submitted before the home went down: it ends at once, as later ones are refused.
                self.stats.queued.fetch_sub(1, Ordering::Relaxed);
                let _ = tx.send(GenEvent::Error(self.down_message()));
            }
            Command::Submit(req, tx, t) => self.queue.push_back((req, tx, t)),
            Command::Shutdown => self.stop = true,
        }
    }

    /// One scheduler tick: reap, admit, one decode step, one prefill quantum (both in one home
    /// call where the quantum is chunks and the decoding rows one call); after a call that
    /// found the device failed, the end of every stream (`go_down`).
    fn tick(&mut self) {
        self.reap();
        self.admit();
        let decoders = self.decode_members().len();
        let decoding = decoders > 0;
        let plan = if self.lost.is_none() { self.plan_prefill(decoding) } else { None };
        match plan {
            // Continuous batching: the decoding rows and the prompts' chunks in one home call,
            // where the decoding rows are one call; and the peel's rows in the decoding rows'
            // token command, where they fit one.
            Some(Prefill::Chunks(chunks)) if decoding && decoders <= self.home.spec().step_rows_max => self.decode_step(Some(Prefill::Chunks(chunks))),
            Some(Prefill::Peel(pending)) if decoding && decoders + self.waiting_rows(&pending) <= NROW_MAX.min(self.home.spec().step_rows_max) => {
                self.decode_step(Some(Prefill::Peel(pending)))
            }
            _ => {
                if decoding && self.lost.is_none() {
                    self.decode_step(None);
                }
                // Planned again: the step's finished streams have left (their indices moved).
                match self.lost.is_none().then(|| self.plan_prefill(decoding)).flatten() {
                    Some(Prefill::Peel(pending)) => self.peel(&pending),
                    Some(Prefill::Chunks(chunks)) => self.prefill_chunks(chunks),
                    None => {}
                }
            }
        }
        if let Some(why) = self.lost.take() {
            self.go_down(why);
        }
        self.stats.active.store(self.streams.len(), Ordering::Relaxed);
    }

    /// Note a home call's error: a failed device (`HomeError::DeviceLost`) ends the home. The
    /// reason is published at once, before any stream hears of the failure, so whoever sees a
    /// stream's error can tell it apart (the server answers 503, not 500).
    fn note(&mut self, e: &HomeError) {
        if let HomeError::DeviceLost(why) = e {
            lost(&self.stats, &mut self.lost, why);
        }
    }

    /// What a stream that ends because the home is down is told.
    fn down_message(&self) -> String {
        format!("the device failed: {}", self.stats.down.get().map(String::as_str).unwrap_or("unknown"))
    }

    /// The home's device failed: say why once, end every live and queued stream with an
    /// error, and take no more work (the home is never called again; later submits are
    /// refused with `SubmitError::HomeDown`). A lost device cannot be brought back without
    /// starting everything anew, which is the process's restart.
    fn go_down(&mut self, why: String) {
        let (live, queued) = (self.streams.len(), self.queue.len());
        tracing::error!(reason = %why, streams_ended = live, queued_ended = queued, "the home's device failed: every request now gets 503 until the server restarts");
        let msg = self.down_message();
        // The counts drop before any stream hears, so a client that saw its error never reads
        // a stale count.
        self.stats.queued.fetch_sub(queued, Ordering::Relaxed);
        self.stats.active.store(0, Ordering::Relaxed);
        for s in self.streams.drain(..) {
            let _ = s.tx.send(GenEvent::Error(msg.clone()));
            self.regions.free(s.region);
        }
        for (_, tx, _) in self.queue.drain(..) {
            let _ = tx.send(GenEvent::Error(msg.clone()));
        }
    }

    /// Drop streams whose receiver is gone (the client left): free their regions at once.
    fn reap(&mut self) {
        let before = self.queue.len();
        self.queue.retain(|(_, tx, _)| !tx.is_closed());
        self.stats.queued.fetch_sub(before - self.queue.len(), Ordering::Relaxed);
        let mut i = 0;
        while i < self.streams.len() {
            if self.streams[i].tx.is_closed() {
                let s = self.streams.swap_remove(i);
                tracing::debug!(stream = s.id, "client gone; region {:?} freed", s.region);
                self.regions.free(s.region);
            } else {
                i += 1;
            }
        }
    }

    fn admit(&mut self) {
        while let Some((req, _, _)) = self.queue.front().filter(|_| self.lost.is_none()) {
            // A history in host memory that matches more of the prompt than any parked region
            // comes back into a region of its own; else the usual claim (adopt, free, LRU).
            let parked = self.regions.best_parked(&req.prompt);
            let from_host = self.host.best(&req.prompt).filter(|&(_, n)| n > parked);
            let claim = if from_host.is_some() { self.regions.claim_empty() } else { self.regions.claim(&req.prompt) };
            let Some(mut claim) = claim else { break };
            self.save_to_host(&claim);
            if let Some((i, n)) = from_host {
                let (tokens, snapshot) = self.host.take(i);
                match self.home.load_region(claim.region, n, &snapshot) {
                    Ok(()) => {
                        self.regions.set_tokens(claim.region, &tokens[..n]);
                        claim.reused = n;
                        Counters::add(&self.home.counters().sessions_restored_from_host, 1);
                    }
                    Err(e) => {
                        tracing::warn!("restoring a session from host memory failed ({e}); prefilling it instead");
                        self.note(&e);
                    }
                }
            }

            let (req, tx, submitted) = self.queue.pop_front().expect("front exists");
            self.stats.queued.fetch_sub(1, Ordering::Relaxed);
            let stop_ids = req.stop_ids.clone().unwrap_or_else(|| self.tokenizer.stop_ids());
            let fed = req.prompt[..claim.reused].to_vec();
            self.next_id += 1;
            self.streams.push(Stream {
                sampler: Sampler::new(req.params.clone()),
                stop: StopMatcher::new(req.stop.clone()),
                req: *req,
                tx,
                region: claim.region,
                fed,
                phase: Phase::Prefill,
                generated: 0,
                reused: claim.reused,
                decoder: StreamDecoder::new(),
                stop_ids,
                submitted,
                first_token: None,
                id: self.next_id,
                lp: None,
            });
        }
    }

    /// Copy a displaced parked history's K/V rows to host memory before its region is reused.
    fn save_to_host(&mut self, claim: &Claim) {
        if claim.evicted.is_empty() || !self.host.enabled() {
            return;
        }
        match self.home.save_region(claim.region, claim.evicted.len()) {
            Ok(snapshot) => {
                if self.host.insert(claim.evicted.clone(), snapshot) {
                    Counters::add(&self.home.counters().sessions_saved_to_host, 1);
                }
            }
            Err(e) => {
                tracing::warn!("saving a parked session to host memory failed: {e}");
                self.note(&e);
            }
        }
    }

    /// One step of every decoding stream: their rows to the home in one call (in balanced
    /// calls of at most the home's `step_rows_max` rows where there are more), each row
    /// asking for what its stream's draw needs; then each stream's draw, in parallel.
    ///
    /// With `ride` (the decoding rows then being one call), that call also carries the tick's
    /// prefill: the peel's rows (one token command) or the prompt chunks
    /// (`Home::step_and_prefill`), whose streams complete as `peel` or `prefill_chunks`
    /// completes them.
    fn decode_step(&mut self, mut ride: Option<Prefill>) {
        let idx = self.decode_members();
        let rode = ride.is_some();
        let (mut done, mut at, mut in_home) = (Vec::new(), 0, Duration::ZERO);
        let (started, calls) = (Instant::now(), balanced_groups(idx.len(), self.home.spec().step_rows_max));
        for &g in &calls {
            let members = &idx[at..at + g];
            at += g;
            if self.lost.is_some() {
                // An earlier call found the device failed: the rest end with the others.
                continue;
            }
            let rows: Vec<Row> = members.iter().map(|&i| self.streams[i].next_row()).collect();
            let needs: Vec<Need> = members.iter().map(|&i| self.streams[i].need()).collect();
            let t = Instant::now();
            let r = match ride.take() {
                Some(Prefill::Peel(pending)) => {
                    // The token command takes the continuations' rows after the decoding ones.
                    let (prows, pneeds, pmembers) = self.peel_rows(&pending);
                    let all: Vec<Row> = rows.iter().chain(&prows).copied().collect();
                    let all_needs: Vec<Need> = needs.iter().chain(&pneeds).copied().collect();
                    match self.home.step(&all, &all_needs) {
                        Ok(mut out) if out.rows.len() == all.len() => {
                            let tail = out.rows.split_off(rows.len());
                            done.extend(self.complete_peel(&pmembers, Ok(tail)));
                            Ok(out)
                        }
                        Ok(out) => {
                            let why = format!("the home returned {} rows for a step of {}", out.rows.len(), all.len());
                            done.extend(self.complete_peel(&pmembers, Err(HomeError::Device(why))));
                            Ok(out)
                        }
                        Err(e) => {
                            done.extend(self.complete_peel(&pmembers, Err(HomeError::Device(e.to_string()))));
                            Err(e)
                        }
                    }
                }
                Some(Prefill::Chunks(c)) => {
                    let segments = segments(&self.streams, &c);
                    let r = self.home.step_and_prefill(&rows, &needs, &segments);
                    drop(segments);
                    let secs = t.elapsed().as_secs_f64();
                    let (out, logits) = match r {
                        Ok((out, logits)) => (Ok(out), Ok(logits)),
                        Err(e) => (Err(HomeError::Device(e.to_string())), Err(e)),
                    };
                    if logits.is_ok() {
                        // The pass's rows, decoding ones too: what the home runs a second.
                        self.prefill_rate = Some(ema(self.prefill_rate, (c.rows + rows.len()) as f64 / secs.max(1e-6)));
                    }
                    done.extend(self.complete_chunks(&c, logits));
                    out
                }
                None => self.home.step(&rows, &needs),
            };
            in_home += t.elapsed();
            match r {
                Ok(out) if out.rows.len() == members.len() => {
                    count_needs(self.home.counters(), &needs);
                    self.feed(members, &rows);
                    let picks = pick_members(&mut self.streams, members, out.rows.into_iter(), Stream::pick);
                    self.emit_picks(members, &picks, &mut done);
                }
                Ok(out) => fail(&mut done, members, &format!("the home returned {} rows for a step of {}", out.rows.len(), members.len())),
                Err(e) => {
                    self.note(&e);
                    fail(&mut done, members, &e.to_string());
                }
            }
        }
        let c = self.home.counters();
        if calls.len() > 1 {
            Counters::add(&c.grouped_steps, 1);
        }
        // The pace is the step's time while no prompt waits or rode in it: a step beside
        // prefill windows runs slower (they evict its weights and activations), and pacing
        // against that would let the windows grow with the slowdown they cause.
        if self.lost.is_none() && !rode && !self.streams.iter().any(|s| matches!(s.phase, Phase::Prefill)) {
            self.step_time.add(started.elapsed().as_secs_f64());
        }
        Counters::add(&c.decode_steps, calls.len() as u64);
        Counters::add(&c.decode_home_microseconds, in_home.as_micros() as u64);
        Counters::add(&c.decode_host_microseconds, started.elapsed().saturating_sub(in_home).as_micros() as u64);
        self.finish(done);
    }

    /// Each member stream takes its row's token into its history (`rows[j]` for `members[j]`):
    /// the step ran, whatever comes of its draws.
    fn feed(&mut self, members: &[usize], rows: &[Row]) {
        for (&i, r) in members.iter().zip(rows) {
            self.streams[i].fed.push(r.token);
        }
    }

    /// Emit each member stream's picked token (`picks[j]` for `members[j]`); the streams that
    /// finish go to `done`.
    fn emit_picks(&mut self, members: &[usize], picks: &[u32], done: &mut Vec<(usize, Result<FinishReason, String>)>) {
        let n_ctx = self.home.spec().n_ctx;
        for (&i, &t) in members.iter().zip(picks) {
            if let After::Finish(r) = self.streams[i].emit(t, &self.tokenizer, n_ctx) {
                done.push((i, Ok(r)));
            }
        }
    }

    /// Whether PrefillQuantum::Pace keeps a decoding stream at its pace (`pace_kept`).
    fn keeps_pace(&self, pending: &[usize]) -> bool {
        let decoding = self.streams.iter().filter(|s| matches!(s.phase, Phase::Decode { .. })).map(|s| s.first_token);
        pace_kept(pending.iter().map(|&i| self.streams[i].submitted), decoding)
    }

    /// Prompt rows the streams `pending` still wait to have prefilled.
    fn waiting_rows(&self, pending: &[usize]) -> usize {
        pending.iter().map(|&i| self.streams[i].req.prompt.len() - self.streams[i].fed.len()).sum()
    }

    /// The decoding streams, in order.
    fn decode_members(&self) -> Vec<usize> {
        (0..self.streams.len()).filter(|&i| matches!(self.streams[i].phase, Phase::Decode { .. })).collect()
    }

    /// What this tick prefills: a peel (token command rows) for short continuations, else
    /// the next chunks of the waiting prompts as segments of one window. `busy`: streams are
    /// decoding, so the chunks are the busy quantum's.
    fn plan_prefill(&self, busy: bool) -> Option<Prefill> {
        let pending: Vec<usize> = (0..self.streams.len()).filter(|&i| matches!(self.streams[i].phase, Phase::Prefill)).collect();
        if pending.is_empty() {
            return None;
        }
        let budget = match (busy, self.config.prefill_quantum_busy) {
            (false, _) => PF_WINDOW,
            (true, PrefillQuantum::Auto) => auto_quantum(self.prefill_rate, None),
            (true, PrefillQuantum::Pace) => auto_quantum(self.prefill_rate, self.keeps_pace(&pending).then_some(self.step_time.avg).flatten()),
            (true, PrefillQuantum::Rows(q)) => q.clamp(1, PF_WINDOW),
        };

        // The peel: every waiting continuation in one token command, when they come to at most
        // NROW_MAX rows and the peel has not run slower than a short window. A peel of some of
        // them would leave the others waiting a whole weight pass each, where one window takes
        // them all.
        let waiting = self.waiting_rows(&pending);
        let peel_cheaper = match (self.peel_time.avg, self.short_window_time.avg) {
            (Some(peel), Some(window)) => peel <= window,
            _ => true,
        };
        if self.config.prefill_peel && waiting <= NROW_MAX && peel_cheaper {
            return Some(Prefill::Peel(pending));
        }

        // Segments: each pending stream's next chunk, in admission order, up to the budget,
        // cut where its rows take the arithmetic of the prompt's own window chain
        // (`chunk_rows`); the first chunk may pass a budget too small for that.
        let min_rows = self.home.spec().chunk_rows_min;
        // The first chunk's least room: twice the least chunk, to cut one off and leave one.
        let least = if min_rows > 1 { 2 * min_rows } else { 1 };
        let mut plan = Vec::new(); // (stream, start, len)
        let mut used = 0;
        for &i in &pending {
            if used >= budget || plan.len() == self.config.max_segments.max(1) {
                break;
            }
            let s = &self.streams[i];
            let room = if plan.is_empty() { (budget - used).max(least) } else { budget - used };
            let take = chunk_rows(s.req.prompt.len(), s.reused, s.fed.len(), room, min_rows);
            if take == 0 {
                continue;
            }
            plan.push((i, s.fed.len(), take));
            used += take;
        }
        (!plan.is_empty()).then_some(Prefill::Chunks(Chunks { plan, rows: used }))
    }

    /// Every waiting continuation (`pending`) in one token command.
    fn peel(&mut self, pending: &[usize]) {
        let (rows, needs, members) = self.peel_rows(pending);
        let t0 = Instant::now();
        let result = self.home.step(&rows, &needs).and_then(|out| {
            if out.rows.len() != rows.len() {
                return Err(HomeError::Device(format!("the home returned {} rows for a peel of {}", out.rows.len(), rows.len())));
            }
            Ok(out.rows)
        });
        match &result {
            Ok(_) => self.peel_time.add(t0.elapsed().as_secs_f64()),
            Err(e) => self.note(e),
        }
        let done = self.complete_peel(&members, result);
        self.finish(done);
    }

    /// The peel's rows of the continuations `pending`, what each row needs back, and each
    /// stream's (index, its last row); counted as a peel.
    fn peel_rows(&self, pending: &[usize]) -> (Vec<Row>, Vec<Need>, Vec<(usize, usize)>) {
        // Each continuation's last row needs what its stream's first draw needs; the rows
        // before it only store their K/V (their argmax ids come back, the least a row can).
        let (mut rows, mut needs, mut members) = (Vec::new(), Vec::new(), Vec::new());
        for &i in pending {
            let s = &self.streams[i];
            let (p0, r) = (s.fed.len(), s.req.prompt.len() - s.fed.len());
            rows.extend(s.req.prompt[p0..].iter().enumerate().map(|(k, &t)| Row { region: s.region, token: t, pos: (p0 + k) as u32 }));
            needs.extend(std::iter::repeat_n(Need::Argmax, r - 1));
            needs.push(s.need());
            members.push((i, rows.len() - 1));
        }
        Counters::add(&self.home.counters().peel_steps, 1);
        Counters::add(&self.home.counters().prompt_tokens_prefilled, rows.len() as u64);
        (rows, needs, members)
    }

    /// After the peel's rows ran (`outs`, one a row): each member's prompt is stored, and it
    /// draws its first token from its last row's result.
    fn complete_peel(&mut self, members: &[(usize, usize)], outs: resin_core::Result<Vec<RowOut>>) -> Vec<(usize, Result<FinishReason, String>)> {
        let outs = outs.map(|mut out| {
            for &(i, _) in members {
                let s = &mut self.streams[i];
                s.fed = s.req.prompt.clone();
            }
            members.iter().map(|&(_, r)| std::mem::replace(&mut out[r], RowOut::Argmax(0))).collect()
        });
        self.complete_prefill(members, outs)
    }

    /// The chunks as one prefill call (segments of one window).
    fn prefill_chunks(&mut self, c: Chunks) {
        let segments = segments(&self.streams, &c);
        let t0 = Instant::now();
        let result = self.home.prefill(&segments);
        drop(segments);
        if result.is_ok() {
            let secs = t0.elapsed().as_secs_f64();
            self.prefill_rate = Some(ema(self.prefill_rate, c.rows as f64 / secs.max(1e-6)));
            if c.rows <= NROW_MAX {
                self.short_window_time.add(secs);
            }
        }
        let done = self.complete_chunks(&c, result);
        self.finish(done);
    }

    /// After the chunks' prefill: each stream takes its chunk into its history, and those
    /// whose prompt is now complete draw their first token from their segment's logits row.
    fn complete_chunks(&mut self, c: &Chunks, result: resin_core::Result<resin_core::Logits>) -> Vec<(usize, Result<FinishReason, String>)> {
        if let Err(e) = &result {
            self.note(e);
        }
        let mut members = Vec::new();
        for (k, &(i, start, len)) in c.plan.iter().enumerate() {
            let s = &mut self.streams[i];
            if result.is_ok() {
                s.fed.extend_from_slice(&s.req.prompt[start..start + len]);
            }
            if s.fed.len() == s.req.prompt.len() || result.is_err() {
                members.push((i, k));
            }
        }
        let rows = result.and_then(|l| {
            if l.rows() != c.plan.len() {
                return Err(HomeError::Device(format!("the home returned {} logits rows for {} segments", l.rows(), c.plan.len())));
            }
            Ok(members.iter().map(|&(_, k)| RowOut::Logits(l.row(k).to_vec())).collect())
        });
        self.complete_prefill(&members, rows)
    }

    /// Streams whose prompt is fully stored draw their first token from their last row.
    fn complete_prefill(&mut self, members: &[(usize, usize)], outs: resin_core::Result<Vec<RowOut>>) -> Vec<(usize, Result<FinishReason, String>)> {
        let n_ctx = self.home.spec().n_ctx;
        let mut done = Vec::new();
        match outs {
            Ok(rows) => {
                for (&(i, _), out) in members.iter().zip(rows) {
                    let s = &mut self.streams[i];
                    let t = s.pick(out);
                    if let After::Finish(r) = s.emit(t, &self.tokenizer, n_ctx) {
                        done.push((i, Ok(r)));
                    }
                }
            }
            Err(e) => done.extend(members.iter().map(|&(i, _)| (i, Err(e.to_string())))),
        }
        done
    }

    /// Send the final events and park (or free, on error) the regions; remove the streams.
    fn finish(&mut self, mut done: Vec<(usize, Result<FinishReason, String>)>) {
        done.sort_by_key(|d| std::cmp::Reverse(d.0));
        done.dedup_by_key(|d| d.0);
        // The live count drops before any Done goes out, so a client that saw Done never
        // reads a stale count.
        self.stats.active.store(self.streams.len().saturating_sub(done.len()), Ordering::Relaxed);
        for (i, outcome) in done {
            let mut s = self.streams.swap_remove(i);
            match outcome {
                Ok(reason) => {
                    let tail = s.decoder.finish() + &s.stop.flush();
                    if !tail.is_empty() && reason == FinishReason::Length {
                        let _ = s.tx.send(GenEvent::Delta { ids: Vec::new(), text: tail, logprobs: Vec::new() });
                    }
                    let _ = s.tx.send(GenEvent::Done(Finish {
                        reason,
                        prompt_tokens: s.req.prompt.len(),
                        completion_tokens: s.generated,
                        reused_tokens: s.reused,
                        time_to_first_token: s.first_token.map(|t| t - s.submitted).unwrap_or_default(),
                        stop_string: s.stop.matched().map(str::to_string),
                    }));
                    self.regions.set_tokens(s.region, &s.fed);
                    self.regions.park(s.region);
                }
                Err(e) => {
                    // A failed device is logged once, by `go_down`.
                    if self.lost.is_none() {
                        tracing::error!(stream = s.id, "generation failed: {e}");
                    }
                    let _ = s.tx.send(GenEvent::Error(e));
                    self.regions.free(s.region);
                }
            }
        }
    }
}

impl Stream {
    /// The row this decoding stream feeds at its next step.
    fn next_row(&self) -> Row {
        let Phase::Decode { next } = self.phase else { unreachable!("only decoding streams step") };
        Row { region: self.region, token: next, pos: self.fed.len() as u32 }
    }

    /// The next token from what its row's step returned (as `need` asked): the argmax id of a
    /// plain greedy stream; a draw from the row's top candidates (which the sampler draws
    /// from as from the whole row; where the row has no finite logit, its argmax id, which is
    /// what `sample` picks from such a row); or the constraint's mask and the sampler over the
    /// whole row.
    ///
    /// A stream that asks for log-probabilities keeps the picked token's (`lp`), from the raw
    /// row: the top candidates' (a draw from them never leaves them; greedy takes the first),
    /// or the whole row's as it came, before the mask and the penalties.
    fn pick(&mut self, out: RowOut) -> u32 {
        let k = self.req.logprobs;
        match out {
            RowOut::Argmax(id) => {
                // Not reached with `logprobs` (`need` asks for the top candidates then).
                self.lp = k.map(|_| TokenLogprob { id, logprob: f32::NAN, top: Vec::new() });
                id
            }
            RowOut::Top(t) => {
                let id = self.sampler.sample_top(&t.top).unwrap_or(t.argmax);
                // Not in the top list only where the row has no finite logit.
                self.lp = k.map(|k| TokenLogprob::from_top(&t, id, k).unwrap_or(TokenLogprob { id, logprob: f32::NEG_INFINITY, top: Vec::new() }));
                id
            }
            RowOut::Logits(mut row) => {
                let raw = k.map(|_| row.clone());
                if let Some(c) = self.req.constraint.as_mut() {
                    c.mask(&mut row);
                }
                let id = self.sampler.sample(&mut row, &self.fed);
                self.lp = raw.zip(k).map(|(raw, k)| TokenLogprob::from_row(&raw, id, k));
                id
            }
        }
    }

    /// What this stream's next draw needs of its row: the plain argmax (no constraint, no
    /// penalties, greedy), only the TOP_CANDIDATES largest logits (no constraint; see
    /// `Sampler::draws_from_top`), or the whole logits row.
    /// A stream that asks for log-probabilities needs at least the top candidates (with the
    /// row's log-sum-exp), and the whole row wherever its draw may leave them.
    fn need(&self) -> Need {
        if self.req.constraint.is_some() {
            Need::Logits
        } else if self.sampler.is_plain_greedy() {
            if self.req.logprobs.is_some() {
                Need::Top
            } else {
                Need::Argmax
            }
        } else if self.sampler.draws_from_top(resin_core::TOP_CANDIDATES) {
            Need::Top
        } else {
            Need::Logits
        }
    }

    /// Emit sampled token `t` (stop ids, stop strings, the constraint, limits).
    fn emit(&mut self, t: u32, tok: &Tokenizer, n_ctx: usize) -> After {
        self.generated += 1;
        if self.first_token.is_none() {
            self.first_token = Some(Instant::now());
        }
        let constraint_done = self.req.constraint.as_mut().is_some_and(|c| c.accept(t));
        let lp = self.lp.take();
        if self.stop_ids.contains(&t) {
            let _ = self.tx.send(GenEvent::Delta { ids: vec![t], text: String::new(), logprobs: Vec::new() });
            return After::Finish(FinishReason::Stop);
        }
        let logprobs: Vec<TokenLogprob> = lp.into_iter().collect();
        let piece = self.decoder.push(tok, t);
        match self.stop.push(&piece) {
            StopOutcome::Stop(text) => {
                let _ = self.tx.send(GenEvent::Delta { ids: vec![t], text, logprobs });
                return After::Finish(FinishReason::Stop);
            }
            StopOutcome::Emit(text) => {
                let _ = self.tx.send(GenEvent::Delta { ids: vec![t], text, logprobs });
            }
        }
        if constraint_done {
            let tail = self.decoder.finish() + &self.stop.flush();
            if !tail.is_empty() {
                let _ = self.tx.send(GenEvent::Delta { ids: Vec::new(), text: tail, logprobs: Vec::new() });
            }
            return After::Finish(FinishReason::Stop);
        }
        // The sampled token is fed at position fed.len(); it must fit in the context.
        if self.generated >= self.req.max_tokens || self.fed.len() + 1 >= n_ctx {
            return After::Finish(FinishReason::Length);
        }
        self.phase = Phase::Decode { next: t };
        After::Continue
    }
}

/// Count a step by what its rows read back: argmax ids alone (every stream plain greedy),
/// top candidates (any stream with a top_k up to TOP_CANDIDATES), and whole logits rows.
fn count_needs(c: &Counters, needs: &[Need]) {
    if needs.iter().all(|&n| n == Need::Argmax) {
        Counters::add(&c.decode_argmax_steps, 1);
    } else if needs.contains(&Need::Top) {
        Counters::add(&c.decode_top_steps, 1);
    }
    Counters::add(&c.decode_logits_rows, needs.iter().filter(|&&n| n == Need::Logits).count() as u64);
}

/// The home's device failed (`why`): published in `stats.down` (the first reason stays) and,
/// the first time, noted in `lost` for the tick to end every stream (`Scheduler::go_down`).
fn lost(stats: &EngineStats, lost: &mut Option<String>, why: &str) {
    if stats.down.set(why.to_string()).is_ok() {
        *lost = Some(why.to_string());
    }
}

/// Every member stream ends with error `e` (its step failed).
fn fail(done: &mut Vec<(usize, Result<FinishReason, String>)>, members: &[usize], e: &str) {
    done.extend(members.iter().map(|&i| (i, Err(e.to_string()))));
}

/// Each member stream's pick (`members` ascending, one item of `items` each, in order), the
/// streams' draws in parallel: each is its own work over its own row (a 128k vocabulary's draw
/// costs host time of the order of a GPU step), and the picks are the same in any order (each
/// stream has its own generator). Fewer picks than members where `items` runs out.
fn pick_members<T: Send>(streams: &mut [Stream], members: &[usize], mut items: impl Iterator<Item = T>, pick: impl Fn(&mut Stream, T) -> u32 + Sync + Send) -> Vec<u32> {
    let mut jobs: Vec<(&mut Stream, T)> = Vec::with_capacity(members.len());
    let mut next = members.iter().peekable();
    for (i, s) in streams.iter_mut().enumerate() {
        if next.next_if(|&&m| m == i).is_some() {
            match items.next() {
                Some(item) => jobs.push((s, item)),
                None => break,
            }
        }
    }
    jobs.into_par_iter().map(|(s, item)| pick(s, item)).collect()
}

#[cfg(test)]
mod quantum_tests {
    use super::*;

    #[test]
    fn the_automatic_quantum_is_what_the_home_prefills_in_the_tick_target() {
        // No window measured yet, or a rate that says nothing: the least quantum.
        assert_eq!(auto_quantum(None, None), PREFILL_QUANTUM_MIN);
        assert_eq!(auto_quantum(Some(f64::NAN), None), PREFILL_QUANTUM_MIN);
        assert_eq!(auto_quantum(Some(0.0), None), PREFILL_QUANTUM_MIN);
        // A CPU home (a few hundred rows a second): the least quantum, as before.
        assert_eq!(auto_quantum(Some(700.0), None), PREFILL_QUANTUM_MIN);
        // A GPU home at 10,600 rows/s: 265 rows in 25 ms; at 27,000: a whole window.
        assert_eq!(auto_quantum(Some(10_600.0), None), 265);
        assert_eq!(auto_quantum(Some(27_000.0), None), PF_WINDOW);
    }

    #[test]
    fn streams_kept_at_their_pace_get_prefill_for_a_share_of_their_step() {
        // 34,000 rows/s beside a 2.3 ms step: 58 rows (1.7 ms of prefill a tick).
        assert_eq!(auto_quantum(Some(34_000.0), Some(0.0023)), 58);
        // A CPU home at 1,100 rows/s beside a 21 ms step: 17 rows; never under one row.
        assert_eq!(auto_quantum(Some(1_100.0), Some(0.021)), 17);
        assert_eq!(auto_quantum(Some(10.0), Some(0.001)), 1);
        // Never past a window; before any window is timed, a small first quantum.
        assert_eq!(auto_quantum(Some(1e7), Some(0.05)), PF_WINDOW);
        assert_eq!(auto_quantum(None, Some(0.01)), PACE_QUANTUM_FIRST);
        // A step not yet timed says nothing: the tick target's quantum.
        assert_eq!(auto_quantum(Some(10_600.0), Some(0.0)), 265);
    }

    #[test]
    fn only_streams_decoding_before_a_prompt_came_are_kept_at_their_pace() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        // A stream whose first token came at 5 ms, a prompt submitted at 10 ms: kept.
        assert!(pace_kept([at(10)].into_iter(), [Some(at(5))].into_iter()));
        // A batch submitted at 0 ms whose first tokens come later: not kept.
        assert!(!pace_kept([at(0)].into_iter(), [Some(at(5)), Some(at(7))].into_iter()));
        // Any waiting prompt that came after a first token is enough.
        assert!(pace_kept([at(0), at(10)].into_iter(), [Some(at(5))].into_iter()));
        // Nothing waiting, or no first token yet: not kept.
        assert!(!pace_kept(std::iter::empty(), [Some(at(5))].into_iter()));
        assert!(!pace_kept([at(10)].into_iter(), [None].into_iter()));
    }
}
