//! The arithmetic: a scored position's negative log-likelihood, the KL divergence against a
//! top-64 base, the top-1 agreement, and their sums.

use resin_core::{argmax, TopCandidates};

use crate::{QualityError, Result};

/// ln(sum(exp(x))) over `row` in f64 (NaN skipped): the normaliser of the row's softmax.
fn lse64(row: &[f32]) -> f64 {
    let m = resin_core::max_of(row, |x| !x.is_nan());
    if !m.is_finite() {
        return m as f64;
    }
    let s: f64 = row.iter().filter(|x| !x.is_nan()).map(|&x| (x as f64 - m as f64).exp()).sum();
    m as f64 + s.ln()
}

/// -ln p(target) under the softmax of `row`: the term `llama-perplexity` sums
/// (`max + ln(sum exp(x - max)) - x[target]`, the sum in double precision as there).
pub fn token_nll(row: &[f32], target: u32) -> Result<f64> {
    let x = *row.get(target as usize).ok_or(QualityError::BadToken { token: target, vocab: row.len() })?;
    Ok(lse64(row) - x as f64)
}

/// One scored position of a base: its TOP_CANDIDATES (64) largest logits, best first (the
/// sampler's order, ties by id), and the log-sum-exp of its whole row, so each kept logit's
/// log-probability is `logit - lse` without the row.
#[derive(Debug, Clone, PartialEq)]
pub struct TopRecord {
    pub lse: f64,
    pub top: Vec<(u32, f32)>,
}

impl TopRecord {
    /// The record of a whole logits row.
    pub fn of(row: &[f32]) -> TopRecord {
        TopRecord { lse: lse64(row), top: TopCandidates::of(row).top }
    }

    /// The base's most likely id: the largest logit kept, the first of equals (taken from the
    /// values, not the order, so a record whose pairs come in another order still answers).
    pub fn top_id(&self) -> Option<u32> {
        let mut best: Option<(u32, f32)> = None;
        for &(id, l) in &self.top {
            if best.is_none_or(|(_, b)| l > b) {
                best = Some((id, l));
            }
        }
        best.map(|(id, _)| id)
    }
}

/// KL(base || this run) at one position, from the base's top 64 alone.
///
/// The base keeps only its 64 most likely tokens and the log-sum-exp of its row, so both
/// distributions are taken over the same 65 outcomes: the base's 64 ids, each with its own
/// probability, and one "rest" bucket holding everything else (the base's rest is 1 minus its
/// 64 probabilities; this run's is 1 minus its probabilities of those same 64 ids, from its
/// whole row). KL = sum over the 64 of p ln(p / q) + p_rest ln(p_rest / q_rest). Merging
/// outcomes never raises a KL divergence, so this is a lower bound on the whole-vocabulary KL:
/// what it misses is the divergence inside the tail (how the two spread their rest mass over
/// the other ids), which is equal to zero when the two tails have the same shape and is
/// weighted by the base's rest mass, small where the top 64 hold most of the distribution.
pub fn kl_divergence(base: &TopRecord, row: &[f32]) -> Result<f64> {
    let lse = lse64(row);
    let (mut kl, mut p_sum, mut q_sum) = (0.0f64, 0.0f64, 0.0f64);
    for &(id, b) in &base.top {
        let x = *row.get(id as usize).ok_or(QualityError::BadToken { token: id, vocab: row.len() })?;
        let lp = b as f64 - base.lse;
        let lq = x as f64 - lse;
        let p = lp.exp();
        kl += p * (lp - lq);
        p_sum += p;
        q_sum += lq.exp();
    }
    // Rounding can take a sum a hair past 1: the bucket is then empty.
    let p_rest = (1.0 - p_sum).max(0.0);
    if p_rest > 0.0 {
        // This run's rest is never below the smallest normal: a base rest it calls impossible
        // counts as a very large divergence, not an infinite one.
        let q_rest = (1.0 - q_sum).max(f64::MIN_POSITIVE);
        kl += p_rest * (p_rest.ln() - q_rest.ln());
    }
    Ok(kl)
}

/// The value at `fraction` (0..=1) of ascending `sorted`, interpolated linearly between the
/// two nearest ranks, as `llama-perplexity`'s KL statistics take it. None for no values.
pub fn percentile(sorted: &[f64], fraction: f64) -> Option<f64> {
    let (first, last) = (*sorted.first()?, *sorted.last()?);
    if fraction <= 0.0 {
        return Some(first);
    }
    if fraction >= 1.0 {
        return Some(last);
    }
    let p = fraction * (sorted.len() - 1) as f64;
    let i = p as usize;
    let f = p - i as f64;
    let hi = sorted[(i + 1).min(sorted.len() - 1)];
    Some((1.0 - f) * sorted[i] + f * hi)
}

/// The figures of a measurement.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    /// exp(mean negative log-likelihood of the scored tokens).
    pub ppl: f64,
    /// Its standard error, as `llama-perplexity` prints it after "+/-".
    pub ppl_err: f64,
    /// Tokens scored.
    pub tokens: usize,
    /// Against a base: the mean and 99th percentile of the KL divergence (nats), and the share
    /// of positions whose most likely token is the base's.
    pub kld_mean: Option<f64>,
    pub kld_p99: Option<f64>,
    pub top1: Option<f64>,
}

/// The running sums over scored positions.
#[derive(Debug, Clone, Default)]
pub struct Meter {
    nll: f64,
    nll2: f64,
    count: usize,
    kld: Vec<f64>,
    same_top: usize,
}

impl Meter {
    pub fn new() -> Meter {
        Meter::default()
    }

    /// One scored position: its logits `row`, the token that came next, and the base's
    /// record of the same position where there is a base.
    pub fn add(&mut self, row: &[f32], target: u32, base: Option<&TopRecord>) -> Result<()> {
        let v = token_nll(row, target)?;
        if let Some(b) = base {
            self.kld.push(kl_divergence(b, row)?);
            if b.top_id().is_some_and(|id| id == argmax(row)) {
                self.same_top += 1;
            }
        }
        self.nll += v;
        self.nll2 += v * v;
        self.count += 1;
        Ok(())
    }

    /// Positions added so far.
    pub fn count(&self) -> usize {
        self.count
    }

    /// The figures so far (NaN perplexity before any position).
    pub fn report(&self) -> Report {
        let n = self.count as f64;
        let mean = self.nll / n;
        let ppl = mean.exp();
        // llama-perplexity's uncertainty: the standard error of the mean NLL, times the PPL.
        let var = self.nll2 / n - mean * mean;
        let ppl_err = if var > 0.0 && self.count > 1 { (var / (n - 1.0)).sqrt() * ppl } else { 0.0 };
        let (kld_mean, kld_p99, top1) = if self.kld.is_empty() {
            (None, None, None)
        } else {
            let mut sorted = self.kld.clone();
            sorted.sort_by(f64::total_cmp);
            let k = sorted.len() as f64;
            (Some(self.kld.iter().sum::<f64>() / k), percentile(&sorted, 0.99), Some(self.same_top as f64 / k))
        };
        Report { ppl, ppl_err, tokens: self.count, kld_mean, kld_p99, top1 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn softmax(row: &[f32]) -> Vec<f64> {
        let m = row.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
        let e: Vec<f64> = row.iter().map(|&x| (x as f64 - m).exp()).collect();
        let s: f64 = e.iter().sum();
        e.iter().map(|x| x / s).collect()
    }

    /// A row of `n` logits from a small generator (no dependency for random numbers).
    fn row(n: usize, seed: u64, scale: f32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * scale
            })
            .collect()
    }

    #[test]
    fn nll_is_minus_log_softmax() {
        let r = [1.0f32, 2.0, 3.0, -1.0];
        let p = softmax(&r);
        for t in 0..4 {
            assert!((token_nll(&r, t).unwrap() + p[t as usize].ln()).abs() < 1e-12);
        }
        assert!(matches!(token_nll(&r, 4), Err(QualityError::BadToken { token: 4, vocab: 4 })));
        // Large logits do not overflow.
        assert!((token_nll(&[1000.0, 1000.0], 0).unwrap() - 2f64.ln()).abs() < 1e-12);
    }

    #[test]
    fn perplexity_of_a_uniform_guess_is_the_vocabulary() {
        let mut m = Meter::new();
        for t in 0..10 {
            m.add(&[0.5; 7], t % 7, None).unwrap();
        }
        let r = m.report();
        assert!((r.ppl - 7.0).abs() < 1e-9, "{r:?}");
        assert_eq!(r.tokens, 10);
        assert_eq!((r.kld_mean, r.kld_p99, r.top1), (None, None, None));
    }

    #[test]
    fn kl_from_a_whole_top_is_the_exact_kl() {
        // A vocabulary of 50 fits in the top 64: the rest bucket is empty and the result is
        // the textbook KL.
        let base = row(50, 1, 8.0);
        let cur = row(50, 2, 8.0);
        let (p, q) = (softmax(&base), softmax(&cur));
        let exact: f64 = p.iter().zip(&q).map(|(p, q)| p * (p / q).ln()).sum();
        let got = kl_divergence(&TopRecord::of(&base), &cur).unwrap();
        assert!((got - exact).abs() < 1e-9, "{got} vs {exact}");
        assert!(exact > 0.01);
        // Against itself it is zero.
        assert!(kl_divergence(&TopRecord::of(&base), &base).unwrap().abs() < 1e-12);
    }

    #[test]
    fn kl_from_a_top_64_is_the_kl_over_65_outcomes() {
        let base = row(1000, 3, 12.0);
        let cur: Vec<f32> = base.iter().zip(row(1000, 4, 1.0)).map(|(a, b)| a + b).collect();
        let rec = TopRecord::of(&base);
        assert_eq!(rec.top.len(), 64);
        // Written out by hand: the 64 ids, then the rest bucket.
        let (p, q) = (softmax(&base), softmax(&cur));
        let ids: Vec<usize> = rec.top.iter().map(|&(id, _)| id as usize).collect();
        let mut want = 0.0;
        for &i in &ids {
            want += p[i] * (p[i] / q[i]).ln();
        }
        let p_rest = 1.0 - ids.iter().map(|&i| p[i]).sum::<f64>();
        let q_rest = 1.0 - ids.iter().map(|&i| q[i]).sum::<f64>();
        want += p_rest * (p_rest / q_rest).ln();
        let got = kl_divergence(&rec, &cur).unwrap();
        assert!((got - want).abs() < 1e-9, "{got} vs {want}");
        // The whole-vocabulary KL is at least as large (merging outcomes never raises it).
        let full: f64 = p.iter().zip(&q).map(|(p, q)| p * (p / q).ln()).sum();
        assert!(full >= got - 1e-12 && got > 0.0, "{full} {got}");
        // An id outside this run's row is an error, not a panic.
        assert!(kl_divergence(&rec, &cur[..10]).is_err());
    }

    #[test]
    fn top1_and_the_summary() {
        let a = [0.0f32, 5.0, 1.0];
        let b = [0.0f32, 1.0, 5.0];
        let mut m = Meter::new();
        m.add(&a, 1, Some(&TopRecord::of(&a))).unwrap();
        m.add(&b, 2, Some(&TopRecord::of(&a))).unwrap();
        let r = m.report();
        assert_eq!(r.top1, Some(0.5));
        // The base's top id comes from its values, whatever the order of its pairs.
        let mut shuffled = TopRecord::of(&a);
        shuffled.top.reverse();
        assert_eq!(shuffled.top_id(), Some(1));
        let mut m2 = Meter::new();
        m2.add(&a, 1, Some(&shuffled)).unwrap();
        assert_eq!(m2.report().top1, Some(1.0));
        let k = kl_divergence(&TopRecord::of(&a), &b).unwrap();
        assert!((r.kld_mean.unwrap() - k / 2.0).abs() < 1e-12);
        // p99 of [0, k]: 0.99 of the way to k.
        assert!((r.kld_p99.unwrap() - 0.99 * k).abs() < 1e-9);
    }

    #[test]
    fn percentile_interpolates_as_llama_perplexity() {
        let v = [1.0, 2.0, 3.0, 4.0, 5.0];
        assert_eq!(percentile(&v, 0.0), Some(1.0));
        assert_eq!(percentile(&v, 1.0), Some(5.0));
        assert_eq!(percentile(&v, 0.5), Some(3.0));
        assert!((percentile(&v, 0.99).unwrap() - 4.96).abs() < 1e-12);
        assert_eq!(percentile(&[], 0.5), None);
        assert_eq!(percentile(&[7.0], 0.99), Some(7.0));
    }
}
