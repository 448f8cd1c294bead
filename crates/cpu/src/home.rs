use std::sync::Arc;

use resin_core::{
    check_segments, check_snapshot, check_step, count_window, plan_chain, Counters, Home, HomeSpec, KvCodec, Logits, Need, RegionId, Row, RowOut, Segment, StepOut, PF_WINDOW,
};
use resin_gguf::GgufFile;
use resin_model::ModelConfig;

pub use crate::error::CpuError;
use crate::forward::PassRow;
use crate::kv::KvCache;
use crate::ops::RopeTables;
use crate::weights::{PackProgress, Weights};

/// How a CPU home is built.
#[derive(Debug, Clone)]
pub struct CpuOptions {
    /// Positions per region (defaults to the model's training context, capped at 4096).
    pub n_ctx: Option<usize>,
    pub regions: usize,
    pub codec: KvCodec,
    /// Worker threads (default: every core).
    pub threads: Option<usize>,
    /// Told how far laying the weights out has come.
    pub progress: Option<PackProgress>,
}

impl Default for CpuOptions {
    fn default() -> Self {
        CpuOptions { n_ctx: None, regions: 1, codec: KvCodec::F16, threads: None, progress: None }
    }
}

pub struct CpuHome {
    pub(crate) cfg: ModelConfig,
    pub(crate) weights: Weights,
    pub(crate) kv: KvCache,
    /// A table a base of `cfg.rope_bases()`, in its order (`cfg.layer_rope_table` picks a
    /// layer's); never empty.
    pub(crate) ropes: Vec<RopeTables>,
    spec: HomeSpec,
    pub(crate) counters: Arc<Counters>,
    /// The home's own workers. A whole pass runs inside the pool, so the many small parallel
    /// loops of a token step are cheap in-pool joins instead of cross-thread wake-ups each.
    pool: Arc<rayon::ThreadPool>,
}

impl CpuHome {
    pub fn new(file: Arc<GgufFile>, cfg: ModelConfig, opts: &CpuOptions, counters: Arc<Counters>) -> Result<Self, CpuError> {
        let n_ctx = opts.n_ctx.unwrap_or(cfg.ctx_train.min(4096)).max(1);
        if opts.regions == 0 {
            return Err(CpuError::Model("a home needs at least one region".into()));
        }
        let weights = Weights::load(file, &cfg, opts.progress.as_ref())?;
        let kv = KvCache::new(opts.codec, opts.regions, cfg.n_layer, n_ctx, cfg.kv_dim(), cfg.head_dim)?;
        let ropes = cfg.rope_bases().into_iter().map(|base| RopeTables::new(base, cfg.rope_dims, cfg.arch.rope_style())).collect();
        let spec = HomeSpec { kind: "cpu", vocab: cfg.vocab, n_ctx, regions: opts.regions, codec: opts.codec, step_rows_max: HomeSpec::wide_rows(opts.regions), chunk_rows_min: 1 };
        let threads = opts.threads.unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1));
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads.max(1))
            .thread_name(|i| format!("resin-cpu-{i}"))
            .build()
            .map(Arc::new)
            .map_err(|e| CpuError::Model(format!("starting {threads} CPU threads: {e}")))?;
        Ok(CpuHome { cfg, weights, kv, ropes, spec, counters, pool })
    }

    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    pub fn kv_bytes(&self) -> usize {
        self.kv.bytes()
    }

    pub fn threads(&self) -> usize {
        self.pool.current_num_threads()
    }

    /// One pass, run on the home's own pool.
    fn run_pass(&mut self, rows: &[PassRow], logit_rows: &[usize]) -> Result<Vec<f32>, CpuError> {
        let pool = self.pool.clone();
        pool.install(|| self.pass(rows, logit_rows))
    }
}

impl Home for CpuHome {
    fn spec(&self) -> &HomeSpec {
        &self.spec
    }

    fn prefill(&mut self, segments: &[Segment<'_>]) -> resin_core::Result<Logits> {
        check_segments(&self.spec, segments)?;
        let (chain, windows) = plan_chain(segments, PF_WINDOW, usize::MAX);
        let rows: Vec<PassRow> = chain.iter().map(|r| (r.region as usize, r.pos, r.token)).collect();
        let vocab = self.spec.vocab;
        let mut data = Vec::with_capacity(segments.len() * vocab);
        for w in &windows {
            count_window(&self.counters, w);
            data.extend_from_slice(&self.run_pass(&rows[w.start..w.end], &w.logit_rows)?);
        }
        Counters::add(&self.counters.prompt_tokens_prefilled, rows.len() as u64);
        Ok(Logits { vocab, data })
    }

    /// Every row's logits in one pass (the rows' matrix products together), then each row's
    /// result as its need asks, selected here: the logits never leave the home.
    fn step(&mut self, rows: &[Row], needs: &[Need]) -> resin_core::Result<StepOut> {
        check_step(&self.spec, rows, needs)?;
        let pass: Vec<PassRow> = rows.iter().map(|r| (r.region.0 as usize, r.pos, r.token)).collect();
        let all: Vec<usize> = (0..rows.len()).collect();
        let data = self.run_pass(&pass, &all)?;
        self.counters.count_step(rows.len());
        let vocab = self.spec.vocab.max(1);
        Ok(StepOut { rows: data.chunks(vocab).zip(needs).map(|(row, &need)| RowOut::from_logits(need, row)).collect() })
    }

    /// The step's rows and the segments' rows in one pass: a row's arithmetic does not depend
    /// on the other rows of its pass, so each comes out as in `step` or `prefill`.
    fn step_and_prefill(&mut self, rows: &[Row], needs: &[Need], segments: &[Segment<'_>]) -> resin_core::Result<(StepOut, Logits)> {
        check_step(&self.spec, rows, needs)?;
        check_segments(&self.spec, segments)?;
        if segments.iter().any(|s| rows.iter().any(|r| r.region == s.region)) {
            // A session's rows on both sides: the step's rows, then its prompt.
            return resin_core::step_then_prefill(self, rows, needs, segments);
        }
        let (chain, windows) = plan_chain(segments, PF_WINDOW, usize::MAX);
        let mut pass: Vec<PassRow> = rows.iter().map(|r| (r.region.0 as usize, r.pos, r.token)).collect();
        pass.extend(chain.iter().map(|r| (r.region as usize, r.pos, r.token)));
        let mut logit_rows: Vec<usize> = (0..rows.len()).collect();
        for w in &windows {
            count_window(&self.counters, w);
            logit_rows.extend(w.logit_rows.iter().map(|&r| rows.len() + w.start + r));
        }
        let data = self.run_pass(&pass, &logit_rows)?;
        self.counters.count_step(rows.len());
        Counters::add(&self.counters.prompt_tokens_prefilled, chain.len() as u64);
        Counters::add(&self.counters.mixed_steps, 1);
        let vocab = self.spec.vocab.max(1);
        let (stepped, prefilled) = data.split_at(rows.len() * vocab);
        let out = StepOut { rows: stepped.chunks(vocab).zip(needs).map(|(row, &need)| RowOut::from_logits(need, row)).collect() };
        Ok((out, Logits { vocab: self.spec.vocab, data: prefilled.to_vec() }))
    }

    fn counters(&self) -> &Arc<Counters> {
        &self.counters
    }

    fn save_region(&mut self, region: RegionId, rows: usize) -> resin_core::Result<Vec<u8>> {
        check_snapshot(&self.spec, region, rows, self.kv.row_bytes(), None)?;
        Ok(self.kv.save(region.0 as usize, rows))
    }

    fn load_region(&mut self, region: RegionId, rows: usize, snapshot: &[u8]) -> resin_core::Result<()> {
        let saved = check_snapshot(&self.spec, region, rows, self.kv.row_bytes(), Some(snapshot))?;
        self.kv.load(region.0 as usize, rows, saved, snapshot);
        Ok(())
    }
}
