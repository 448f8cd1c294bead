//! The Vulkan home: the residency plan, the upload, the token command and `resin_core::Home`.
//!
//! Resident on the device: every weight matrix in its GGUF block format (split by rows into
//! parts when larger than the device's storage-buffer range), norms and biases as f32, the
//! rope table (cos/sin of every position, computed in f64 as the CPU home does), the K/V
//! mirror (one buffer per layer and side, `regions` copies of `[n_ctx][kv_dim]`), and the
//! scratch of NROW_MAX rows.
//!
//! The token command for N rows (1..=8) is recorded once, on first use, and resubmitted; per
//! step only the metadata block (token, position, region base, key count a row) is written,
//! and what the step's streams need is read back: the on-device argmax ids (greedy), each
//! row's top candidates with them (top-k samplers; `ReadBack::Top`), and whole logits rows
//! for the rest (every row's, or only the rows a top step names: `ReadBack::TopRows`).
//!
//! Prefill is a window chain (`resin_core::plan_chain`: the same windows the CPU home cuts):
//! each window of up to PF_WINDOW rows, from any number of segments, is one pass in which
//! every row is roped and stored at its own position in its own region and attends only to
//! it; the GEMVs become GEMMs past NROW_MAX rows; after the last layer's attention only the
//! segments' last rows (gathered) run attention-out, the FFN and the classifier, and a window
//! that lands no logits stops once its last layer's K/V are stored.
//!
//! The mirror's codec is f16, f32 or q8_0 (ggml's 34-byte blocks of 32 values, quantized on the
//! device bit for bit as the CPU home's; head dims that are not a multiple of 32 are declined).
//! Snapshots (`save_region`) are the CPU home's layout in each codec: either home loads the
//! other's.
//!
//! A step of more than NROW_MAX rows (`WideMode`) runs as balanced groups of N-row token
//! commands, each on a lane of its own (scratch, token commands, fence and one of the
//! device's queues), all submitted before any is waited for: one group's chain of dependent
//! dispatches overlaps the others' on the device. Or, with `WideMode::Gemm`, as one pass
//! whose matrices take the window's GEMM; `WideMode::Fast` takes lanes under
//! FAST_GEMM_MIN_ROWS rows and the GEMM pass from there.

mod options;
mod pass;
mod plan;
mod scratch;
mod submit;
mod upload;

pub use options::{UploadProgress, VulkanOptions, WideMode, CANON_WIDE_MIN_ROWS, FAST_GEMM_MIN_ROWS};
use pass::*;
pub use plan::Plan;
use plan::*;
use scratch::*;
use std::sync::Arc;
use submit::*;
pub use upload::rope_table;
use upload::*;

use resin_core::{
    check_rows, check_segments, check_snapshot, check_step, Counters, Home, HomeError, HomeSpec, Logits, Need, Profile, RegionId, Row, RowOut, Segment, StepOut, StepShape,
    TopCandidates, NROW_MAX, PF_WINDOW,
};
use resin_gguf::GgufFile;
use resin_model::ModelConfig;

use crate::buffers::Fence;
use crate::device::Gpu;
use crate::pipelines::Pipelines;
use crate::VkError;

pub struct VulkanHome {
    // Dropped by hand (see `Drop`): the commands, the pipelines, then the buffers; the device
    // last, when its last holder goes.
    lanes: std::mem::ManuallyDrop<Vec<Lane>>,
    pipes: std::mem::ManuallyDrop<Pipelines>,
    wide: WideMode,
    weights: std::mem::ManuallyDrop<Weights>,
    cfg: ModelConfig,
    plan: Plan,
    spec: HomeSpec,
    counters: Arc<Counters>,
    gpu: Arc<Gpu>,
}

impl VulkanHome {
    /// Start the device, plan, upload and build the home. A format, architecture feature or
    /// codec this home does not serve is a decline: counted, logged once, and returned as
    /// `VkError::Unsupported` so the caller takes the CPU home.
    pub fn new(file: Arc<GgufFile>, cfg: ModelConfig, opts: &VulkanOptions, counters: Arc<Counters>) -> Result<Self, VkError> {
        let gpu = Gpu::start_with(&opts.gpu)?;
        Self::on(gpu, file, cfg, opts, counters)
    }

    /// Build on an already started device.
    pub fn on(gpu: Arc<Gpu>, file: Arc<GgufFile>, cfg: ModelConfig, opts: &VulkanOptions, counters: Arc<Counters>) -> Result<Self, VkError> {
        if opts.regions == 0 {
            return Err(VkError::Model("a home needs at least one region".into()));
        }
        let plan = plan(&gpu, &file, &cfg, opts, &counters)?;
        let weights = upload(&gpu, &file, &cfg, &plan, opts)?;
        let scratch = Scratch::new(&gpu, &cfg, plan.q8_activations, plan.out_rows, PF_WINDOW, plan.canon_rows)?;
        let spec = HomeSpec {
            kind: "vulkan",
            vocab: cfg.vocab,
            n_ctx: plan.n_ctx,
            regions: opts.regions,
            codec: opts.codec,
            step_rows_max: HomeSpec::wide_rows(opts.regions),
            chunk_rows_min: WINDOW_ATTN_MIN_ROWS,
        };
        tracing::info!(
            "vulkan home ready: {} at n_ctx {} x {} regions ({:?} mirror): weights {} MiB, mirror {} MiB, scratch {} MiB",
            cfg.name,
            plan.n_ctx,
            opts.regions,
            opts.codec,
            plan.weights >> 20,
            plan.mirror >> 20,
            plan.scratch >> 20
        );
        Ok(VulkanHome {
            lanes: std::mem::ManuallyDrop::new(vec![Lane { commands: std::collections::HashMap::new(), fence: Fence::new(&gpu)?, scratch }]),
            pipes: std::mem::ManuallyDrop::new(Pipelines::new(&gpu)),
            wide: opts.wide,
            weights: std::mem::ManuallyDrop::new(weights),
            cfg,
            plan,
            spec,
            counters,
            gpu,
        })
    }

    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// (bytes of one position over every layer's K and V, bytes of one position of one side).
    fn snapshot_row_bytes(&self) -> (usize, usize) {
        let side_row = self.spec.codec.bytes_for(self.cfg.kv_dim());
        (2 * self.cfg.n_layer * side_row, side_row)
    }

    pub fn device(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    /// The argmax ids of the last pass on lane 0 (computed on the device).
    pub fn last_ids(&self, rows: usize) -> Result<Vec<u32>, VkError> {
        Ok(self.lanes[0].scratch.ids.read_u32(0, 2 * rows)?.into_iter().step_by(2).collect())
    }

    /// Build, before the first request, what the first steps would otherwise build as they
    /// go: the token commands of 1..=`rows` rows (kept, as a step would keep them; above
    /// NROW_MAX also the widest step's, at most step_rows_max rows: its lanes and their group
    /// commands, or its one GEMM pass) and one prefill window's pipelines (its command recorded and dropped, never submitted). A
    /// driver compiles each pipeline on first use, so without this the first requests of a
    /// server pay for it in their time to first token. Returns the time it took.
    pub fn prewarm(&mut self, rows: usize) -> Result<std::time::Duration, VkError> {
        let t0 = std::time::Instant::now();
        let backs = ReadBack::ALL;
        // (rows of regions of their own, as streams decode, and runs of a region's rows, as a
        // peel's)
        for n in 1..=rows.clamp(1, NROW_MAX) {
            for (b, regions) in backs.into_iter().flat_map(|b| [(b, Regions::Own), (b, Regions::Runs)]) {
                self.command(0, n, b, regions)?;
            }
        }
        // With more rows than a token command takes, the widest step's: its lanes and their
        // group commands, or one GEMM pass (its pipelines serve every width; the commands of
        // other widths are recorded when first used).
        if rows > NROW_MAX {
            let w = rows.min(self.spec.step_rows_max);
            let shape = self.wide.passes(w, true, self.plan.canon_from);
            self.ensure_lanes(shape.len())?;
            for (lane, n) in shape {
                for b in backs {
                    self.command(lane, n, b, Regions::Own)?;
                }
            }
        }
        let keep = [PF_WINDOW as u32 - 1];
        drop(self.record_shape(0, true, PassShape { n: PF_WINDOW, narrow: Some(&keep), to_host: true, top: false, listed: false, regions: Regions::Mixed }, None)?);
        Ok(t0.elapsed())
    }
}

impl Drop for VulkanHome {
    /// In order: the commands, the pipelines, the buffers. Unless work may still run on the
    /// device (a fence timed out, `fault::Lost::pending`): then everything it could use is
    /// left in place (with the device, which they hold), as freeing it under a running
    /// submission is undefined and waiting for one might never end.
    fn drop(&mut self) {
        if self.gpu.lost().is_some_and(|l| l.pending) {
            tracing::warn!("vulkan home: a submission may still run on the failed device; its memory is kept until the process exits");
            return;
        }
        // SAFETY: nothing may be in flight when the buffers go (every submit is waited on, but
        // be sure; a lost device answers at once). Each field is dropped once, here, and not
        // used after.
        unsafe {
            let _ = self.gpu.device.device_wait_idle();
            std::mem::ManuallyDrop::drop(&mut self.lanes);
            std::mem::ManuallyDrop::drop(&mut self.pipes);
            std::mem::ManuallyDrop::drop(&mut self.weights);
        }
    }
}

impl Home for VulkanHome {
    fn spec(&self) -> &HomeSpec {
        &self.spec
    }

    /// The window chain: the segments flattened into rows, cut into windows of PF_WINDOW
    /// rows; each row is roped and stored in its own region at its own position and attends
    /// only to its region; the last layer runs attention-out, FFN and the classifier only for
    /// the segments' last rows.
    fn prefill(&mut self, segments: &[Segment<'_>]) -> resin_core::Result<Logits> {
        check_segments(&self.spec, segments)?;
        let groups = exact_groups(segments, self.plan.out_rows);
        if groups.len() == 1 {
            return self.prefill_chain(segments);
        }
        if self.counters.decline(APART) {
            tracing::info!("vulkan home: {APART}");
        }
        let vocab = self.spec.vocab;
        let mut rows: Vec<&[f32]> = vec![&[]; segments.len()];
        let mut all = Vec::with_capacity(groups.len());
        for g in &groups {
            let segs: Vec<Segment<'_>> = g.iter().map(|&i| segments[i]).collect();
            all.push(self.prefill_chain(&segs)?.data);
        }
        for (g, data) in groups.iter().zip(&all) {
            for (j, &i) in g.iter().enumerate() {
                rows[i] = &data[j * vocab..(j + 1) * vocab];
            }
        }
        Ok(Logits { vocab, data: rows.concat() })
    }

    /// The step's rows in one pass, or in lanes (`WideMode`); what comes back is the least
    /// the needs ask for (`ReadBack::for_needs`): the on-device argmax ids and log-sum-exps
    /// (eight bytes a row), the top candidates (`Recorder::topk`: 512 bytes a row against half
    /// a megabyte for a 128k vocabulary), and whole logits rows only for the rows that need
    /// them (copied on the device into the first rows of the host's logits buffer,
    /// `Recorder::rows_copy`), or every row's where every row needs its row.
    fn step(&mut self, rows: &[Row], needs: &[Need]) -> resin_core::Result<StepOut> {
        check_step(&self.spec, rows, needs)?;
        let back = ReadBack::for_needs(needs);
        let listed: Vec<usize> = (0..needs.len()).filter(|&i| needs[i] == Need::Logits).collect();
        let passes = self.run_step(&triples(rows), back, &listed).map_err(HomeError::from)?;
        let (k, vocab) = (resin_core::TOP_CANDIDATES, self.cfg.vocab);
        let mut out = Vec::with_capacity(rows.len());
        let mut at = 0;
        for &(lane, n) in &passes {
            let s = &self.lanes[lane].scratch;
            let ids = s.ids.read_u32(0, 2 * n).map_err(HomeError::from)?;
            let top = if back.top() { s.top_host.read_u32(0, 2 * n * k).map_err(HomeError::from)? } else { Vec::new() };
            let mut next_whole = 0;
            for (j, &need) in needs[at..at + n].iter().enumerate() {
                out.push(match need {
                    Need::Argmax => RowOut::Argmax(ids[2 * j]),
                    Need::Top => {
                        let row = &top[2 * k * j..2 * k * (j + 1)];
                        RowOut::Top(TopCandidates {
                            argmax: ids[2 * j],
                            top: row.chunks(2).map_while(|p| crate::kernels::topk_decode(p[0], p[1])).collect(),
                            lse: f32::from_bits(ids[2 * j + 1]),
                        })
                    }
                    Need::Logits => {
                        // Every row's logits lie in row order; listed rows in the first rows.
                        let i = if back == ReadBack::Logits { j } else { next_whole };
                        next_whole += 1;
                        RowOut::Logits(s.logits_host.read_f32(i * vocab, vocab).map_err(HomeError::from)?)
                    }
                });
            }
            at += n;
        }
        self.count_passes(&passes);
        Ok(StepOut { rows: out })
    }

    fn counters(&self) -> &Arc<Counters> {
        &self.counters
    }

    fn profiler(&mut self) -> Option<&mut dyn Profile> {
        Some(self)
    }

    /// Layout `[layer][K rows | V rows]` in the mirror's codec (f16, f32 or q8_0 blocks), as the
    /// CPU home's.
    fn save_region(&mut self, region: RegionId, rows: usize) -> resin_core::Result<Vec<u8>> {
        let (row_bytes, side_row) = self.snapshot_row_bytes();
        check_snapshot(&self.spec, region, rows, row_bytes, None)?;
        let base = region.0 as u64 * (self.plan.n_ctx * side_row) as u64;
        let side = rows * side_row;
        let mut out = vec![0u8; rows * row_bytes];
        for (l, ly) in self.weights.layers.iter().enumerate() {
            let at = l * 2 * side;
            ly.mk.read(base, &mut out[at..at + side]).map_err(HomeError::from)?;
            ly.mv.read(base, &mut out[at + side..at + 2 * side]).map_err(HomeError::from)?;
        }
        Ok(out)
    }

    fn load_region(&mut self, region: RegionId, rows: usize, snapshot: &[u8]) -> resin_core::Result<()> {
        let (row_bytes, side_row) = self.snapshot_row_bytes();
        let saved = check_snapshot(&self.spec, region, rows, row_bytes, Some(snapshot))?;
        let base = region.0 as u64 * (self.plan.n_ctx * side_row) as u64;
        let (side, len) = (saved * side_row, rows * side_row);
        for (l, ly) in self.weights.layers.iter_mut().enumerate() {
            let at = l * 2 * side;
            ly.mk.write(base, &snapshot[at..at + len]).map_err(HomeError::from)?;
            ly.mv.write(base, &snapshot[at + side..at + side + len]).map_err(HomeError::from)?;
        }
        Ok(())
    }
}

impl Profile for VulkanHome {
    /// Run one token command over `rows` with a timestamp after every stage; returns
    /// (stage, microseconds) in order, stages named `<op>.<layer>`. The K/V rows of `rows` are
    /// written as a normal step would. None when the device has no timestamps.
    fn profile_step(&mut self, rows: &[Row]) -> resin_core::Result<Option<Vec<(String, f64)>>> {
        check_rows(&self.spec, rows)?;
        let r = triples(rows);
        Ok(self.profile_pass(&r, None)?)
    }

    /// As `profile_step`, for one prefill window: the first PF_WINDOW rows of `segment`
    /// (its K/V stored as prefill would), landing the logits of its last row.
    fn profile_window(&mut self, segment: &Segment<'_>) -> resin_core::Result<Option<Vec<(String, f64)>>> {
        check_segments(&self.spec, std::slice::from_ref(segment))?;
        let r: Vec<(u32, u32, u32)> = segment.tokens.iter().take(PF_WINDOW).enumerate().map(|(i, &t)| (segment.region.0, segment.start + i as u32, t)).collect();
        let keep = [r.len() as u32 - 1];
        Ok(self.profile_pass(&r, Some(&keep))?)
    }

    fn step_shape(&mut self, rows: usize) -> resin_core::Result<Option<StepShape>> {
        if !(1..=NROW_MAX).contains(&rows) {
            return Err(HomeError::BadRowCount { got: rows, max: NROW_MAX });
        }
        let c = self.command(0, rows, ReadBack::Ids, Regions::Own).map_err(HomeError::from)?.counts;
        Ok(Some(StepShape { stages: c.stages, dispatches: c.dispatches, barriers: c.barriers }))
    }

    fn stage_weight_bytes(&self) -> Vec<(&'static str, u64)> {
        let b = |m: &Mat| (m.rows * m.row_bytes) as u64;
        let sum = |f: &dyn Fn(&Layer) -> u64| self.weights.layers.iter().map(f).sum::<u64>();
        let (used, all) = self.cfg.moe.map_or((1, 1), |m| (m.n_expert_used as u64, m.n_expert as u64));
        vec![
            ("qkv", sum(&|l| b(&l.q) + b(&l.k) + b(&l.v))),
            ("attn_out", sum(&|l| b(&l.attn_out))),
            // A mixture-of-experts row reads its chosen experts' share of the stacks.
            ("gate_up", sum(&|l| b(&l.gate) + b(&l.up)) * used / all),
            ("down", sum(&|l| b(&l.down)) * used / all),
            ("classifier", b(self.weights.output.as_ref().unwrap_or(&self.weights.embd))),
        ]
    }

    /// A shader copy of 256 MiB (64 on a software device) between two device-local buffers
    /// (`Recorder::copy16`: a shader's loads, as the matrix stages' are, not the copy
    /// engine's), timed on the device, the faster of two runs.
    fn copy_bandwidth(&mut self) -> resin_core::Result<Option<f64>> {
        self.shader_copy_bandwidth().map_err(HomeError::from)
    }
}
