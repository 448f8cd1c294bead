//! Token sampling: penalties, then temperature, top-k, top-p, min-p; seeded and reproducible.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SamplingParams {
    /// 0 means greedy.
    pub temperature: f32,
    /// 0 means off.
    pub top_k: usize,
    /// 1.0 means off.
    pub top_p: f32,
    /// 0.0 means off.
    pub min_p: f32,
    /// 1.0 means off (llama.cpp-style: positive logits divided, negative multiplied).
    pub repetition_penalty: f32,
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    /// Tokens of history the penalties look at (0: all).
    pub penalty_last_n: usize,
    pub seed: Option<u64>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            penalty_last_n: 64,
            seed: None,
        }
    }
}

impl SamplingParams {
    pub fn greedy() -> Self {
        Self::default()
    }
    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0
    }
    /// Whether any penalty moves logits (by the tokens so far) before the draw.
    pub fn has_penalties(&self) -> bool {
        self.repetition_penalty != 1.0 || self.presence_penalty != 0.0 || self.frequency_penalty != 0.0
    }
    /// Parameter ranges, checked before a request is accepted.
    pub fn validate(&self) -> Result<(), String> {
        let bad = |what: &str| Err(what.to_string());
        if !self.temperature.is_finite() || self.temperature < 0.0 || self.temperature > 100.0 {
            return bad("temperature must be between 0 and 100");
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad("top_p must be in (0, 1]");
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return bad("min_p must be in [0, 1]");
        }
        if !(self.repetition_penalty > 0.0 && self.repetition_penalty.is_finite()) {
            return bad("repetition_penalty must be positive");
        }
        if !(-2.0..=2.0).contains(&self.presence_penalty) || !(-2.0..=2.0).contains(&self.frequency_penalty) {
            return bad("presence_penalty and frequency_penalty must be in [-2, 2]");
        }
        Ok(())
    }
}

/// splitmix64-seeded xoshiro256**: small, fast, and the same stream on every platform.
#[derive(Debug, Clone)]
pub struct Rng([u64; 4]);

impl Rng {
    pub fn new(seed: u64) -> Self {
        let mut z = seed;
        let mut next = || {
            z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut x = z;
            x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            x ^ (x >> 31)
        };
        Rng([next(), next(), next(), next()])
    }
    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.0;
        let result = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }
    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

pub use resin_core::argmax;

/// A sampler for one stream.
#[derive(Debug, Clone)]
pub struct Sampler {
    params: SamplingParams,
    rng: Rng,
    scratch: Vec<Cand>,
    /// Each bin's weight and count (`BINS`).
    bins: Bins,
    /// One bin's candidates in order.
    kept: BinMembers,
    /// The candidates' scaled logits and weights (scratch of `sample`).
    cv: Vec<f32>,
    cw: Vec<f32>,
    /// Every logit's bin on the dense path (`BINS`: not a candidate, or cut by min_p).
    cbin: Vec<u16>,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Self {
        let seed = params.seed.unwrap_or_else(|| {
            let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0);
            t ^ (std::process::id() as u64) << 32
        });
        Sampler { params, rng: Rng::new(seed), scratch: Vec::new(), bins: Bins::default(), kept: BinMembers::default(), cv: Vec::new(), cw: Vec::new(), cbin: Vec::new() }
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Apply the penalties to `logits` given the tokens generated (and prompted) so far.
    /// Whether a sample is just the argmax of the raw logits (greedy, no penalties): then a
    /// home's on-device argmax id can stand in for the logits.
    pub fn is_plain_greedy(&self) -> bool {
        let p = &self.params;
        p.is_greedy() && !p.has_penalties()
    }

    /// Whether a draw depends only on the `n` largest finite logits (in `sample`'s order): a
    /// top_k of at most `n`, not greedy (the argmax keeps -0.0 and 0.0 apart by index, not
    /// by that order), no penalties (they move logits across the cut). Then a row holding
    /// only those, -inf elsewhere, draws what the whole row draws.
    pub fn draws_from_top(&self, n: usize) -> bool {
        let p = &self.params;
        !p.is_greedy() && p.top_k >= 1 && p.top_k <= n && !p.has_penalties()
    }

    pub fn apply_penalties(&self, logits: &mut [f32], history: &[u32]) {
        let p = &self.params;
        if !p.has_penalties() {
            return;
        }
        let window = if p.penalty_last_n == 0 { history } else { &history[history.len().saturating_sub(p.penalty_last_n)..] };
        let mut counts: std::collections::HashMap<u32, u32> = std::collections::HashMap::new();
        for &t in window {
            *counts.entry(t).or_insert(0) += 1;
        }
        for (&t, &c) in &counts {
            let Some(l) = logits.get_mut(t as usize) else { continue };
            if p.repetition_penalty != 1.0 {
                *l = if *l > 0.0 { *l / p.repetition_penalty } else { *l * p.repetition_penalty };
            }
            *l -= c as f32 * p.frequency_penalty + p.presence_penalty;
        }
    }

    /// Pick the next token. `logits` may be modified (penalties, masks).
    ///
    /// The candidates are the finite logits, cut to the `top_k` largest; in descending order
    /// (ties by id) their weights `exp((l - max) / temperature)`; `min_p` keeps those whose
    /// weight is at least `min_p` of the largest, `top_p` the shortest prefix whose share
    /// reaches `top_p`; one draw over what is kept, walked in that order.
    ///
    /// Nothing is sorted whole (a 128k vocabulary's sort costs several GPU steps a token:
    /// docs/lessons.md): the candidates fall into `BINS` slices of their logits' span, whose
    /// weights say which bin holds the top-p cut and the draw; only that bin is sorted and
    /// walked (`find_binned`). Where most logits are candidates and top_k cuts none (a high
    /// temperature over a flat distribution), the candidates are not even listed: every
    /// logit's weight and bin are computed in place, 8 at a time (`sample_dense`); both paths
    /// draw alike. Logits more than `WEIGHT_CUT` temperatures below the largest are not
    /// candidates: each weighs under e^-40 (4e-18), all of them together under 1e-12 of the
    /// draw.
    pub fn sample(&mut self, logits: &mut [f32], history: &[u32]) -> u32 {
        self.apply_penalties(logits, history);
        let p = &self.params;
        if p.is_greedy() {
            return argmax(logits);
        }
        let t = p.temperature;
        let max = max_finite(logits);
        if max == f32::NEG_INFINITY {
            return argmax(logits);
        }
        // The candidates: the finite logits within WEIGHT_CUT temperatures of the largest.
        let floor = max - WEIGHT_CUT * t;
        // Most logits candidates (a high temperature, a flat distribution) and no top_k cut:
        // every logit in place, no list (`sample_dense`).
        if (p.top_k == 0 || p.top_k >= logits.len()) && mostly_candidates(logits, floor, max) {
            let lmin = min_candidate(logits, floor, max);
            return self.sample_dense(logits, max, lmin);
        }
        self.sample_list(logits, max)
    }

    /// `sample` for a row of which only its largest logits are known, `top` (ids and logits,
    /// in any order; a `Need::Top` row's candidates), as if every other logit were -inf, without building
    /// that row: the same draw to the bit, since top_k's kept candidates are sorted before
    /// anything is summed. None, drawing nothing (the generator does not move), where the
    /// draw needs more than `top`: the sampler does not `draws_from_top(top.len())`, or no
    /// logit of `top` is finite (the whole row's rule is then its argmax, which the caller
    /// has from the home). Not for a row with constraints or penalties applied; there are
    /// none where `draws_from_top` holds.
    pub fn sample_top(&mut self, top: &[(u32, f32)]) -> Option<u32> {
        if !self.draws_from_top(top.len()) {
            return None;
        }
        let max = top.iter().fold(f32::NEG_INFINITY, |m, &(_, l)| if l.is_finite() && l > m { l } else { m });
        if max == f32::NEG_INFINITY {
            return None;
        }
        let floor = max - WEIGHT_CUT * self.params.temperature;
        self.scratch.clear();
        self.scratch.extend(top.iter().filter(|&&(_, l)| is_candidate(l, floor, max)).map(|&(id, l)| Cand::new(id, l)));
        // Not reached: the largest candidate is kept and drawn whenever the rest weigh nothing.
        let first = self.scratch.iter().min_by(|a, b| order(a, b)).map_or(0, Cand::id);
        Some(self.draw_candidates(max, || first))
    }

    /// `sample`'s rule over a list of the candidates (a few of many logits, or top_k's cut).
    fn sample_list(&mut self, logits: &[f32], max: f32) -> u32 {
        let p = &self.params;
        let t = p.temperature;
        let floor = max - WEIGHT_CUT * t;
        let c = &mut self.scratch;
        // The candidates from `from` (at least the floor) up.
        let gather = |c: &mut Vec<Cand>, from: f32| {
            c.clear();
            c.extend(logits.iter().enumerate().filter(|&(_, &l)| is_candidate(l, from, max)).map(|(i, &l)| Cand::new(i as u32, l)));
        };
        // A small top_k of many logits: only the candidates from a threshold that at least
        // top_k of them reach (they precede every other in the order, so top_k's cut is among
        // them); without one, every candidate.
        match (p.top_k > 0).then(|| top_k_threshold(logits, floor, max, p.top_k)).flatten() {
            Some(tau) => {
                gather(c, tau.max(floor));
                if c.len() < p.top_k {
                    gather(c, floor);
                }
            }
            None => gather(c, floor),
        }
        self.draw_candidates(max, || argmax(logits))
    }

    /// The draw over the candidates gathered in `scratch` (every finite logit from the floor
    /// below `max`, or at least top_k's cut of them, in any order): top_k, the weights, min_p,
    /// top_p and the draw. `fallback`: the pick should no candidate be kept (not reached).
    fn draw_candidates(&mut self, max: f32, fallback: impl FnOnce() -> u32) -> u32 {
        let p = &self.params;
        let t = p.temperature;
        let c = &mut self.scratch;
        if p.top_k > 0 && p.top_k < c.len() {
            c.select_nth_unstable_by(p.top_k - 1, order);
            c.truncate(p.top_k);
        }
        if p.top_k > 0 {
            // top_k's few in the order: the sums below then run in an order of the kept
            // candidates alone, not of what else the row held (a row of only its largest
            // logits, `draws_from_top`, draws the same to the bit).
            c.sort_unstable_by(order);
        }
        // The weights of what top_k kept, and their bins: BINS equal slices of the kept
        // logits' span, the largest in bin 0, so a bin's candidates all come before the next
        // bin's in the order.
        // The scaled logits, then their weights: two passes the compiler vectorizes.
        let (cv, cw) = (&mut self.cv, &mut self.cw);
        cv.clear();
        cv.extend(c.iter().map(|x| ((x.logit() - max) / t).clamp(-2.0 * WEIGHT_CUT, 0.0)));
        weights(cv, cw);
        for ((x, &v), &w) in c.iter_mut().zip(cv.iter()).zip(cw.iter()) {
            x.w = w;
            x.bin = v.to_bits(); // kept here until the span is known (below)
        }
        // top_p's share is of every candidate's weight, before min_p.
        let sum = sum_f64(cw);
        let lo = cv.iter().fold(0f32, |m, &v| if v < m { v } else { m });
        if p.min_p > 0.0 {
            // The largest weight is exp_neg(0) = 1 exactly: min_p (at most 1) keeps the weights
            // of at least min_p, the largest always among them.
            c.retain(|x| x.w >= p.min_p);
        }
        let scale = if lo < 0.0 { BINS as f32 / -lo } else { 0.0 };
        for x in c.iter_mut() {
            x.bin = ((-f32::from_bits(x.bin) * scale) as u32).min(BINS as u32 - 1);
        }
        // (One histogram for a few candidates: clearing and adding four costs more there.)
        let hist = if c.len() >= HIST * BINS { HIST } else { 1 };
        histogram(c.iter().map(|x| (x.w, x.bin as usize)), hist, &mut self.bins);
        cut_and_draw(&Pool::List(c), &self.bins, &mut self.kept, &mut self.rng, p.top_p, sum, fallback)
    }

    /// `sample`'s rule with every logit in place of a candidate list: each logit's weight
    /// (0 where it is not a candidate) and bin (`BINS` where it is not one or min_p cuts it)
    /// in one pass the compiler vectorizes, the bins' sums in another; a bin's members are
    /// found in the bin array when the cut or the draw lands in it. `lmin`: the smallest
    /// candidate logit (the span's end: the scaled logits are monotonic in the logits).
    fn sample_dense(&mut self, logits: &[f32], max: f32, lmin: f32) -> u32 {
        let p = &self.params;
        let t = p.temperature;
        let floor = max - WEIGHT_CUT * t;
        let lo = ((lmin - max) / t).clamp(-2.0 * WEIGHT_CUT, 0.0);
        let scale = if lo < 0.0 { BINS as f32 / -lo } else { 0.0 };
        let (w, bin) = (&mut self.cw, &mut self.cbin);
        let d = Dense { max, t, floor, scale, min_p: p.min_p };
        w.clear();
        w.resize(logits.len(), 0.0);
        bin.clear();
        bin.resize(logits.len(), 0);
        dense_weights(logits, d, w, bin);
        // top_p's share is of every candidate's weight, before min_p (the others weigh 0).
        let sum = sum_f64(w);
        histogram(w.iter().zip(bin.iter()).map(|(&x, &b)| (x, b as usize)), HIST, &mut self.bins);
        cut_and_draw(&Pool::Dense { logits, w, bin }, &self.bins, &mut self.kept, &mut self.rng, p.top_p, sum, || argmax(logits))
    }
}

/// Whether a logit is a candidate: finite and at least `floor` (`max` the largest finite
/// logit: NaN and -inf fail the first compare, +inf the second).
#[inline(always)]
fn is_candidate(l: f32, floor: f32, max: f32) -> bool {
    l >= floor && l <= max
}

/// A logit value that probably `k` or more candidates reach, from every `TOPK_STRIDE`th
/// logit (None where `k` is not small against the logits, or too few samples are
/// candidates). The caller checks how many reach it.
fn top_k_threshold(logits: &[f32], floor: f32, max: f32, k: usize) -> Option<f32> {
    if k.saturating_mul(8) > logits.len() {
        return None;
    }
    // The m-th largest sample: about TOPK_STRIDE x m logits reach it, k + 4 strides' worth.
    let m = k / TOPK_STRIDE + 4;
    let mut samples: Vec<f32> = logits.iter().step_by(TOPK_STRIDE).copied().filter(|&l| is_candidate(l, floor, max)).collect();
    if samples.len() < m {
        return None;
    }
    let (_, &mut tau, _) = samples.select_nth_unstable_by(m - 1, |a, b| b.total_cmp(a));
    Some(tau)
}

/// Every how many logits `top_k_threshold` samples one.
const TOPK_STRIDE: usize = 32;

/// Whether at least a quarter of `logits` look like candidates, by every 16th of them (which
/// path `sample` takes; both draw alike).
fn mostly_candidates(logits: &[f32], floor: f32, max: f32) -> bool {
    let seen = logits.iter().step_by(16).filter(|&&l| is_candidate(l, floor, max)).count();
    4 * seen >= logits.len().div_ceil(16)
}

/// The smallest candidate logit (+inf when none), 8 lanes at a time.
fn min_candidate(logits: &[f32], floor: f32, max: f32) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (checked just above).
        return unsafe { min_candidate_avx2(logits, floor, max) };
    }
    min_candidate_body(logits, floor, max)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn min_candidate_avx2(logits: &[f32], floor: f32, max: f32) -> f32 {
    min_candidate_body(logits, floor, max)
}

#[inline(always)]
fn min_candidate_body(logits: &[f32], floor: f32, max: f32) -> f32 {
    let mut lanes = [f32::INFINITY; 8];
    let chunks = logits.chunks_exact(8);
    let rest = chunks.remainder();
    for ch in chunks {
        for (m, &l) in lanes.iter_mut().zip(ch) {
            *m = if is_candidate(l, floor, max) && l < *m { l } else { *m };
        }
    }
    for &l in rest {
        lanes[0] = if is_candidate(l, floor, max) && l < lanes[0] { l } else { lanes[0] };
    }
    lanes.iter().fold(f32::INFINITY, |a, &b| if b < a { b } else { a })
}

/// What the dense pass needs of a draw.
#[derive(Clone, Copy)]
struct Dense {
    max: f32,
    t: f32,
    floor: f32,
    /// Bins per unit of scaled logit below the largest.
    scale: f32,
    min_p: f32,
}

/// The bins' weights and counts of (weight, bin) pairs (bin BINS: none), in `hist` (1 or a
/// power of two) interleaved histograms added at the end: neighbouring candidates often fall
/// in one bin, and one histogram's adds would wait on each other through memory.
fn histogram(pairs: impl Iterator<Item = (f32, usize)>, hist: usize, bins: &mut Bins) {
    const STRIDE: usize = BINS + 1;
    debug_assert!(hist.is_power_of_two());
    // A mask, not `k % hist`: a division a pair where hist is not a constant.
    let mask = hist - 1;
    bins.w.clear();
    bins.w.resize(hist * STRIDE, 0.0);
    bins.n.clear();
    bins.n.resize(hist * STRIDE, 0);
    let (bw, bn) = (&mut bins.w[..], &mut bins.n[..]);
    for (k, (x, b)) in pairs.enumerate() {
        let at = (k & mask) * STRIDE + b;
        bw[at] += f64::from(x);
        bn[at] += 1;
    }
    for h in 1..hist {
        for b in 0..BINS {
            bw[b] += bw[h * STRIDE + b];
            bn[b] += bn[h * STRIDE + b];
        }
    }
    bins.w.truncate(BINS);
    bins.n.truncate(BINS);
}

/// The top-p cut and the draw over the binned candidates of `pool` (`sum`: every
/// candidate's weight, before min_p). What is kept: every candidate of the bins before
/// `cut.0`, and the first `cut.1` of bin `cut.0` in the order (all of the last bin when
/// there is no top-p cut).
fn cut_and_draw(pool: &Pool<'_>, bins: &Bins, kept: &mut BinMembers, rng: &mut Rng, top_p: f32, sum: f64, fallback: impl FnOnce() -> u32) -> u32 {
    kept.bin = usize::MAX;
    let mut cut = (BINS - 1, usize::MAX);
    if top_p < 1.0 {
        let (b, i) = find_binned(pool, bins, kept, top_p as f64 * sum, true, cut);
        cut = (b, i + 1);
    }
    let total: f64 = bins.w[..cut.0].iter().sum::<f64>() + kept.of(pool, cut.0).iter().take(cut.1).map(|x| f64::from(x.w)).sum::<f64>();
    let r = rng.next_f64() * total;
    let (b, i) = find_binned(pool, bins, kept, r, false, cut);
    // find_binned names a candidate of a non-empty bin (bin 0 holds the largest logit).
    kept.of(pool, b).get(i).map_or_else(fallback, |x| x.id())
}

/// w[i]: logit i's weight (0 unless a candidate), bin[i]: its bin (BINS unless a candidate
/// that min_p keeps), with `sample`'s arithmetic; 8 lanes at a time where the CPU has AVX2
/// (the same operations, so the same bits). `w` and `bin` are as long as `logits`.
fn dense_weights(logits: &[f32], d: Dense, w: &mut [f32], bin: &mut [u16]) {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (checked just above).
        unsafe { dense_weights_avx2(logits, d, w, bin) };
        return;
    }
    dense_weights_body(logits, d, w, bin);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn dense_weights_avx2(logits: &[f32], d: Dense, w: &mut [f32], bin: &mut [u16]) {
    dense_weights_body(logits, d, w, bin);
}

#[inline(always)]
fn dense_weights_body(logits: &[f32], d: Dense, w: &mut [f32], bin: &mut [u16]) {
    for ((&l, wi), bi) in logits.iter().zip(w.iter_mut()).zip(bin.iter_mut()) {
        let ok = is_candidate(l, d.floor, d.max);
        let v = ((l - d.max) / d.t).clamp(-2.0 * WEIGHT_CUT, 0.0);
        let x = exp_neg(v);
        // ((-v * scale) as u32).min(BINS - 1), as the list path bins, without the saturating
        // cast's checks (which keep the loop from vectorizing): clamped first (a NaN to 0).
        let f = (-v * d.scale).max(0.0).min((BINS - 1) as f32);
        // SAFETY: f is in [0, BINS - 1], so it fits an i32.
        let b = unsafe { f.to_int_unchecked::<i32>() };
        *wi = if ok { x } else { 0.0 };
        *bi = if ok && x >= d.min_p { b as u16 } else { BINS as u16 };
    }
}

/// Where a draw's candidates are: a list, or every logit in place (`Sampler::sample_dense`).
enum Pool<'a> {
    List(&'a [Cand]),
    Dense { logits: &'a [f32], w: &'a [f32], bin: &'a [u16] },
}

/// Bins a sampling draw splits the candidates' span into (`Sampler::sample`).
const BINS: usize = 4096;
/// Histograms the bins' weights are gathered in, interleaved by candidate (`Sampler::sample`).
const HIST: usize = 4;

/// The sum of `w` in f64, in 8 interleaved partial sums (a loop the compiler vectorizes; one
/// running sum waits on each add).
fn sum_f64(w: &[f32]) -> f64 {
    let mut acc = [0f64; 8];
    let chunks = w.chunks_exact(8);
    let rest: f64 = chunks.remainder().iter().map(|&x| f64::from(x)).sum();
    for ch in chunks {
        for (a, &x) in acc.iter_mut().zip(ch) {
            *a += f64::from(x);
        }
    }
    acc.iter().sum::<f64>() + rest
}

/// One bin's candidates in the order (the last bin asked for; `bin` usize::MAX: none yet).
#[derive(Debug, Clone, Default)]
struct BinMembers {
    bin: usize,
    members: Vec<Cand>,
}

impl BinMembers {
    /// The candidates of bin `b` in the order: a scan and a sort of that bin only.
    fn of(&mut self, pool: &Pool<'_>, b: usize) -> &[Cand] {
        if self.bin != b {
            self.members.clear();
            match *pool {
                Pool::List(c) => self.members.extend(c.iter().filter(|x| x.bin as usize == b)),
                Pool::Dense { logits, w, bin } => {
                    // Blocks of 64 bins are tested whole (a compare the compiler vectorizes);
                    // only a block that holds b is walked.
                    let b16 = b as u16;
                    for (k, block) in bin.chunks(64).enumerate() {
                        if !block.iter().fold(false, |a, &x| a | (x == b16)) {
                            continue;
                        }
                        for (j, _) in block.iter().enumerate().filter(|&(_, &x)| x == b16) {
                            let i = k * 64 + j;
                            let mut c = Cand::new(i as u32, logits[i]);
                            c.w = w[i];
                            c.bin = b as u32;
                            self.members.push(c);
                        }
                    }
                }
            }
            self.members.sort_unstable_by(order);
            self.bin = b;
        }
        &self.members
    }
}

/// Where the cumulative weight in the order (a candidate's own included) first reaches
/// `target` (`inclusive`: is at least it; else is above it), within what `cut` keeps (see
/// `Sampler::sample`): (bin, index in the bin's order). The last kept candidate where none
/// reaches it (rounding: the bins' sums and the walk add in other orders).
fn find_binned(c: &Pool<'_>, bins: &Bins, kept: &mut BinMembers, target: f64, inclusive: bool, cut: (usize, usize)) -> (usize, usize) {
    let reached = |cum: f64| if inclusive { cum >= target } else { cum > target };
    let mut before = 0f64;
    let mut b = 0;
    while b < cut.0 && !reached(before + bins.w[b]) {
        before += bins.w[b];
        b += 1;
    }
    // None before the cut's bin reached it, and that bin is empty (the last bin, when every
    // candidate is in bin 0): the last non-empty bin holds the last kept candidate.
    if bins.n[b] == 0 {
        while b > 0 && bins.n[b] == 0 {
            b -= 1;
        }
        before = bins.w[..b].iter().sum(); // in the order the forward pass added them
    }
    let members = kept.of(c, b);
    let n = members.len().min(if b == cut.0 { cut.1 } else { usize::MAX });
    let mut cum = before;
    for (i, x) in members.iter().take(n).enumerate() {
        cum += f64::from(x.w);
        if reached(cum) {
            return (b, i);
        }
    }
    (b, n.saturating_sub(1))
}

/// Each bin's candidates' weight and count.
#[derive(Debug, Clone, Default)]
struct Bins {
    w: Vec<f64>,
    n: Vec<u32>,
}

/// The largest finite logit (-inf when none is).
fn max_finite(logits: &[f32]) -> f32 {
    resin_core::max_of(logits, f32::is_finite)
}

/// w[i] = exp_neg(v[i]), 8 lanes at a time where the CPU has AVX2 (the same operations in
/// the same order, so the same bits: no fused multiply-adds).
fn weights(v: &[f32], w: &mut Vec<f32>) {
    w.clear();
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (checked just above).
        unsafe { weights_avx2(v, w) };
        return;
    }
    w.extend(v.iter().map(|&x| exp_neg(x)));
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn weights_avx2(v: &[f32], w: &mut Vec<f32>) {
    w.extend(v.iter().map(|&x| exp_neg(x)));
}

/// e^x for x in [-80, 0] (a logit's weight), within 5e-7 relatively, in float and integer
/// arithmetic only, so a loop of it vectorizes (libm's f64 exp does not, and every logit of a
/// 128k vocabulary needs one a token: docs/lessons.md): x = n ln 2 + r with n the nearest
/// integer (by the 1.5 * 2^23 trick, its value in the sum's low bits) and ln 2 in two parts
/// (Cody-Waite: n ln2_hi is exact), e^r by its Taylor terms to the 7th (|r| <= ln 2 / 2:
/// (ln 2 / 2)^8 / 8! ~ 5e-9), times 2^n by the exponent bits.
#[inline(always)]
fn exp_neg(x: f32) -> f32 {
    const LN2_HI: f32 = 0.693_359_4; // 355 / 512: 9 bits, so n * LN2_HI is exact for |n| < 2^15
    const LN2_LO: f32 = -2.121_944_4e-4;
    const ROUND: f32 = 12_582_912.0; // 1.5 * 2^23: y + ROUND has round(y) in its low bits
    let t = x * std::f32::consts::LOG2_E + ROUND;
    let n = t.to_bits() as i32 - ROUND.to_bits() as i32;
    let nf = t - ROUND;
    let r = (x - nf * LN2_HI) - nf * LN2_LO;
    let mut p = 1.0 / 5040.0;
    p = p * r + 1.0 / 720.0;
    p = p * r + 1.0 / 120.0;
    p = p * r + 1.0 / 24.0;
    p = p * r + 1.0 / 6.0;
    p = p * r + 0.5;
    p = p * r + 1.0;
    p = p * r + 1.0;
    p * f32::from_bits(((n + 127) as u32) << 23)
}

/// Descending by logit; ties by id so the order is total and reproducible.
fn order(a: &Cand, b: &Cand) -> std::cmp::Ordering {
    a.key.cmp(&b.key)
}

/// Logits this many temperatures below the largest are not sampling candidates (`sample`).
const WEIGHT_CUT: f32 = 40.0;

/// A sampling candidate: its place in the order as one integer (below) and its weight.
#[derive(Debug, Clone, Copy)]
struct Cand {
    key: u64,
    w: f32,
    /// Its bin in the draw's split of the candidates' span (`BINS`).
    bin: u32,
}

impl Cand {
    /// Ascending keys are the order: the logit descending (its bits made monotonic, then
    /// inverted) in the high half, the id ascending in the low half. One integer compare
    /// where a float compare and a tie-break were (top_k's selection, a bin's sort).
    fn new(id: u32, logit: f32) -> Cand {
        Cand { key: (u64::from(resin_core::candidate_key(logit)) << 32) | u64::from(id), w: 0.0, bin: 0 }
    }
    fn id(&self) -> u32 {
        self.key as u32
    }
    /// The logit `new` was given (its bits back from the key's high half).
    fn logit(&self) -> f32 {
        resin_core::candidate_logit((self.key >> 32) as u32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn logits() -> Vec<f32> {
        (0..100).map(|i| ((i * 37) % 101) as f32 / 10.0).collect()
    }

    #[test]
    fn greedy_is_argmax() {
        let mut s = Sampler::new(SamplingParams::greedy());
        let mut l = logits();
        let want = argmax(&l);
        assert_eq!(s.sample(&mut l, &[]), want);
        let max = l.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        assert_eq!(l[want as usize], max);
        assert!(l.iter().filter(|&&v| v == max).count() == 1, "the test logits have one maximum");
    }

    #[test]
    fn same_seed_same_tokens_and_different_seed_differs() {
        let params = |seed| SamplingParams { temperature: 1.5, seed: Some(seed), ..Default::default() };
        let run = |seed| {
            let mut s = Sampler::new(params(seed));
            (0..64).map(|_| s.sample(&mut logits(), &[])).collect::<Vec<_>>()
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
    }

    #[test]
    fn top_k_one_and_tiny_top_p_are_greedy() {
        let want = argmax(&logits());
        for params in [
            SamplingParams { temperature: 2.0, top_k: 1, seed: Some(1), ..Default::default() },
            SamplingParams { temperature: 2.0, top_p: 1e-6, seed: Some(1), ..Default::default() },
            SamplingParams { temperature: 2.0, min_p: 1.0, seed: Some(1), ..Default::default() },
        ] {
            let mut s = Sampler::new(params);
            for _ in 0..20 {
                assert_eq!(s.sample(&mut logits(), &[]), want);
            }
        }
    }

    #[test]
    fn top_k_limits_the_candidates() {
        let mut l = logits();
        let mut order: Vec<u32> = (0..l.len() as u32).collect();
        order.sort_by(|&a, &b| l[b as usize].total_cmp(&l[a as usize]));
        let top3 = &order[..3];
        let mut s = Sampler::new(SamplingParams { temperature: 5.0, top_k: 3, seed: Some(3), ..Default::default() });
        let mut seen = std::collections::HashSet::new();
        for _ in 0..200 {
            let t = s.sample(&mut l.clone(), &[]);
            assert!(top3.contains(&t), "{t} not in top 3");
            seen.insert(t);
        }
        assert_eq!(seen.len(), 3, "at temperature 5 all three candidates appear");
        l.clear();
    }

    /// The sampler as it was written first (every candidate sorted), the rule `sample` keeps
    /// (with its weight function, `exp_neg`).
    fn reference_sample(p: &SamplingParams, rng: &mut Rng, logits: &[f32]) -> u32 {
        let mut c: Vec<(u32, f32)> = logits.iter().enumerate().filter(|(_, l)| l.is_finite()).map(|(i, &l)| (i as u32, l)).collect();
        let k = if p.top_k > 0 { p.top_k.min(c.len()) } else { c.len() };
        let cmp = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        c.sort_by(cmp);
        c.truncate(k);
        let max = c[0].1;
        let probs: Vec<f64> = c.iter().map(|&(_, l)| f64::from(exp_neg(((l - max) / p.temperature).clamp(-80.0, 0.0)))).collect();
        let sum: f64 = probs.iter().sum();
        let mut keep = probs.len();
        if p.min_p > 0.0 {
            keep = probs.iter().take_while(|&&q| q >= probs[0] * p.min_p as f64).count().max(1);
        }
        if p.top_p < 1.0 {
            let (mut acc, mut n) = (0.0, 0);
            for &q in &probs[..keep] {
                acc += q / sum;
                n += 1;
                if acc >= p.top_p as f64 {
                    break;
                }
            }
            keep = n.max(1);
        }
        let total: f64 = probs[..keep].iter().sum();
        let mut r = rng.next_f64() * total;
        for (i, &q) in probs[..keep].iter().enumerate() {
            if r < q {
                return c[i].0;
            }
            r -= q;
        }
        c[keep - 1].0
    }

    #[test]
    fn sample_draws_what_sorting_every_candidate_draws() {
        // The same draws (one seed for both) give the same tokens: the bins change
        // the work, not the rule. Logits within 40 temperatures of the largest (the cut is
        // checked below), vocabularies from 1 to 128k, ties, -inf and NaN, each filter alone
        // and together.
        let mut g = Rng::new(99);
        let mut deep = 0;
        for case in 0..1500 {
            let n = if case % 100 == 0 { 128_256 } else { 1 + (g.next_u64() % 3000) as usize };
            let t = [0.3f32, 0.7, 1.0, 2.0][case % 4];
            let spread = (g.next_f64() * 30.0) as f32 * t;
            let mut l: Vec<f32> = (0..n).map(|_| (g.next_f64() as f32 * spread * 8.0).round() / 8.0).collect();
            if case % 7 == 0 {
                l[0] = f32::NEG_INFINITY;
            }
            if case % 11 == 0 && n > 1 {
                l[n - 1] = f32::NAN;
            }
            let p = SamplingParams {
                temperature: t,
                top_k: [0, 1, 5, 40, 100_000][case % 5],
                top_p: [1.0, 0.9, 0.5, 0.999][(case / 5) % 4],
                min_p: [0.0, 0.0, 0.05, 0.2][(case / 3) % 4],
                seed: Some(case as u64),
                ..Default::default()
            };
            if l.iter().all(|x| !x.is_finite()) {
                continue;
            }
            let mut s = Sampler::new(p.clone());
            let mut rng = Rng::new(case as u64);
            for _ in 0..4 {
                let want = reference_sample(&p, &mut rng, &l);
                let got = s.sample(&mut l.clone(), &[]);
                assert_eq!(got, want, "case {case}: n {n}, {p:?}");
                deep += usize::from(l[got as usize] < l.iter().copied().filter(|x| x.is_finite()).fold(f32::NEG_INFINITY, f32::max) - t);
            }
        }
        // Control: many draws land past the largest logits (the walk goes deep into the order).
        assert!(deep > 250, "{deep}");
    }

    #[test]
    fn the_dense_and_the_list_paths_draw_alike() {
        // Logits where most are candidates (the dense path's case): each path with the same
        // seed draws the same tokens, over temperatures, top_p and min_p; and the list path
        // alone on the same logits, so both paths run here whatever `sample` picks.
        let mut g = Rng::new(7);
        let mut differ = 0;
        for case in 0..60 {
            let n = [50usize, 1000, 20_000, 131_072][case % 4];
            let t = [0.5f32, 1.0, 1.5][case % 3];
            let l: Vec<f32> = (0..n).map(|_| (g.next_f64() as f32 * 20.0 * t * 16.0).round() / 16.0).collect();
            let p = SamplingParams { temperature: t, top_p: [1.0, 0.9, 0.5][(case / 3) % 3], min_p: [0.0, 0.1][case % 2], seed: Some(case as u64), ..Default::default() };
            let max = max_finite(&l);
            let floor = max - WEIGHT_CUT * t;
            assert!(l.iter().all(|&x| is_candidate(x, floor, max)) && mostly_candidates(&l, floor, max));
            let lmin = min_candidate(&l, floor, max);
            assert_eq!(lmin, l.iter().copied().fold(f32::INFINITY, f32::min));
            let (mut a, mut b) = (Sampler::new(p.clone()), Sampler::new(p.clone()));
            let mut first = None;
            for _ in 0..8 {
                let (x, y) = (a.sample_dense(&l, max, lmin), b.sample_list(&l, max));
                assert_eq!(x, y, "case {case}: {p:?}");
                differ += usize::from(first.is_some_and(|f| f != x));
                first.get_or_insert(x);
            }
        }
        // Control: the draws vary (the paths agree on more than one token).
        assert!(differ > 100, "{differ}");
    }

    #[test]
    fn top_k_from_a_threshold_draws_as_from_every_candidate() {
        // Large vocabularies, small top_k: the threshold path's draws against the reference
        // (every candidate sorted), on flat and on peaked logits (a few far above the rest,
        // so the samples miss most of the top: the threshold must fall back or still hold).
        let mut g = Rng::new(11);
        let mut hit = 0;
        for case in 0..24 {
            let n = [20_000usize, 50_000][case % 2];
            let peaked = case % 3 == 0;
            let mut l: Vec<f32> = (0..n).map(|_| (g.next_f64() as f32 * 10.0 * 8.0).round() / 8.0).collect();
            if peaked {
                for j in 0..30 {
                    l[(j * 977 + case) % n] = 30.0 + j as f32 * 0.25;
                }
            }
            let k = [1usize, 5, 40, 100][case % 4];
            let p = SamplingParams { temperature: [0.7f32, 1.0, 2.0][case % 3], top_k: k, top_p: [1.0, 0.9][case % 2], seed: Some(case as u64), ..Default::default() };
            let max = max_finite(&l);
            let floor = max - WEIGHT_CUT * p.temperature;
            if let Some(tau) = top_k_threshold(&l, floor, max, k) {
                hit += usize::from(l.iter().filter(|&&x| x >= tau && is_candidate(x, floor, max)).count() >= k);
            }
            let mut s = Sampler::new(p.clone());
            let mut rng = Rng::new(case as u64);
            for _ in 0..4 {
                let want = reference_sample(&p, &mut rng, &l);
                assert_eq!(s.sample(&mut l.clone(), &[]), want, "case {case}: n {n}, peaked {peaked}, {p:?}");
            }
        }
        // Control: the threshold served most cases (the test ran the path it is for).
        assert!(hit >= 16, "{hit}");
        // No threshold where k is not small against the vocabulary.
        assert_eq!(top_k_threshold(&[1.0; 100], 0.0, 1.0, 40), None);
    }

    /// The `n` largest finite logits of `l` in the sampler's order (ids and logits, as
    /// a `Need::Top` row lists them).
    fn top_list(l: &[f32], n: usize) -> Vec<(u32, f32)> {
        let mut c: Vec<Cand> = l.iter().enumerate().filter(|(_, x)| x.is_finite()).map(|(i, &x)| Cand::new(i as u32, x)).collect();
        c.sort_unstable_by(order);
        c.iter().take(n).map(|x| (x.id(), l[x.id() as usize])).collect()
    }

    /// `l`'s `n` largest finite logits, -inf elsewhere.
    fn top_row(l: &[f32], n: usize) -> Vec<f32> {
        let mut row = vec![f32::NEG_INFINITY; l.len()];
        for (id, x) in top_list(l, n) {
            row[id as usize] = x;
        }
        row
    }

    #[test]
    fn a_candidate_keeps_its_logit() {
        for x in [0.0f32, -0.0, 1.5, -1.5, f32::MIN_POSITIVE, -f32::MAX, f32::MAX, 1e-42, -1e-42] {
            assert_eq!(Cand::new(7, x).logit().to_bits(), x.to_bits(), "{x}");
        }
    }

    #[test]
    fn a_row_of_its_largest_logits_draws_what_the_whole_row_draws() {
        // Samplers with a top_k up to 64 and no penalties (`draws_from_top`), on flat, tied
        // and peaked rows of a large vocabulary: 8 draws each from the whole row and from its
        // top 64, same seed, the same ids. Control: a top 32 under a top_k of 64 draws
        // otherwise somewhere.
        let mut g = Rng::new(23);
        let mut control_differs = false;
        for case in 0..36 {
            let n = 60_000usize;
            let mut l: Vec<f32> = (0..n).map(|_| (g.next_f64() as f32 * 12.0 * 4.0).round() / 4.0).collect();
            if case % 3 == 0 {
                for j in 0..50 {
                    l[(j * 1181 + case) % n] = 20.0 + (j % 9) as f32 * 0.5;
                }
            }
            l[5] = f32::NAN;
            let k = [1usize, 5, 40, 64][case % 4];
            let p = SamplingParams {
                temperature: [0.7f32, 1.0, 3.0][case % 3],
                top_k: k,
                top_p: [1.0, 0.9, 0.95][case % 3],
                min_p: [0.0, 0.05][case % 2],
                seed: Some(case as u64),
                ..Default::default()
            };
            let s0 = Sampler::new(p.clone());
            assert!(s0.draws_from_top(64));
            let (mut whole, mut top, mut listed) = (s0.clone(), s0.clone(), s0.clone());
            let cut = top_row(&l, 64);
            // The list as the device gives it, and shuffled: `sample_top` takes any order.
            let mut list = top_list(&l, 64);
            if case % 2 == 1 {
                list.reverse();
                list.rotate_left(case % 7);
            }
            for d in 0..8 {
                let want = whole.sample(&mut l.clone(), &[]);
                assert_eq!(top.sample(&mut cut.clone(), &[]), want, "case {case} draw {d}: {p:?}");
                assert_eq!(listed.sample_top(&list), Some(want), "case {case} draw {d} from the list: {p:?}");
            }
            if k == 64 {
                let mut a = s0.clone();
                let mut b = s0.clone();
                let short = top_list(&l, 32);
                control_differs |= (0..8).any(|_| Some(a.sample(&mut l.clone(), &[])) != b.sample_top(&short));
            }
        }
        assert!(control_differs, "control: a top 32 must draw otherwise than the whole row somewhere");
        // Greedy, penalties and a top_k past the cut (or none) do not draw from the top alone.
        assert!(!Sampler::new(SamplingParams { temperature: 0.0, top_k: 40, ..Default::default() }).draws_from_top(64));
        assert!(!Sampler::new(SamplingParams { temperature: 1.0, top_k: 40, repetition_penalty: 1.1, ..Default::default() }).draws_from_top(64));
        assert!(!Sampler::new(SamplingParams { temperature: 1.0, top_k: 65, ..Default::default() }).draws_from_top(64));
        assert!(!Sampler::new(SamplingParams { temperature: 1.0, top_k: 0, ..Default::default() }).draws_from_top(64));
        assert!(Sampler::new(SamplingParams { temperature: 1.0, top_k: 64, ..Default::default() }).draws_from_top(64));
        // ... and `sample_top` declines them, as it does a list with no finite logit, and
        // a top_k longer than the list.
        let list = [(3u32, 1.0f32), (9, 0.5)];
        assert_eq!(Sampler::new(SamplingParams { temperature: 0.0, top_k: 1, ..Default::default() }).sample_top(&list), None);
        assert_eq!(Sampler::new(SamplingParams { temperature: 1.0, top_k: 2, repetition_penalty: 1.1, ..Default::default() }).sample_top(&list), None);
        assert_eq!(Sampler::new(SamplingParams { temperature: 1.0, top_k: 3, ..Default::default() }).sample_top(&list), None);
        assert_eq!(Sampler::new(SamplingParams { temperature: 1.0, top_k: 2, ..Default::default() }).sample_top(&[(3, f32::NAN), (9, f32::NEG_INFINITY)]), None);
        // A row with no finite logit (whose top list is empty) draws its argmax, the id the
        // engine takes from the home where `sample_top` declines; the generator stays put.
        let mut none = vec![f32::NEG_INFINITY; 100];
        none[5] = f32::INFINITY;
        none[7] = f32::NAN;
        let s = Sampler::new(SamplingParams { temperature: 1.0, top_k: 40, seed: Some(3), ..Default::default() });
        let (mut a, mut b) = (s.clone(), s.clone());
        assert_eq!(a.sample(&mut none.clone(), &[]), resin_core::argmax(&none));
        assert_eq!(resin_core::argmax(&none), 5);
        assert_eq!(b.sample_top(&[]), None);
        let row: Vec<f32> = (0..40).map(|i| (i % 7) as f32 * 0.1).collect();
        let draws = |x: &mut Sampler| (0..8).map(|_| x.sample(&mut row.clone(), &[])).collect::<Vec<u32>>();
        assert_eq!(draws(&mut b), draws(&mut a), "a declined sample_top leaves the generator where it was");
        assert_eq!(Sampler::new(SamplingParams { temperature: 1.0, top_k: 1, ..Default::default() }).sample_top(&list), Some(3));
    }

    #[test]
    fn candidates_are_the_finite_logits_from_the_floor() {
        let l = [1.0, f32::NAN, f32::NEG_INFINITY, f32::INFINITY, -3.0, 0.5, 2.0, 0.75, 1.5];
        assert_eq!(l.iter().filter(|&&x| is_candidate(x, 0.5, 2.0)).count(), 5);
        assert_eq!(min_candidate(&l, 0.5, 2.0), 0.5);
        assert_eq!(min_candidate(&l, 0.8, 2.0), 1.0);
        assert_eq!(min_candidate(&l, 2.5, 2.0), f32::INFINITY);
        // A quarter of every 16th: 2 of 5 sampled candidates pass, 1 of 5 does not.
        let mut m = vec![-9.0f32; 80];
        m[0] = 1.0;
        assert!(!mostly_candidates(&m, 0.0, 1.0));
        m[16] = 1.0;
        assert!(mostly_candidates(&m, 0.0, 1.0));
    }

    #[test]
    fn exp_neg_is_within_5e_7_of_exp() {
        let mut worst = 0f64;
        for i in 0..=800_000 {
            let x = -(i as f32) * 1e-4;
            let e = (x as f64).exp();
            worst = worst.max((f64::from(exp_neg(x)) - e).abs() / e);
        }
        assert!(worst < 5e-7, "{worst}");
        // Control: f32's own rounding is visible at this bar (the bar is not vacuous).
        assert!(worst > 1e-8, "{worst}");
        assert_eq!(exp_neg(0.0), 1.0);
    }

    #[test]
    fn the_weights_pass_is_exp_neg_bit_for_bit() {
        // Whatever lanes `weights` takes on this CPU, each weight is the scalar exp_neg's bits.
        let v: Vec<f32> = (0..100_003).map(|i| -(i as f32) * 8e-4 - if i % 7 == 0 { 1e-6 } else { 0.0 }).collect();
        let mut w = vec![1.0; 5];
        weights(&v, &mut w);
        assert_eq!(w.len(), v.len());
        for (i, (&x, &y)) in v.iter().zip(&w).enumerate() {
            assert_eq!(y.to_bits(), exp_neg(x).to_bits(), "{i}: {x}");
        }
        // sum_f64 against a plain running sum: equal within f64 rounding of the order.
        let plain: f64 = w.iter().map(|&x| f64::from(x)).sum();
        assert!((sum_f64(&w) - plain).abs() <= 1e-12 * plain, "{} {plain}", sum_f64(&w));
        assert_eq!(sum_f64(&[]), 0.0);
        assert_eq!(sum_f64(&[0.5; 9]), 4.5);
    }

    #[test]
    fn equal_logits_share_the_draws_and_top_p_keeps_the_first_ids() {
        // Every candidate in one bin (a span of zero); ties ordered by id.
        let l = vec![1.5f32; 5];
        let mut s = Sampler::new(SamplingParams { temperature: 1.0, seed: Some(11), ..Default::default() });
        let mut seen = [0usize; 5];
        for _ in 0..2000 {
            seen[s.sample(&mut l.clone(), &[]) as usize] += 1;
        }
        assert!(seen.iter().all(|&k| (300..500).contains(&k)), "{seen:?}");
        // top_p 0.5 of five equal weights: the first three ids (0.6 is the first share >= 0.5).
        let mut s = Sampler::new(SamplingParams { temperature: 1.0, top_p: 0.5, seed: Some(11), ..Default::default() });
        let mut seen = [0usize; 5];
        for _ in 0..600 {
            seen[s.sample(&mut l.clone(), &[]) as usize] += 1;
        }
        assert!(seen[..3].iter().all(|&k| k > 100) && seen[3..] == [0, 0], "{seen:?}");
    }

    #[test]
    fn logits_far_below_the_largest_are_not_drawn() {
        // One logit 40 temperatures above 100k others: only it is a candidate; a vocabulary
        // one step under the cut is still drawn from.
        let mut l = vec![0.0f32; 100_000];
        l[777] = 40.5;
        let mut s = Sampler::new(SamplingParams { temperature: 1.0, seed: Some(5), ..Default::default() });
        assert!((0..50).all(|_| s.sample(&mut l.clone(), &[]) == 777));
        l[777] = 10.0;
        assert!((0..50).any(|_| s.sample(&mut l.clone(), &[]) != 777));
    }

    #[test]
    fn penalties_move_logits() {
        let s = Sampler::new(SamplingParams { repetition_penalty: 2.0, presence_penalty: 0.5, frequency_penalty: 0.25, ..Default::default() });
        let mut l = vec![4.0, -4.0, 1.0];
        s.apply_penalties(&mut l, &[0, 0, 1]);
        assert_eq!(l, vec![4.0 / 2.0 - 0.5 - 0.5, -8.0 - 0.5 - 0.25, 1.0]);
    }

    #[test]
    fn validate_rejects_out_of_range() {
        assert!(SamplingParams { temperature: -1.0, ..Default::default() }.validate().is_err());
        assert!(SamplingParams { top_p: 0.0, ..Default::default() }.validate().is_err());
        assert!(SamplingParams::default().validate().is_ok());
    }
}
