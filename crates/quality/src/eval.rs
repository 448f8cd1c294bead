//! The measurement over a home: each window's first half and its first scored position in one
//! prefill, the other scored positions in steps of up to NROW_MAX rows of the same region (a
//! home's prefill returns only a segment's last row; a step returns every row's logits, and
//! rows of one region at consecutive positions see each other causally).

use resin_core::{Home, RegionId, Row, Segment, StepAll, NROW_MAX};

use crate::{BaseFile, Meter, Plan, QualityError, Report, Result, TopRecord};

/// What [`evaluate`] found.
#[derive(Debug, Clone)]
pub struct Evaluation {
    pub report: Report,
    /// Each scored position's record, in scoring order, where they were asked for (to save as
    /// a base).
    pub records: Option<Vec<TopRecord>>,
}

/// Score `tokens` (the whole text's, BOS first where the model adds one) as `plan` cuts it, on
/// `home` (region 0, at least `plan.ctx` positions). Against `base` (whose header the caller
/// has checked against this run) the KL divergence and the top-1 agreement too; `keep`: return
/// every position's record. `progress(windows_done)` after each window.
pub fn evaluate(home: &mut dyn Home, tokens: &[u32], plan: &Plan, base: Option<&BaseFile>, keep: bool, progress: &mut dyn FnMut(usize)) -> Result<Evaluation> {
    let spec = home.spec().clone();
    if spec.n_ctx < plan.ctx {
        return Err(QualityError::Home(resin_core::HomeError::Unsupported(format!("the home holds {} positions a session, the windows need {}", spec.n_ctx, plan.ctx))));
    }
    let covered = plan.covered(tokens)?;
    if let Some(&t) = covered.iter().chain(plan.bos.iter()).find(|&&t| t as usize >= spec.vocab) {
        return Err(QualityError::BadToken { token: t, vocab: spec.vocab });
    }
    if let Some(b) = base {
        if b.records.len() != plan.scored() {
            return Err(QualityError::BaseMismatch(format!("the base holds {} positions, this run scores {}", b.records.len(), plan.scored())));
        }
    }
    let region = RegionId(0);
    let rows_max = spec.step_rows_max.clamp(1, NROW_MAX);
    let (ctx, first) = (plan.ctx, plan.first());
    let mut meter = Meter::new();
    let mut records = keep.then(|| Vec::with_capacity(plan.scored()));
    let mut score = |row: &[f32], target: u32| -> Result<()> {
        if row.len() != spec.vocab {
            return Err(QualityError::BadRow { got: row.len(), vocab: spec.vocab });
        }
        let b = base.map(|b| &b.records[meter.count()]);
        meter.add(row, target, b)?;
        if let Some(r) = records.as_mut() {
            r.push(TopRecord::of(row));
        }
        Ok(())
    };
    for chunk in 0..plan.chunks {
        let w = plan.window(tokens, chunk)?;
        // The targets are the text's tokens; only slot 0 differs from them (BOS), and it is
        // never a target.
        let logits = home.prefill(&[Segment { region, start: 0, tokens: &w[..=first] }])?;
        if logits.rows() != 1 {
            return Err(QualityError::BadRow { got: logits.data.len(), vocab: spec.vocab });
        }
        score(logits.row(0), w[first + 1])?;
        let mut pos = first + 1;
        while pos < ctx - 1 {
            let n = rows_max.min(ctx - 1 - pos);
            let rows: Vec<Row> = (pos..pos + n).map(|p| Row { region, token: w[p], pos: p as u32 }).collect();
            let out = home.step_logits(&rows)?;
            if out.rows() != n {
                return Err(QualityError::BadRow { got: out.data.len(), vocab: spec.vocab * n });
            }
            for i in 0..n {
                score(out.row(i), w[pos + i + 1])?;
            }
            pos += n;
        }
        progress(chunk + 1);
    }
    Ok(Evaluation { report: meter.report(), records })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use resin_core::{check_segments, check_step, Counters, HomeSpec, KvCodec, Logits, Need, RowOut, StepOut};

    use super::*;
    use crate::{token_nll, BaseHeader};

    const VOCAB: usize = 37;

    /// A causal toy model: a position's logits are a function of every token at or before it
    /// in its region (a hash of the history), so feeding a token at the wrong position, a
    /// stale history or a missing BOS changes what is scored.
    struct ToyHome {
        spec: HomeSpec,
        history: Vec<u32>,
        counters: Arc<Counters>,
        seed: u64,
    }

    fn toy_logits(history: &[u32], seed: u64) -> Vec<f32> {
        let mut h: u64 = seed;
        for &t in history {
            h = (h ^ t as u64).wrapping_mul(0x100000001b3);
        }
        (0..VOCAB as u64)
            .map(|j| {
                let x = (h ^ j.wrapping_mul(0x9E3779B97F4A7C15)).wrapping_mul(0xff51afd7ed558ccd);
                ((x >> 40) as f32 / (1u64 << 24) as f32) * 6.0
            })
            .collect()
    }

    impl ToyHome {
        fn new(n_ctx: usize, rows: usize, seed: u64) -> ToyHome {
            let spec = HomeSpec { kind: "toy", vocab: VOCAB, n_ctx, regions: 1, codec: KvCodec::F32, step_rows_max: rows, chunk_rows_min: 1 };
            ToyHome { spec, history: vec![u32::MAX; n_ctx], counters: Arc::new(Counters::default()), seed }
        }
    }

    impl Home for ToyHome {
        fn spec(&self) -> &HomeSpec {
            &self.spec
        }
        fn prefill(&mut self, segments: &[Segment<'_>]) -> resin_core::Result<Logits> {
            check_segments(&self.spec, segments)?;
            let mut data = Vec::new();
            for s in segments {
                for (i, &t) in s.tokens.iter().enumerate() {
                    self.history[s.start as usize + i] = t;
                }
                let last = s.start as usize + s.tokens.len() - 1;
                data.extend(toy_logits(&self.history[..=last], self.seed));
            }
            Ok(Logits { vocab: VOCAB, data })
        }
        fn step(&mut self, rows: &[Row], needs: &[Need]) -> resin_core::Result<StepOut> {
            check_step(&self.spec, rows, needs)?;
            for r in rows {
                self.history[r.pos as usize] = r.token;
            }
            let rows = rows.iter().zip(needs).map(|(r, &n)| RowOut::from_logits(n, &toy_logits(&self.history[..=r.pos as usize], self.seed))).collect();
            Ok(StepOut { rows })
        }
        fn counters(&self) -> &Arc<Counters> {
            &self.counters
        }
        fn save_region(&mut self, _: RegionId, _: usize) -> resin_core::Result<Vec<u8>> {
            Err(resin_core::HomeError::Unsupported("toy".into()))
        }
        fn load_region(&mut self, _: RegionId, _: usize, _: &[u8]) -> resin_core::Result<()> {
            Err(resin_core::HomeError::Unsupported("toy".into()))
        }
    }

    /// llama-perplexity's loop written out plainly: every window from an empty cache, BOS in
    /// slot 0, the logits of positions ctx/2 ..= ctx-2 against the next token.
    fn reference_ppl(tokens: &[u32], ctx: usize, chunks: usize, bos: Option<u32>, seed: u64) -> f64 {
        let (mut nll, mut count) = (0.0, 0);
        for c in 0..chunks {
            let mut w = tokens[c * ctx..(c + 1) * ctx].to_vec();
            if let Some(b) = bos {
                w[0] = b;
            }
            for p in ctx / 2..ctx - 1 {
                nll += token_nll(&toy_logits(&w[..=p], seed), tokens[c * ctx + p + 1]).unwrap();
                count += 1;
            }
        }
        (nll / count as f64).exp()
    }

    fn text(n: usize) -> Vec<u32> {
        (0..n).map(|i| ((i * 13 + i / 7) % (VOCAB - 2)) as u32 + 2).collect()
    }

    #[test]
    fn evaluates_the_windows_llama_perplexity_scores() {
        let tokens = text(203);
        for (ctx, rows, bos) in [(16, 8, Some(1)), (17, 3, Some(1)), (20, 1, None), (64, 8, Some(0))] {
            let plan = Plan::new(tokens.len(), ctx, None, bos).unwrap();
            let mut home = ToyHome::new(ctx + 5, rows, 7);
            let mut seen = Vec::new();
            let ev = evaluate(&mut home, &tokens, &plan, None, false, &mut |d| seen.push(d)).unwrap();
            let want = reference_ppl(&tokens, ctx, plan.chunks, bos, 7);
            assert!((ev.report.ppl / want - 1.0).abs() < 1e-12, "ctx {ctx}: {} vs {want}", ev.report.ppl);
            assert_eq!(ev.report.tokens, plan.scored());
            assert_eq!(seen, (1..=plan.chunks).collect::<Vec<_>>());
            assert!(ev.records.is_none() && ev.report.kld_mean.is_none());
        }
        // The check can fail: a run without the BOS slot scores something else.
        let plan = Plan::new(tokens.len(), 16, None, None).unwrap();
        let ev = evaluate(&mut ToyHome::new(16, 8, 7), &tokens, &plan, None, false, &mut |_| {}).unwrap();
        assert!((ev.report.ppl / reference_ppl(&tokens, 16, plan.chunks, Some(1), 7) - 1.0).abs() > 1e-6);
    }

    #[test]
    fn a_saved_base_compares_to_itself_and_not_to_another_model() {
        let tokens = text(150);
        let plan = Plan::new(tokens.len(), 24, Some(4), Some(1)).unwrap();
        let base = evaluate(&mut ToyHome::new(24, 8, 7), &tokens, &plan, None, true, &mut |_| {}).unwrap();
        let records = base.records.unwrap();
        assert_eq!(records.len(), plan.scored());
        let file = BaseFile { header: BaseHeader::of_run("toy-7", VOCAB, &plan, &tokens).unwrap(), records };
        let file = BaseFile::parse(&file.to_bytes().unwrap()).unwrap();
        let same = evaluate(&mut ToyHome::new(24, 3, 7), &tokens, &plan, Some(&file), false, &mut |_| {}).unwrap().report;
        assert!(same.kld_mean.unwrap().abs() < 1e-9 && same.kld_p99.unwrap().abs() < 1e-9, "{same:?}");
        assert_eq!(same.top1, Some(1.0));
        assert!((same.ppl / base.report.ppl - 1.0).abs() < 1e-12);
        // Another "model" (seed): a large divergence and little top-1 agreement.
        let other = evaluate(&mut ToyHome::new(24, 8, 8), &tokens, &plan, Some(&file), false, &mut |_| {}).unwrap().report;
        assert!(other.kld_mean.unwrap() > 0.1, "{other:?}");
        assert!(other.kld_p99.unwrap() >= other.kld_mean.unwrap());
        assert!(other.top1.unwrap() < 0.5, "{other:?}");
        // A base of fewer positions than the run is refused.
        let short = Plan::new(tokens.len(), 24, Some(3), Some(1)).unwrap();
        assert!(matches!(evaluate(&mut ToyHome::new(24, 8, 7), &tokens, &short, Some(&file), false, &mut |_| {}), Err(QualityError::BaseMismatch(_))));
    }

    #[test]
    fn bad_inputs_are_errors() {
        let tokens = text(100);
        let plan = Plan::new(tokens.len(), 32, None, Some(1)).unwrap();
        // A home shorter than the window.
        assert!(evaluate(&mut ToyHome::new(16, 8, 1), &tokens, &plan, None, false, &mut |_| {}).is_err());
        // A token past the vocabulary.
        let mut t = tokens.clone();
        t[40] = VOCAB as u32;
        assert!(matches!(evaluate(&mut ToyHome::new(32, 8, 1), &t, &plan, None, false, &mut |_| {}), Err(QualityError::BadToken { .. })));
        // Fewer tokens than the plan covers.
        assert!(evaluate(&mut ToyHome::new(32, 8, 1), &tokens[..50], &plan, None, false, &mut |_| {}).is_err());
    }
}
