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
    scratch: Vec<(u32, f32)>,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Self {
        let seed = params.seed.unwrap_or_else(|| {
            let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0);
            t ^ (std::process::id() as u64) << 32
        });
        Sampler { params, rng: Rng::new(seed), scratch: Vec::new() }
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Apply the penalties to `logits` given the tokens generated (and prompted) so far.
    /// Whether a sample is just the argmax of the raw logits (greedy, no penalties): then a
    /// home's on-device argmax id can stand in for the logits.
    pub fn is_plain_greedy(&self) -> bool {
        let p = &self.params;
        p.is_greedy() && p.repetition_penalty == 1.0 && p.presence_penalty == 0.0 && p.frequency_penalty == 0.0
    }

    pub fn apply_penalties(&self, logits: &mut [f32], history: &[u32]) {
        let p = &self.params;
        if p.repetition_penalty == 1.0 && p.presence_penalty == 0.0 && p.frequency_penalty == 0.0 {
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
    pub fn sample(&mut self, logits: &mut [f32], history: &[u32]) -> u32 {
        self.apply_penalties(logits, history);
        let p = &self.params;
        if p.is_greedy() {
            return argmax(logits);
        }
        let c = &mut self.scratch;
        c.clear();
        c.extend(logits.iter().enumerate().filter(|(_, l)| l.is_finite()).map(|(i, &l)| (i as u32, l)));
        if c.is_empty() {
            return argmax(logits);
        }
        // Sort descending by logit; ties by id so the order is total and reproducible.
        let k = if p.top_k > 0 { p.top_k.min(c.len()) } else { c.len() };
        let cmp = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        if k < c.len() {
            c.select_nth_unstable_by(k - 1, cmp);
            c.truncate(k);
        }
        c.sort_unstable_by(cmp);
        // Softmax at temperature.
        let max = c[0].1;
        let mut sum = 0f64;
        let probs: Vec<f64> = c
            .iter()
            .map(|&(_, l)| {
                let e = (((l - max) / p.temperature) as f64).exp();
                sum += e;
                e
            })
            .collect();
        let mut keep = probs.len();
        if p.min_p > 0.0 {
            let floor = probs[0] * p.min_p as f64;
            keep = probs.iter().take_while(|&&q| q >= floor).count().max(1);
        }
        if p.top_p < 1.0 {
            let mut acc = 0.0;
            let mut n = 0;
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
        let mut r = self.rng.next_f64() * total;
        for (i, &q) in probs[..keep].iter().enumerate() {
            if r < q {
                return c[i].0;
            }
            r -= q;
        }
        c[keep - 1].0
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
