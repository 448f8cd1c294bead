//! The contract between the engine (scheduler) and a home (a backend that runs the whole model).
//!
//! The scheduler speaks only these types; it never knows which home it drives. A home owns the
//! K/V mirror: `regions` slices, each one session's history, addressed by [`RegionId`]. Which
//! session holds which region is the engine's business ([`regions::RegionTable`]); kernels only
//! see an offset.

pub mod canon;
mod counters;
mod error;
pub mod regions;
pub mod window;

pub use counters::Counters;
pub use error::{HomeError, Result};
pub use window::{count_window, plan_chain, ChainRow, Window};

/// Rows a token command steps in one pass over the weights.
pub const NROW_MAX: usize = 8;
/// Rows a wide step takes at most: a step of more than NROW_MAX rows (one row each of that
/// many decoding sessions) that reads the weights through the prefill window's matrix
/// kernels instead of the token command's GEMV. `HomeSpec::step_rows_max` is each home's.
pub const WIDE_ROWS_MAX: usize = 64;
/// Rows a prefill window holds.
pub const PF_WINDOW: usize = 512;

/// One session's slice of the K/V mirror.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RegionId(pub u32);

/// How the K/V mirror stores keys and values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KvCodec {
    #[default]
    F16,
    F32,
    Q8_0,
}

impl KvCodec {
    pub fn parse(s: &str) -> Option<Self> {
        match s.to_ascii_lowercase().as_str() {
            "f16" => Some(KvCodec::F16),
            "f32" => Some(KvCodec::F32),
            "q8_0" | "q8" => Some(KvCodec::Q8_0),
            _ => None,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            KvCodec::F16 => "f16",
            KvCodec::F32 => "f32",
            KvCodec::Q8_0 => "q8_0",
        }
    }
    /// Bytes to store `n` values (n a multiple of 32 for q8_0).
    pub fn bytes_for(self, n: usize) -> usize {
        match self {
            KvCodec::F16 => n * 2,
            KvCodec::F32 => n * 4,
            KvCodec::Q8_0 => n.div_ceil(32) * 34,
        }
    }
}

/// One row of a token step: a session's token at its absolute position in its region.
///
/// Semantics shared by every home: in each layer every row of the step stores its K/V first,
/// then attends to keys `0..=pos` of its own region. So several rows of one region at
/// consecutive positions (the peel) see each other causally.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Row {
    pub region: RegionId,
    pub token: u32,
    pub pos: u32,
}

/// One session's chunk of a prefill window chain: `tokens` go to positions
/// `start..start + tokens.len()` of `region`; the segment's last row yields logits.
#[derive(Debug, Clone, Copy)]
pub struct Segment<'a> {
    pub region: RegionId,
    pub start: u32,
    pub tokens: &'a [u32],
}

/// Logits rows, row-major: `data[i * vocab .. (i + 1) * vocab]` is row `i`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Logits {
    pub vocab: usize,
    pub data: Vec<f32>,
}

impl Logits {
    pub fn rows(&self) -> usize {
        self.data.len().checked_div(self.vocab).unwrap_or(0)
    }
    pub fn row(&self, i: usize) -> &[f32] {
        &self.data[i * self.vocab..(i + 1) * self.vocab]
    }
}

/// Split `n` rows into the fewest groups of at most `max`, balanced (max 8: 12 -> 6+6,
/// 17 -> 6+6+5): the engine's grouped steps and the Vulkan home's lanes.
pub fn balanced_groups(n: usize, max: usize) -> Vec<usize> {
    if n == 0 {
        return Vec::new();
    }
    let g = n.div_ceil(max.max(1));
    (0..g).map(|i| n / g + usize::from(i < n % g)).collect()
}

/// The greedy choice: the first index of the largest logit (NaN never wins; 0 when every
/// logit is NaN). The Vulkan home's on-device argmax follows the same rule.
///
/// Two branch-free passes the compiler vectorizes (a vocabulary of 128k logits a token, where
/// the one-pass loop's branch keeps it scalar: docs/lessons.md): the largest value, 16 lanes
/// at a time, then the first index holding it. `argmax_scalar` is the rule written plainly
/// (and serves the rare case where no logit is above -inf).
pub fn argmax(logits: &[f32]) -> u32 {
    const L: usize = 16;
    let best = max_of(logits, |_| true);
    if best == f32::NEG_INFINITY {
        return argmax_scalar(logits);
    }
    // The first index whose value equals the largest (as `>` saw it: -0.0 == 0.0), a chunk's
    // test at a time.
    let mut base = 0;
    for x in logits.chunks(L) {
        if x.iter().fold(false, |f, &v| f | (v == best)) {
            return (base + x.iter().position(|&v| v == best).unwrap_or(0)) as u32;
        }
        base += x.len();
    }
    0
}

/// The largest of the values `admit` keeps (-inf when it keeps none above -inf; a NaN never
/// wins), 16 lanes at a time with no branch, so the compiler vectorizes it: `argmax`'s first
/// pass, and the sampler's largest finite logit.
pub fn max_of(values: &[f32], admit: impl Fn(f32) -> bool + Copy) -> f32 {
    const L: usize = 16;
    let mut m = [f32::NEG_INFINITY; L];
    let chunks = values.chunks_exact(L);
    let tail = chunks.remainder();
    for x in chunks {
        for (mj, &xj) in m.iter_mut().zip(x) {
            // A NaN never compares greater: it is skipped.
            *mj = if admit(xj) && xj > *mj { xj } else { *mj };
        }
    }
    m.iter().chain(tail.iter().filter(|&&x| admit(x))).fold(f32::NEG_INFINITY, |a, &b| if b > a { b } else { a })
}

fn argmax_scalar(logits: &[f32]) -> u32 {
    let mut best: Option<(usize, f32)> = None;
    for (i, &v) in logits.iter().enumerate() {
        if !v.is_nan() && best.is_none_or(|(_, b)| v > b) {
            best = Some((i, v));
        }
    }
    best.map_or(0, |(i, _)| i as u32)
}

/// What a home was built to serve.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HomeSpec {
    /// "cpu" or "vulkan".
    pub kind: &'static str,
    pub vocab: usize,
    /// Positions per region.
    pub n_ctx: usize,
    pub regions: usize,
    pub codec: KvCodec,
    /// The most rows one `step` takes: NROW_MAX, or up to WIDE_ROWS_MAX where the home runs
    /// wide steps (never more than its regions, since each row is a session's).
    pub step_rows_max: usize,
    /// The fewest rows of a prefill segment whose rows come out bit for bit as in the
    /// prompt's own window chain: 1 where a row's arithmetic never depends on its window's
    /// size (the CPU home); the Vulkan home's windows under 16 rows take the GEMV and the
    /// decode attention instead. The engine cuts prompts so that no chunk falls below it but
    /// the chain's own last window where that is shorter ([`chunk_rows`]).
    pub chunk_rows_min: usize,
}

/// Rows of a prompt's next prefill chunk on a home whose windows under `min_rows` rows take
/// other kernels than longer ones: at most `room`, every row taking the arithmetic it takes in
/// the prompt's own window chain (windows of PF_WINDOW from `start`, the first position
/// prefilled; its last window `last` rows). No chunk falls under `min_rows` (nor leaves fewer
/// than `min_rows` before that last window) except that last window itself, when it is
/// shorter, which is a chunk of its own. 0: nothing fits in `room`.
pub fn chunk_rows(prompt_len: usize, start: usize, fed: usize, room: usize, min_rows: usize) -> usize {
    let remaining = prompt_len.saturating_sub(fed);
    if min_rows <= 1 || remaining == 0 {
        return remaining.min(room);
    }
    let last = (prompt_len - start.min(prompt_len)).saturating_sub(1) % PF_WINDOW + 1;
    let tail = if last < min_rows { last.min(remaining) } else { 0 };
    let body = remaining - tail;
    if body == 0 {
        return if remaining <= room { remaining } else { 0 };
    }
    if body <= room {
        return body;
    }
    let take = room.min(body - min_rows);
    if take >= min_rows {
        take
    } else {
        0
    }
}

impl HomeSpec {
    /// The rows a step of this home may take for `regions` regions when it serves wide steps.
    pub fn wide_rows(regions: usize) -> usize {
        regions.clamp(NROW_MAX, WIDE_ROWS_MAX)
    }
}

/// Candidates a [`Need::Top`] row gets back: samplers whose top_k is at most this draw from
/// them alone.
pub const TOP_CANDIDATES: usize = 64;

/// The high word of a logit's candidate key: ascending keys are the sampler's candidate order
/// (descending logits, 0.0 before -0.0), with the id as the low word for ties. The engine's
/// sampler sorts by it and the Vulkan home's top-k (shaders/ops/topk.comp `key_of`) lists by
/// it, so a top row's candidates come in the order the sampler draws them.
pub fn candidate_key(logit: f32) -> u32 {
    let b = logit.to_bits();
    let mono = if b >> 31 == 1 { !b } else { b | 0x8000_0000 };
    !mono
}

/// The logit whose [`candidate_key`] is `key`.
pub fn candidate_logit(key: u32) -> f32 {
    let mono = !key;
    f32::from_bits(if mono >> 31 == 1 { mono & 0x7FFF_FFFF } else { !mono })
}

/// What a row of a step needs back: the home reads back only that (a 128k vocabulary's
/// logits row is half a megabyte; an argmax id four bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Need {
    /// The row's argmax id (a plain greedy draw).
    Argmax,
    /// The row's [`TopCandidates`] (a sampler that keeps at most TOP_CANDIDATES candidates).
    Top,
    /// The whole logits row (penalties, a constraint, a larger or no top_k).
    Logits,
}

/// A row's largest logits, its argmax id and its log-sum-exp: what a [`Need::Top`] row gets.
#[derive(Debug, Clone, PartialEq)]
pub struct TopCandidates {
    /// The first index of the largest logit (`argmax`'s rule).
    pub argmax: u32,
    /// The TOP_CANDIDATES largest finite logits as (id, logit), best first in the sampler's
    /// order (descending logits, 0.0 before -0.0, ties by id); fewer where the row has fewer.
    pub top: Vec<(u32, f32)>,
    /// ln(sum(exp(logit))) over the whole row (NaN skipped; -inf for a row with no logit
    /// above -inf), so a candidate's log-probability needs no whole row.
    pub lse: f32,
}

impl TopCandidates {
    /// A row's candidates, selected on the host: what a home without a device selection
    /// returns, and the oracle of the ones that select on a device.
    pub fn of(row: &[f32]) -> TopCandidates {
        let mut c: Vec<(u32, u32)> = row.iter().enumerate().filter(|(_, x)| x.is_finite()).map(|(id, &x)| (candidate_key(x), id as u32)).collect();
        if c.len() > TOP_CANDIDATES {
            c.select_nth_unstable(TOP_CANDIDATES - 1);
            c.truncate(TOP_CANDIDATES);
        }
        c.sort_unstable();
        TopCandidates { argmax: argmax(row), top: c.iter().map(|&(_, id)| (id, row[id as usize])).collect(), lse: log_sum_exp(row) }
    }
}

/// ln(sum(exp(x))) over `row`, NaN skipped, in f64: -inf when no value is above -inf, +inf
/// when one is +inf.
pub fn log_sum_exp(row: &[f32]) -> f32 {
    let m = max_of(row, |x| !x.is_nan());
    if !m.is_finite() {
        return m;
    }
    let s: f64 = row.iter().filter(|x| !x.is_nan()).map(|&x| ((x - m) as f64).exp()).sum();
    (m as f64 + s.ln()) as f32
}

/// One row's part of a step's result, as its [`Need`] asked.
#[derive(Debug, Clone, PartialEq)]
pub enum RowOut {
    Argmax(u32),
    Top(TopCandidates),
    Logits(Vec<f32>),
}

impl RowOut {
    /// The row's result as `need` asks for it, from its whole logits row (a home that
    /// computes every row's logits on the host).
    pub fn from_logits(need: Need, row: &[f32]) -> RowOut {
        match need {
            Need::Argmax => RowOut::Argmax(argmax(row)),
            Need::Top => RowOut::Top(TopCandidates::of(row)),
            Need::Logits => RowOut::Logits(row.to_vec()),
        }
    }

    /// The row's argmax id, whatever came back.
    pub fn argmax(&self) -> u32 {
        match self {
            RowOut::Argmax(id) => *id,
            RowOut::Top(t) => t.argmax,
            RowOut::Logits(row) => argmax(row),
        }
    }

    /// The whole logits row, where it came back.
    pub fn logits(&self) -> Option<&[f32]> {
        match self {
            RowOut::Logits(row) => Some(row),
            _ => None,
        }
    }
}

/// What a step returns: one [`RowOut`] a row, in row order.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct StepOut {
    pub rows: Vec<RowOut>,
}

/// [`Home::step_and_prefill`] as two calls: the step, then the prefill (the trait's default,
/// and what a home that runs both in one pass does where it cannot).
pub fn step_then_prefill<H: Home + ?Sized>(home: &mut H, rows: &[Row], needs: &[Need], segments: &[Segment<'_>]) -> Result<(StepOut, Logits)> {
    let out = home.step(rows, needs)?;
    Ok((out, home.prefill(segments)?))
}

/// A backend that runs the whole model. The CPU home and the Vulkan home implement it.
pub trait Home: Send {
    fn spec(&self) -> &HomeSpec;

    /// Prefill segments (window chain); returns one logits row per segment (its last row).
    fn prefill(&mut self, segments: &[Segment<'_>]) -> Result<Logits>;

    /// One step over `rows` (1..=spec().step_rows_max; each row a session's next token, or a
    /// peel's prompt rows), `needs[i]` saying what row i needs back. The home alone decides
    /// how to run the rows (one pass, groups, lanes); a row's result does not depend on the
    /// other rows of the step.
    fn step(&mut self, rows: &[Row], needs: &[Need]) -> Result<StepOut>;

    /// A step and a prefill in one call (continuous batching: the decoding sessions' rows and
    /// waiting prompts' chunks, of other sessions, together): each row's result is what
    /// `step` gives it and each segment's logits row what `prefill` gives it. A home that
    /// can runs both in one pass over the weights (and counts it in `mixed_steps`); by
    /// default the step, then the prefill.
    fn step_and_prefill(&mut self, rows: &[Row], needs: &[Need], segments: &[Segment<'_>]) -> Result<(StepOut, Logits)> {
        step_then_prefill(self, rows, needs, segments)
    }

    /// The counters this home updates (shared with the engine and the server's /metrics).
    fn counters(&self) -> &std::sync::Arc<Counters>;

    /// The K/V rows `0..rows` of `region`, every layer, as bytes in this home's layout: what a
    /// host-cached session keeps while its region serves another session.
    fn save_region(&mut self, region: RegionId, rows: usize) -> Result<Vec<u8>>;

    /// Write the first `rows` rows of a snapshot `save_region` made (of at least `rows` rows,
    /// on a home of the same model and codec) into rows `0..rows` of `region`.
    fn load_region(&mut self, region: RegionId, rows: usize, snapshot: &[u8]) -> Result<()>;

    /// The home's stage clock, where it has one (`resin bench --profile`).
    fn profiler(&mut self) -> Option<&mut dyn Profile> {
        None
    }
}

/// A home that times the stages of its passes.
pub trait Profile {
    /// One step over `rows` (run as a step would, its K/V written) with the device time of
    /// each stage, `(op.layer, microseconds)` in order; None where the device has no clock.
    fn profile_step(&mut self, rows: &[Row]) -> Result<Option<Vec<(String, f64)>>>;

    /// As `profile_step`, for one prefill window of `segment` (its first PF_WINDOW rows).
    fn profile_window(&mut self, segment: &Segment<'_>) -> Result<Option<Vec<(String, f64)>>>;

    /// The shape of the token command for `rows` rows (1..=NROW_MAX): its dependent stages,
    /// dispatches and barriers; None where the home records no command.
    fn step_shape(&mut self, rows: usize) -> Result<Option<StepShape>>;

    /// Bytes of weights each kind of matrix stage reads in one pass, summed over the layers
    /// (`qkv`, `attn_out`, `gate_up`, `down`, `classifier`, as the profiles label them), so a
    /// profile can say each stage's bandwidth.
    fn stage_weight_bytes(&self) -> Vec<(&'static str, u64)>;

    /// Bytes a second a device-local buffer copy moves (the bytes it reads and writes over its
    /// time): the bandwidth the matrix stages are held against. None without a device clock.
    fn copy_bandwidth(&mut self) -> Result<Option<f64>>;
}

/// A token command's shape: what bounds a step that moves few bytes is the chain of dependent
/// stages (each waits for the one before), not its dispatches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepShape {
    /// Links in the longest chain of waits a row's data passes through, the whole command.
    pub stages: u32,
    pub dispatches: u32,
    pub barriers: u32,
}

/// Shorthands over [`Home::step`] for callers that want one kind of result for every row
/// (tests, `resin bench`).
pub trait StepAll {
    /// Every row's whole logits row.
    fn step_logits(&mut self, rows: &[Row]) -> Result<Logits>;
    /// Every row's argmax id.
    fn step_ids(&mut self, rows: &[Row]) -> Result<Vec<u32>>;
}

impl<H: Home + ?Sized> StepAll for H {
    fn step_logits(&mut self, rows: &[Row]) -> Result<Logits> {
        let out = self.step(rows, &vec![Need::Logits; rows.len()])?;
        let vocab = self.spec().vocab;
        let mut data = Vec::with_capacity(rows.len() * vocab);
        for r in &out.rows {
            match r.logits() {
                Some(l) if l.len() == vocab => data.extend_from_slice(l),
                _ => return Err(HomeError::Device("a step did not return the logits rows asked for".into())),
            }
        }
        Ok(Logits { vocab, data })
    }

    fn step_ids(&mut self, rows: &[Row]) -> Result<Vec<u32>> {
        Ok(self.step(rows, &vec![Need::Argmax; rows.len()])?.rows.iter().map(RowOut::argmax).collect())
    }
}

/// Checks every home applies to its inputs, so all homes reject the same things the same way.
pub fn check_step(spec: &HomeSpec, rows: &[Row], needs: &[Need]) -> Result<()> {
    if needs.len() != rows.len() {
        return Err(HomeError::BadNeeds { needs: needs.len(), rows: rows.len() });
    }
    check_rows(spec, rows)
}

/// The row checks of [`check_step`] (also for a profiled step, which has no needs).
pub fn check_rows(spec: &HomeSpec, rows: &[Row]) -> Result<()> {
    let max = spec.step_rows_max.max(1);
    if rows.is_empty() || rows.len() > max {
        return Err(HomeError::BadRowCount { got: rows.len(), max });
    }
    for r in rows {
        check_region(spec, r.region)?;
        check_token(spec, r.token)?;
        if r.pos as usize >= spec.n_ctx {
            return Err(HomeError::ContextFull { pos: r.pos as usize, n_ctx: spec.n_ctx });
        }
    }
    Ok(())
}

pub fn check_segments(spec: &HomeSpec, segments: &[Segment<'_>]) -> Result<()> {
    for s in segments {
        check_region(spec, s.region)?;
        if s.tokens.is_empty() {
            return Err(HomeError::EmptySegment(s.region));
        }
        let end = s.start as usize + s.tokens.len();
        if end > spec.n_ctx {
            return Err(HomeError::ContextFull { pos: end - 1, n_ctx: spec.n_ctx });
        }
        for &t in s.tokens {
            check_token(spec, t)?;
        }
    }
    Ok(())
}

/// The checks of `save_region` / `load_region`: the region exists, `rows` fit the context, and
/// (for a load) the snapshot holds a whole number of rows of `row_bytes` bytes, at least `rows`.
/// Returns the snapshot's row count (0 for a save).
pub fn check_snapshot(spec: &HomeSpec, region: RegionId, rows: usize, row_bytes: usize, snapshot: Option<&[u8]>) -> Result<usize> {
    check_region(spec, region)?;
    if rows > spec.n_ctx {
        return Err(HomeError::ContextFull { pos: rows.saturating_sub(1), n_ctx: spec.n_ctx });
    }
    let Some(b) = snapshot else { return Ok(0) };
    if row_bytes == 0 || b.len() % row_bytes != 0 || b.len() / row_bytes < rows || b.len() / row_bytes > spec.n_ctx {
        return Err(HomeError::BadSnapshot(format!("{} bytes are not {rows}..={} rows of {row_bytes} bytes", b.len(), spec.n_ctx)));
    }
    Ok(b.len() / row_bytes)
}

fn check_region(spec: &HomeSpec, r: RegionId) -> Result<()> {
    if r.0 as usize >= spec.regions {
        return Err(HomeError::NoSuchRegion(r, spec.regions));
    }
    Ok(())
}

fn check_token(spec: &HomeSpec, token: u32) -> Result<()> {
    if token as usize >= spec.vocab {
        return Err(HomeError::BadToken { token, vocab: spec.vocab });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::balanced_groups;

    #[test]
    fn groups_are_fewest_and_balanced() {
        assert_eq!(balanced_groups(0, 8), Vec::<usize>::new());
        assert_eq!(balanced_groups(1, 8), vec![1]);
        assert_eq!(balanced_groups(8, 8), vec![8]);
        assert_eq!(balanced_groups(9, 8), vec![5, 4]);
        assert_eq!(balanced_groups(12, 8), vec![6, 6]);
        assert_eq!(balanced_groups(17, 8), vec![6, 6, 5]);
        assert_eq!(balanced_groups(64, 8), vec![8; 8]);
        assert_eq!(balanced_groups(64, 64), vec![64]);
        assert_eq!(balanced_groups(100, 64), vec![50, 50]);
    }

    #[test]
    fn host_top_candidates_are_the_largest_finite_logits_in_the_samplers_order() {
        use super::{candidate_key, log_sum_exp, TopCandidates, TOP_CANDIDATES};
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for n in [0usize, 1, 5, 63, 64, 65, 300, 5000] {
            // Few distinct values (ties), some non-finite.
            let row: Vec<f32> = (0..n)
                .map(|_| match next() % 23 {
                    0 => f32::NAN,
                    1 => f32::NEG_INFINITY,
                    2 => -0.0,
                    r => (r % 9) as f32 * 0.5 - 2.0,
                })
                .collect();
            let t = TopCandidates::of(&row);
            let mut all: Vec<(u32, u32)> = row.iter().enumerate().filter(|(_, x)| x.is_finite()).map(|(i, &x)| (candidate_key(x), i as u32)).collect();
            all.sort_unstable();
            all.truncate(TOP_CANDIDATES);
            let want: Vec<(u32, f32)> = all.iter().map(|&(_, i)| (i, row[i as usize])).collect();
            assert_eq!(t.top.iter().map(|p| p.0).collect::<Vec<_>>(), want.iter().map(|p| p.0).collect::<Vec<_>>(), "n {n}");
            assert_eq!(t.argmax, super::argmax(&row));
            let finite: Vec<f64> = row.iter().filter(|x| !x.is_nan()).map(|&x| x as f64).collect();
            let plain = finite.iter().map(|x| x.exp()).sum::<f64>().ln();
            let lse = log_sum_exp(&row);
            if finite.iter().all(|&x| x == f64::NEG_INFINITY) {
                assert_eq!(lse, f32::NEG_INFINITY);
            } else {
                assert!((lse as f64 - plain).abs() < 1e-5 * plain.abs().max(1.0), "n {n}: {lse} against {plain}");
            }
        }
        assert_eq!(log_sum_exp(&[1.0, f32::INFINITY]), f32::INFINITY);
        assert!((log_sum_exp(&[1000.0, 1000.0]) - (1000.0 + 2f32.ln())).abs() < 1e-3, "no overflow");
    }

    #[test]
    fn argmax_takes_the_first_largest_and_skips_nan() {
        assert_eq!(super::argmax(&[1.0, 3.0, 3.0, 2.0]), 1);
        assert_eq!(super::argmax(&[f32::NAN, 0.5, 0.7]), 2);
        assert_eq!(super::argmax(&[f32::NAN, f32::NAN]), 0);
        assert_eq!(super::argmax(&[f32::NEG_INFINITY, -1e30]), 1);
        assert_eq!(super::argmax(&[f32::NAN, f32::NEG_INFINITY, f32::NEG_INFINITY]), 1);
        assert_eq!(super::argmax(&[]), 0);
    }

    #[test]
    fn argmax_equals_the_plain_rule_on_random_logits() {
        // Lengths around the 16-lane chunks, few distinct values (ties), NaN, +-inf and +-0.
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let pick = [0.0, -0.0, 1.5, -2.0, 3.25, f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 1e30, -1e30];
        let mut differ = 0;
        for case in 0..4000 {
            let n = (next() % 70) as usize + if case % 50 == 0 { 128_000 } else { 0 };
            let rare = next() % 4 == 0;
            let v: Vec<f32> = (0..n)
                .map(|_| {
                    let r = next();
                    if rare {
                        pick[(r % pick.len() as u64) as usize]
                    } else {
                        (r % 1000) as f32 * 0.01 - 5.0
                    }
                })
                .collect();
            assert_eq!(super::argmax(&v), super::argmax_scalar(&v), "{v:?}");
            differ += usize::from(super::argmax(&v) != 0);
        }
        // Control: the cases are not all trivial (the answer is mostly past index 0).
        assert!(differ > 3000, "{differ}");
    }
}
