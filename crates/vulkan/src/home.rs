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

use std::sync::Arc;

use resin_core::{balanced_groups, check_rows, check_segments, check_snapshot, check_step, count_window, plan_chain, Counters, Home, HomeError, HomeSpec, KvCodec, Logits, Need, Profile, RegionId, Row, RowOut, Segment, StepOut, TopCandidates, NROW_MAX, PF_WINDOW};
use resin_gguf::{formats, GgmlType, GgufFile};
use resin_model::{LayerNames, ModelConfig};

use crate::buffers::{f32_bytes, Buffer, Commands, Fence, Location};
use crate::device::Gpu;
use crate::gemv_dot::{dot_format, QPack};
use crate::kernels::*;
use crate::pipelines::{Bind, Descriptors, Pipelines};
use crate::VkError;

/// How a Vulkan home is built.
#[derive(Debug, Clone)]
pub struct VulkanOptions {
    /// Positions per region (defaults to the model's training context, capped at 4096).
    pub n_ctx: Option<usize>,
    pub regions: usize,
    pub codec: KvCodec,
    /// Round the activations of quantized GEMVs through 8-bit blocks as the CPU home's
    /// integer dot products do (the default), or keep them f32 (closer to a float32 pass).
    pub q8_activations: bool,
    /// Called as the weights go up with (bytes uploaded, bytes in all): the binary draws a
    /// progress bar with it. Without one, a log line every 10 %.
    pub progress: Option<UploadProgress>,
    /// How a step of more than NROW_MAX rows runs (default: `WideMode::Lanes`).
    pub wide: WideMode,
    /// How the device is started (which one, its queues, the fence wait's spin).
    pub gpu: crate::device::GpuOptions,
}

/// How the Vulkan home runs a step of more than NROW_MAX rows (a wide step).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WideMode {
    /// Balanced groups of N-row token commands, each on a lane of its own (scratch, fence and
    /// one of the device's queues), submitted together: the groups' dependent dispatch chains
    /// overlap on the device, and each row's result is its N-row command's.
    #[default]
    Lanes,
    /// One pass of all the rows, its matrices through the window's GEMM.
    Gemm,
    /// The faster of the two by width (measured on the H200, BENCHMARKS.md): lanes under
    /// FAST_GEMM_MIN_ROWS rows, one GEMM pass from there (it reads the weights once, not
    /// once a group). A row's result then depends on how wide its step was (within the CPU
    /// home's bar, as any GEMM row), so it is asked for by name (`--wide-steps fast`).
    Fast,
}

/// Rows from which `WideMode::Fast` takes one GEMM pass: in lockstep on the H200 a 32-row
/// GEMM pass was +11% on the 1B and -5% on the 3B against lanes, a 64-row one +64% and +51%.
pub const FAST_GEMM_MIN_ROWS: usize = 40;

impl WideMode {
    /// How a step of `rows` rows runs: (lane, rows) of each pass, in row order. `distinct`:
    /// every row has a region of its own (rows that share one take one pass: a row may attend
    /// to keys another row of the step stores).
    pub fn passes(self, rows: usize, distinct: bool) -> Vec<(usize, usize)> {
        let lanes = rows > NROW_MAX
            && distinct
            && match self {
                WideMode::Lanes => true,
                WideMode::Gemm => false,
                WideMode::Fast => rows < FAST_GEMM_MIN_ROWS,
            };
        if lanes {
            balanced_groups(rows, NROW_MAX).into_iter().enumerate().collect()
        } else {
            vec![(0, rows)]
        }
    }
}

/// An upload progress callback (see [`VulkanOptions::progress`]).
#[derive(Clone)]
pub struct UploadProgress(pub Arc<dyn Fn(u64, u64) + Send + Sync>);

impl std::fmt::Debug for UploadProgress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("UploadProgress")
    }
}

impl Default for VulkanOptions {
    fn default() -> Self {
        VulkanOptions { n_ctx: None, regions: 1, codec: KvCodec::F16, q8_activations: true, progress: None, wide: WideMode::Lanes, gpu: crate::device::GpuOptions::default() }
    }
}

/// A weight matrix on the device: `rows` x `cols` of `ty`, in parts of whole rows.
struct Mat {
    ty: GgmlType,
    rows: usize,
    cols: usize,
    row_bytes: usize,
    /// (buffer, first row, rows)
    parts: Vec<(Buffer, usize, usize)>,
}

struct Layer {
    attn_norm: Buffer,
    q: Mat,
    k: Mat,
    v: Mat,
    /// [q_dim | kv_dim | kv_dim] biases (or a dummy word when the model has none).
    bias: Buffer,
    /// [head_dim | head_dim] q and k norm weights (or a dummy).
    qk_norm: Buffer,
    attn_out: Mat,
    ffn_norm: Buffer,
    gate: Mat,
    up: Mat,
    down: Mat,
    mk: Buffer,
    mv: Buffer,
}

/// Scratch for a pass of up to `rows` rows: a window of PF_WINDOW (the token command uses its
/// first rows) on the home's first lane, NROW_MAX on the others; `meta`, `logits_host` and
/// `ids` are host-visible; the logits hold `out_rows` rows.
struct Scratch {
    meta: Buffer,
    /// The residual and attention rows that need logits, gathered for the narrowed last layer.
    xg: Buffer,
    ag: Buffer,
    /// Logits rows one pass can land: max(NROW_MAX, regions).
    out_rows: usize,
    x: Buffer,
    xn: Buffer,
    q: Buffer,
    k: Buffer,
    v: Buffer,
    att: Buffer,
    o: Buffer,
    gate: Buffer,
    up: Buffer,
    down: Buffer,
    part: Buffer,
    /// The classifier's output (device-local: the argmax reads it there), and its copy the
    /// host reads.
    logits: Buffer,
    logits_host: Buffer,
    ids: Buffer,
    /// The top-k's candidates (`top_sel`) and sorted lists between its stages, and each
    /// row's best read back (`ReadBack::Top`; key pairs, `kernels::topk_decode`).
    top_a: Buffer,
    top_b: Buffer,
    top_sel: Buffer,
    top_host: Buffer,
    /// The logits rows a `ReadBack::TopRows` pass copies to `logits_host` (its first rows):
    /// a count, then the indices (`kernels::rows_copy_words`), written before each submit.
    rows_list: Buffer,
    /// Activations rounded through 8-bit blocks of 32 and 256 values (see `act_block`).
    xq32: Buffer,
    xq256: Buffer,
    /// Token passes' activations packed as int8 blocks for the dot GEMV (see gemv_dot.rs).
    xp32: Buffer,
    xp256: Buffer,
    /// Whether `prep` rounds activations (VulkanOptions::q8_activations).
    q8: bool,
    /// Whether token passes take the int8 dot GEMV (q8 activations on a device that runs it).
    dot: bool,
    /// The words the decode attention's workgroups of a head group count themselves in, so
    /// that the last to finish merges the pieces (zero between dispatches).
    done: Buffer,
    /// Split-K GEMM scratch: SPLIT_SLOTS slots of partial sums and of per-tile counters (zero
    /// between dispatches), each `split_part` / `split_done` bytes.
    split_part: u64,
    split_done: u64,
    gpart: Buffer,
    gdone: Buffer,
}

/// GEMMs recorded with no barrier between them at most (q, k and v).
const SPLIT_SLOTS: usize = 3;

impl Scratch {
    fn split_slot(&self, slot: usize) -> Result<crate::gemm::GemmSplit<'_>, VkError> {
        if slot >= SPLIT_SLOTS || self.split_part == 0 {
            return Err(VkError::Model(format!("no split-K scratch slot {slot}")));
        }
        let part = Bind { buf: &self.gpart, offset: slot as u64 * self.split_part, range: self.split_part };
        let done = Bind { buf: &self.gdone, offset: slot as u64 * self.split_done, range: self.split_done };
        Ok(crate::gemm::GemmSplit { part, done })
    }
}

/// Bytes of one split-K slot (partial sums, counters) for the matrices of `cfg` over up to
/// PF_WINDOW activation rows, rounded up to the device's storage-offset alignment; none where
/// the device's GEMM tier does not split (only the cooperative-matrix tier does: see
/// Recorder::gemm).
fn split_slot_bytes(info: &crate::device::DeviceInfo, cfg: &ModelConfig) -> (u64, u64) {
    if crate::gemm::pick_tier(&crate::gemm::GemmCaps::of(info)) != crate::gemm::GemmTier::CoopMat {
        return (0, 0);
    }
    let (d, q, kv, ff) = (cfg.n_embd as u32, cfg.q_dim() as u32, cfg.kv_dim() as u32, cfg.n_ff as u32);
    // (rows, cols) of every matrix a pass multiplies; the classifier's rows never split K
    // (its many row tiles fill the device), but it is counted the same way.
    let shapes = [(q, d), (kv, d), (d, q), (ff, d), (d, ff), (cfg.vocab as u32, d)];
    let n = PF_WINDOW as u32;
    let part = shapes.iter().map(|&(r, c)| crate::gemm::gemm_part_floats(r, c, n) as u64 * 4).max().unwrap_or(0);
    let done = shapes.iter().filter(|&&(r, c)| crate::gemm::gemm_split(r, c).1 > 1).map(|&(r, _)| crate::gemm::gemm_done_words(r, n) as u64 * 4).max().unwrap_or(0);
    let up = |b: u64| b.next_multiple_of(info.storage_align.max(4));
    (up(part), up(done))
}

/// What the plan decided, in bytes, before anything was uploaded.
#[derive(Debug, Clone)]
pub struct Plan {
    pub n_ctx: usize,
    pub q8_activations: bool,
    pub weights: u64,
    pub mirror: u64,
    pub scratch: u64,
    /// Logits rows one pass lands (a window's segments, a step's rows).
    pub out_rows: usize,
}

/// Windows of at least this many rows take the tiled (flash) attention; fewer rows the
/// decode kernel, whose key pieces spread a short window over more workgroups.
const WINDOW_ATTN_MIN_ROWS: usize = 16;

/// Rows x key pieces the attention partials hold: the decode attention's rows (a window's,
/// fewer than WINDOW_ATTN_MIN_ROWS; a step's, up to `step_rows`) in ATTN_SLOTS pieces each.
fn part_rows(step_rows: usize) -> usize {
    PF_WINDOW.max(step_rows * ATTN_SLOTS as usize)
}

/// Floats of the decode attention's partials for a home landing `out_rows` logits rows.
fn attn_part_floats(cfg: &ModelConfig, out_rows: usize) -> usize {
    attn_part_len(part_rows(HomeSpec::wide_rows(out_rows)), cfg.n_head, cfg.head_dim, 1)
}
const _: () = assert!((WINDOW_ATTN_MIN_ROWS - 1) * ATTN_SLOTS as usize <= PF_WINDOW && NROW_MAX * ATTN_SLOTS as usize <= PF_WINDOW);

/// Workgroups a row and head of the decode attention for a pass of `rows` rows: the split
/// follows the rows, so a step of few rows still spreads its keys over many workgroups
/// (rows x workgroups <= ATTN_SPREAD: 8 rows take 32 each, every piece of a 2048-key row its
/// own workgroup). The pieces themselves follow each row's key count alone, so a row's result
/// is the same whatever this says.
fn attn_pieces(rows: usize) -> u32 {
    (ATTN_SPREAD / rows.max(1)).clamp(1, ATTN_SLOTS as usize) as u32
}

/// Rows x workgroups a head the decode attention aims at (64 left an 8-row step's rows two
/// pieces a workgroup).
const ATTN_SPREAD: usize = 256;

/// Bytes of a scratch for passes of up to `rows` rows landing `out_rows` logits rows, rope
/// table aside (what `Scratch::new` allocates).
fn scratch_bytes(info: &crate::device::DeviceInfo, cfg: &ModelConfig, out_rows: usize, rows: usize) -> u64 {
    let widest = cfg.n_embd.max(cfg.q_dim()).max(cfg.n_ff);
    let per_row = 4 * cfg.n_embd + 2 * cfg.q_dim() + 2 * cfg.kv_dim() + 2 * cfg.n_ff + 2 * widest + META_WORDS;
    let out = out_rows * (2 * cfg.vocab + cfg.n_embd + cfg.q_dim() + 1) + 2 * NROW_MAX * widest;
    let (sp, sd) = if rows > NROW_MAX { split_slot_bytes(info, cfg) } else { (0, 0) };
    let out = out + SPLIT_SLOTS * (sp + sd) as usize / 4 + 4 * topk_pairs(cfg, out_rows) + crate::kernels::topk_sel_words(out_rows as u32) as usize + 2 * out_rows * TOPK_MAX as usize + crate::kernels::rows_copy_words(out_rows as u32) as usize;
    ((rows * per_row + out + attn_part_floats(cfg, out_rows)) * 4) as u64
}

/// Key pairs of each of the top-k's scratch lists for `out_rows` rows.
fn topk_pairs(cfg: &ModelConfig, out_rows: usize) -> usize {
    crate::kernels::topk_scratch_pairs(out_rows as u32, cfg.vocab as u32, TOPK_MAX) as usize
}

/// Lanes beyond the first a home of `regions` regions takes for its widest step in `wide` mode.
fn extra_lanes(wide: WideMode, regions: usize) -> usize {
    match wide {
        WideMode::Lanes => HomeSpec::wide_rows(regions).div_ceil(NROW_MAX) - 1,
        WideMode::Fast => HomeSpec::wide_rows(regions).min(FAST_GEMM_MIN_ROWS - 1).div_ceil(NROW_MAX) - 1,
        WideMode::Gemm => 0,
    }
}

/// Timestamps between the stages of a profiled token command.
struct StageClock<'a> {
    ts: &'a crate::buffers::Timestamps,
    labels: Vec<String>,
}

impl StageClock<'_> {
    fn mark(&mut self, cmd: ash::vk::CommandBuffer, label: impl Into<String>) {
        if (self.labels.len() as u32) < self.ts.count {
            self.ts.write(cmd, self.labels.len() as u32);
            self.labels.push(label.into());
        }
    }
}

fn mark(clock: &mut Option<&mut StageClock<'_>>, cmd: ash::vk::CommandBuffer, label: &str, l: usize) {
    if let Some(c) = clock {
        c.mark(cmd, format!("{label}.{l}"));
    }
}

/// One recorded token command (N rows) and the descriptor sets it uses.
struct TokenCommand {
    cmds: Commands,
    _desc: Descriptors,
}

/// What one pass in flight needs of its own: scratch, the token commands recorded over it and
/// a fence. Lane 0 serves every pass (its scratch holds a window); with `WideMode::Lanes` a
/// wide step's groups run on lanes 0, 1, ... at once, lane i submitting to queue i (modulo the
/// device's queues).
struct Lane {
    // Field order is drop order: the commands before the buffers they use.
    /// Token commands by (rows, greedy: the logits stay on the device), recorded on first use.
    commands: std::collections::HashMap<(usize, ReadBack), TokenCommand>,
    fence: Fence,
    scratch: Scratch,
}

pub struct VulkanHome {
    // Field order is drop order: commands and pipelines before the buffers, the device last.
    lanes: Vec<Lane>,
    pipes: Pipelines,
    wide: WideMode,
    layers: Vec<Layer>,
    embd: Mat,
    /// None when tied to the embedding.
    output: Option<Mat>,
    output_norm: Buffer,
    rope: Buffer,
    cfg: ModelConfig,
    plan: Plan,
    spec: HomeSpec,
    counters: Arc<Counters>,
    gpu: Arc<Gpu>,
}

fn decline(counters: &Counters, reason: String) -> VkError {
    if counters.decline(&reason) {
        tracing::warn!("vulkan home declines: {reason}; the CPU home serves");
    }
    VkError::Unsupported(reason)
}

fn tensor<'a>(f: &'a GgufFile, name: &str) -> Result<&'a resin_gguf::TensorInfo, VkError> {
    f.tensor(name).ok_or_else(|| VkError::Model(format!("tensor {name} is missing")))
}

fn vector(f: &GgufFile, name: &str) -> Result<Vec<f32>, VkError> {
    let t = tensor(f, name)?;
    let mut v = vec![0f32; t.n_elements() as usize];
    formats::dequantize(t.ty, f.tensor_data(t), &mut v).map_err(|e| VkError::Model(format!("{name}: {e}")))?;
    Ok(v)
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
        let f = &*file;
        let total = plan.weights;
        let mut done = 0u64;
        let mut last_tenth = 0u64;
        let mut progress = |bytes: u64| {
            done += bytes;
            if let Some(p) = &opts.progress {
                (p.0)(done, total);
                return;
            }
            let tenth = done * 10 / total.max(1);
            if tenth > last_tenth {
                last_tenth = tenth;
                tracing::info!("vulkan upload {}% ({} of {} MiB)", tenth * 10, done >> 20, total >> 20);
            }
        };
        let mirror_bytes = (opts.regions * plan.n_ctx) as u64 * opts.codec.bytes_for(cfg.kv_dim()) as u64;
        let mut layers = Vec::with_capacity(cfg.n_layer);
        for l in 0..cfg.n_layer {
            let n = LayerNames::new(l);
            let mut mat = |name: &str| -> Result<Mat, VkError> {
                let m = upload_mat(&gpu, f, name)?;
                progress((m.rows * m.row_bytes) as u64);
                Ok(m)
            };
            let (q, k, v, attn_out, gate, up, down) = (mat(&n.q)?, mat(&n.k)?, mat(&n.v)?, mat(&n.attn_out)?, mat(&n.gate)?, mat(&n.up)?, mat(&n.down)?);
            let bias = if cfg.qkv_bias {
                [vector(f, &n.q_bias)?, vector(f, &n.k_bias)?, vector(f, &n.v_bias)?].concat()
            } else {
                vec![0.0]
            };
            let qk_norm = if cfg.qk_norm { [vector(f, &n.q_norm)?, vector(f, &n.k_norm)?].concat() } else { vec![0.0] };
            let dev = |v: &[f32]| Buffer::with_data(&gpu, &f32_bytes(v), Location::Device);
            layers.push(Layer {
                attn_norm: dev(&vector(f, &n.attn_norm)?)?,
                q,
                k,
                v,
                bias: dev(&bias)?,
                qk_norm: dev(&qk_norm)?,
                attn_out,
                ffn_norm: dev(&vector(f, &n.ffn_norm)?)?,
                gate,
                up,
                down,
                mk: Buffer::new(&gpu, mirror_bytes, Location::Device)?,
                mv: Buffer::new(&gpu, mirror_bytes, Location::Device)?,
            });
        }
        let embd = upload_mat(&gpu, f, resin_model::TOKEN_EMBD)?;
        progress((embd.rows * embd.row_bytes) as u64);
        let output = if cfg.tied_output { None } else { Some(upload_mat(&gpu, f, resin_model::OUTPUT)?) };
        let output_norm = Buffer::with_data(&gpu, &f32_bytes(&vector(f, resin_model::OUTPUT_NORM)?), Location::Device)?;
        let rope = Buffer::with_data(&gpu, &f32_bytes(&rope_table(plan.n_ctx, cfg.rope_dims, cfg.rope_base)), Location::Device)?;
        let scratch = Scratch::new(&gpu, &cfg, plan.q8_activations, plan.out_rows, PF_WINDOW)?;
        let spec = HomeSpec { kind: "vulkan", vocab: cfg.vocab, n_ctx: plan.n_ctx, regions: opts.regions, codec: opts.codec, step_rows_max: HomeSpec::wide_rows(opts.regions), chunk_rows_min: WINDOW_ATTN_MIN_ROWS };
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
            lanes: vec![Lane { commands: std::collections::HashMap::new(), fence: Fence::new(&gpu)?, scratch }],
            pipes: Pipelines::new(&gpu),
            wide: opts.wide,
            layers,
            embd,
            output,
            output_norm,
            rope,
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

    /// Make sure lanes 0..count exist (the ones past the first hold NROW_MAX-row scratch).
    fn ensure_lanes(&mut self, count: usize) -> Result<(), VkError> {
        while self.lanes.len() < count {
            let scratch = Scratch::new(&self.gpu, &self.cfg, self.plan.q8_activations, NROW_MAX, NROW_MAX)?;
            self.lanes.push(Lane { commands: std::collections::HashMap::new(), fence: Fence::new(&self.gpu)?, scratch });
        }
        Ok(())
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
        for n in 1..=rows.clamp(1, NROW_MAX) {
            for b in backs {
                self.command(0, n, b)?;
            }
        }
        // With more rows than a token command takes, the widest step's: its lanes and their
        // group commands, or one GEMM pass (its pipelines serve every width; the commands of
        // other widths are recorded when first used).
        if rows > NROW_MAX {
            let w = rows.min(self.spec.step_rows_max);
            let shape = self.wide.passes(w, true);
            self.ensure_lanes(shape.len())?;
            for (lane, n) in shape {
                for b in backs {
                    self.command(lane, n, b)?;
                }
            }
        }
        let keep = [PF_WINDOW as u32 - 1];
        drop(self.record_shape(0, true, PassShape { n: PF_WINDOW, narrow: Some(&keep), to_host: true, top: false, listed: false }, None)?);
        Ok(t0.elapsed())
    }

    /// Lane `lane`'s token command for `n` rows (1..=NROW_MAX; on lane 0 up to step_rows_max,
    /// above NROW_MAX a GEMM pass), recorded on first use and kept; `back`: what comes back to
    /// the host besides the argmax ids.
    fn command(&mut self, lane: usize, n: usize, back: ReadBack) -> Result<ash::vk::CommandBuffer, VkError> {
        let key = (n, back);
        if !self.lanes[lane].commands.contains_key(&key) {
            let c = self.record_shape(lane, false, PassShape { n, narrow: None, to_host: back == ReadBack::Logits, top: back.top(), listed: back.listed() }, None)?;
            self.lanes[lane].commands.insert(key, c);
        }
        self.lanes[lane].commands.get(&key).map(|c| c.cmds.cmd).ok_or_else(|| VkError::Model("no token command".into()))
    }

    /// Record one pass of `shape` over lane `lane`'s scratch into a command buffer of its own
    /// (`one_time`: submitted once), with a timestamp after every stage when `clock` is given.
    fn record_shape(&mut self, lane: usize, one_time: bool, shape: PassShape<'_>, mut clock: Option<&mut StageClock<'_>>) -> Result<TokenCommand, VkError> {
        let cmds = Commands::new(&self.gpu)?;
        let mut desc = Descriptors::new(&self.gpu);
        let mut res = Ok(());
        cmds.record(one_time, |cmd| {
            if let Some(c) = clock.as_deref_mut() {
                c.ts.reset(cmd);
                c.mark(cmd, "start");
            }
            let mut rec = Recorder { gpu: &self.gpu, pipes: &mut self.pipes, desc: &mut desc, cmd };
            res = record_pass(&mut rec, shape, &self.cfg, self.spec.codec, &self.layers, &self.embd, self.output.as_ref(), &self.output_norm, &self.rope, &self.lanes[lane].scratch, clock);
        })?;
        res?;
        Ok(TokenCommand { cmds, _desc: desc })
    }

    fn profile_pass(&mut self, rows: &[(u32, u32, u32)], narrow: Option<&[u32]>) -> Result<Option<Vec<(String, f64)>>, VkError> {
        let Some(ts) = crate::buffers::Timestamps::new(&self.gpu, (12 * self.cfg.n_layer + 16) as u32)? else { return Ok(None) };
        self.write_meta(0, rows)?;
        let mut clock = StageClock { ts: &ts, labels: Vec::new() };
        let c = self.record_shape(0, true, PassShape { n: rows.len(), narrow, to_host: true, top: false, listed: false }, Some(&mut clock))?;
        self.lanes[0].fence.submit_wait(c.cmds.cmd)?;
        let labels = clock.labels;
        let t = ts.read(labels.len() as u32)?;
        Ok(Some(labels.iter().enumerate().skip(1).map(|(i, l)| (l.clone(), (t[i] - t[i - 1]) / 1e3)).collect()))
    }

    /// Write the metadata block of `rows` (region, position, token) into lane `lane`'s scratch.
    fn write_meta(&mut self, lane: usize, rows: &[(u32, u32, u32)]) -> Result<(), VkError> {
        let region_elems = (self.plan.n_ctx * self.cfg.kv_dim()) as u32;
        let meta: Vec<RowMeta> = rows.iter().map(|&(region, pos, token)| RowMeta { token, pos, kv_base: region * region_elems, keys: pos + 1 }).collect();
        self.lanes[lane].scratch.meta.write(0, &RowMeta::words(&meta))
    }

    /// The segments as one window chain (the caller made sure each takes the kernels it takes
    /// in a chain of its own: `exact_groups`), one logits row a segment.
    fn prefill_chain(&mut self, segments: &[Segment<'_>]) -> resin_core::Result<Logits> {
        let (chain, windows) = plan_chain(segments, PF_WINDOW, self.plan.out_rows);
        let vocab = self.spec.vocab;
        let mut data = Vec::with_capacity(segments.len() * vocab);
        for w in &windows {
            count_window(&self.counters, w);
            let rows: Vec<(u32, u32, u32)> = chain[w.start..w.end].iter().map(|r| (r.region, r.pos, r.token)).collect();
            let keep: Vec<u32> = w.logit_rows.iter().map(|&i| i as u32).collect();
            data.extend(self.run_window(&rows, &keep).map_err(HomeError::from)?);
        }
        Counters::add(&self.counters.prompt_tokens_prefilled, chain.len() as u64);
        Ok(Logits { vocab, data })
    }

    /// One prefill window (up to PF_WINDOW rows, already checked), recorded for its shape and
    /// submitted; returns the logits of the rows in `keep`.
    fn run_window(&mut self, rows: &[(u32, u32, u32)], keep: &[u32]) -> Result<Vec<f32>, VkError> {
        self.write_meta(0, rows)?;
        let c = self.record_shape(0, true, PassShape { n: rows.len(), narrow: Some(keep), to_host: true, top: false, listed: false }, None)?;
        self.lanes[0].fence.submit_wait(c.cmds.cmd)?;
        if keep.is_empty() {
            return Ok(Vec::new());
        }
        self.lanes[0].scratch.logits_host.read_f32(0, keep.len() * self.cfg.vocab)
    }

    /// Run a step over `rows` (already checked), recording its commands on first use: one
    /// pass on lane 0, or with `WideMode::Lanes` and more than NROW_MAX rows of distinct
    /// regions, balanced groups of N-row token commands on lanes 0, 1, ..., all submitted
    /// before any is waited for. (Rows that share a region take one pass: a row may attend to
    /// keys another row of the step stores.) `listed`: with `ReadBack::TopRows`, the rows
    /// (ascending indices into `rows`) whose whole logits come back, each pass's in its lane's
    /// `rows_list`. Returns (lane, rows, listed rows) of each pass in row order; its results
    /// are in that lane's scratch.
    fn run_step(&mut self, rows: &[(u32, u32, u32)], back: ReadBack, listed: &[usize]) -> Result<Vec<(usize, usize, usize)>, VkError> {
        let mut seen = std::collections::HashSet::new();
        let distinct = rows.iter().all(|r| seen.insert(r.0));
        let groups: Vec<usize> = self.wide.passes(rows.len(), distinct).into_iter().map(|(_, n)| n).collect();
        self.ensure_lanes(groups.len())?;
        let mut cmds = Vec::with_capacity(groups.len());
        let mut lists = Vec::with_capacity(groups.len());
        let mut at = 0;
        for (lane, &n) in groups.iter().enumerate() {
            cmds.push(self.command(lane, n, back)?);
            self.write_meta(lane, &rows[at..at + n])?;
            let list: Vec<u32> = listed.iter().filter(|&&i| (at..at + n).contains(&i)).map(|&i| (i - at) as u32).collect();
            if back.listed() {
                self.lanes[lane].scratch.rows_list.write(0, &crate::kernels::rows_copy_list(&list))?;
            }
            lists.push(list.len());
            at += n;
        }
        // Wait for every submitted pass even when a later submit fails: nothing a pass uses
        // may be touched while it is in flight.
        let queues = &self.gpu.queues;
        let mut res = Ok(());
        let mut sent = 0;
        for (lane, &cmd) in cmds.iter().enumerate() {
            match self.lanes[lane].fence.submit(queues[lane % queues.len()], cmd) {
                Ok(()) => sent += 1,
                Err(e) => {
                    res = Err(e);
                    break;
                }
            }
        }
        for lane in &self.lanes[..sent] {
            let waited = lane.fence.wait();
            if res.is_ok() {
                res = waited;
            }
        }
        res.map(|()| groups.into_iter().zip(lists).enumerate().map(|(lane, (n, m))| (lane, n, m)).collect())
    }

    /// Count a step by what ran: one pass (a token command, or a wide GEMM pass), or groups of
    /// token commands on lanes (a grouped step, each group an N-row step).
    fn count_passes(&self, passes: &[(usize, usize, usize)]) {
        if passes.len() > 1 {
            Counters::add(&self.counters.grouped_steps, 1);
        }
        for &(_, n, _) in passes {
            self.counters.count_step(n);
        }
    }

}

/// The decline said (once) when segments of one prefill cannot share a window chain exactly.
const APART: &str = "segments whose rows would take other kernels in a shared window than in windows of their own (under 16 rows: the GEMV or the decode attention) run in windows of their own";

/// Which kernels a window of `n` rows takes, which decide its rows' bits: the GEMV (up to
/// NROW_MAX rows) or the GEMM, then the decode attention (under WINDOW_ATTN_MIN_ROWS rows) or
/// the flash-attention tiles.
fn window_kernels(n: usize) -> u8 {
    if n <= NROW_MAX {
        0
    } else if n < WINDOW_ATTN_MIN_ROWS {
        1
    } else {
        2
    }
}

/// The segments of one prefill in chains that give each segment the logits of a chain of its
/// own, bit for bit: one shared chain of every segment whose rows take the same kernels there
/// as alone (`window_kernels` of each row's window); the others apart, those of at most
/// NROW_MAX rows packed into chains of at most NROW_MAX rows (one-window chains that take the
/// GEMV and the decode attention, as each does alone), the rest alone. Indices ascending.
fn exact_groups(segments: &[Segment<'_>], out_rows: usize) -> Vec<Vec<usize>> {
    let mut shared: Vec<usize> = (0..segments.len()).collect();
    let mut apart = Vec::new();
    while shared.len() > 1 {
        let segs: Vec<Segment<'_>> = shared.iter().map(|&i| segments[i]).collect();
        let (_, windows) = plan_chain(&segs, PF_WINDOW, out_rows);
        let kernels: Vec<u8> = windows.iter().flat_map(|w| std::iter::repeat_n(window_kernels(w.end - w.start), w.end - w.start)).collect();
        let mut off = 0;
        let mut misfits = Vec::new();
        for (k, sg) in segs.iter().enumerate() {
            let len = sg.tokens.len();
            // Alone, the segment's row i lies in the window of PF_WINDOW rows that holds it.
            let own = |i: usize| window_kernels((len - i / PF_WINDOW * PF_WINDOW).min(PF_WINDOW));
            if (0..len).any(|i| kernels[off + i] != own(i)) {
                misfits.push(k);
            }
            off += len;
        }
        if misfits.is_empty() {
            break;
        }
        for &k in misfits.iter().rev() {
            apart.push(shared.remove(k));
        }
    }
    apart.sort_unstable();
    let mut groups = vec![shared];
    let mut small: (Vec<usize>, usize) = (Vec::new(), 0);
    for i in apart {
        let len = segments[i].tokens.len();
        if len > NROW_MAX {
            groups.push(vec![i]);
            continue;
        }
        if small.1 + len > NROW_MAX {
            groups.push(std::mem::take(&mut small.0));
            small.1 = 0;
        }
        small.0.push(i);
        small.1 += len;
    }
    groups.push(small.0);
    groups.retain(|g| !g.is_empty());
    groups
}

/// A step's rows as the (region, position, token) triples the passes take.
fn triples(rows: &[Row]) -> Vec<(u32, u32, u32)> {
    rows.iter().map(|r| (r.region.0, r.pos, r.token)).collect()
}

/// Upload a matrix in parts of whole rows that each fit the device's storage range, its rows
/// in the device layout (`layout`).
fn upload_mat(gpu: &Arc<Gpu>, f: &GgufFile, name: &str) -> Result<Mat, VkError> {
    let t = tensor(f, name)?;
    let (rows, cols) = t.rows_cols();
    let data = f.tensor_data(t);
    let src_row = data.len() / rows.max(1);
    let row_bytes = crate::layout::device_row_bytes(t.ty, cols, src_row);
    let per = (gpu.info.max_storage_range as usize / row_bytes.max(1)).max(1);
    // Rows rearranged and written this many at a time (one 64 MiB staging copy each).
    let chunk = ((64usize << 20) / row_bytes.max(1)).max(1);
    let mut parts = Vec::new();
    let mut r0 = 0;
    while r0 < rows {
        let nr = per.min(rows - r0);
        let mut b = Buffer::new(gpu, (nr * row_bytes) as u64, Location::Device)?;
        let mut c0 = 0;
        while c0 < nr {
            let cn = chunk.min(nr - c0);
            let src = &data[(r0 + c0) * src_row..(r0 + c0 + cn) * src_row];
            b.write((c0 * row_bytes) as u64, &crate::layout::device_rows(t.ty, cols, src))?;
            c0 += cn;
        }
        parts.push((b, r0, nr));
        r0 += nr;
    }
    Ok(Mat { ty: t.ty, rows, cols, row_bytes, parts })
}

/// The CPU home's rope table: cos and sin of pos * base^(-2i/dims), in f64, cast to f32.
pub fn rope_table(n_ctx: usize, rope_dims: usize, base: f32) -> Vec<f32> {
    let inv: Vec<f64> = (0..rope_dims / 2).map(|i| (base as f64).powf(-2.0 * i as f64 / rope_dims as f64)).collect();
    let mut t = Vec::with_capacity(n_ctx * rope_dims);
    for p in 0..n_ctx {
        for f in &inv {
            let (s, c) = (p as f64 * f).sin_cos();
            t.push(c as f32);
            t.push(s as f32);
        }
    }
    t
}

/// Decide what goes where, before uploading anything; decline what this home does not serve.
fn plan(gpu: &Gpu, f: &GgufFile, cfg: &ModelConfig, opts: &VulkanOptions, counters: &Counters) -> Result<Plan, VkError> {
    if cfg.head_dim > MAX_HEAD_DIM || !cfg.head_dim.is_multiple_of(2) {
        return Err(decline(counters, format!("vulkan: head dimension {} (kernels take even sizes up to {MAX_HEAD_DIM})", cfg.head_dim)));
    }
    if opts.codec == KvCodec::Q8_0 && !cfg.head_dim.is_multiple_of(32) {
        return Err(decline(counters, format!("vulkan: the q8_0 K/V mirror needs a head dimension that is a multiple of 32, not {}", cfg.head_dim)));
    }
    let mut names = vec![resin_model::TOKEN_EMBD.to_string()];
    if !cfg.tied_output {
        names.push(resin_model::OUTPUT.to_string());
    }
    for l in 0..cfg.n_layer {
        let n = LayerNames::new(l);
        names.extend([n.q, n.k, n.v, n.attn_out, n.gate, n.up, n.down]);
    }
    let mut weights = 0u64;
    for name in &names {
        let t = tensor(f, name)?;
        let (rows, cols) = t.rows_cols();
        if format_name(t.ty).is_none() {
            return Err(decline(counters, format!("vulkan: {} weights have no kernel", t.ty)));
        }
        if cols % 32 != 0 {
            return Err(decline(counters, format!("vulkan: {name} rows of {cols} values (kernels take multiples of 32)")));
        }
        let row_bytes = t.size as usize / rows.max(1);
        if row_bytes as u64 > gpu.info.max_storage_range || !row_bytes.is_multiple_of(2) {
            return Err(decline(counters, format!("vulkan: {name} rows of {row_bytes} bytes")));
        }
        weights += (rows * crate::layout::device_row_bytes(t.ty, cols, row_bytes)) as u64;
    }
    // Bytes of one position of one layer's side in the codec (q8_0: 34 a block of 32).
    let side_row = opts.codec.bytes_for(cfg.kv_dim()) as u64;
    let kv_dim = cfg.kv_dim() as u64;
    let out_rows = NROW_MAX.max(opts.regions);
    // The first lane's scratch holds a window; the other lanes' (wide steps in lanes) N rows.
    let lanes = extra_lanes(opts.wide, opts.regions) as u64 * scratch_bytes(&gpu.info, cfg, NROW_MAX, NROW_MAX);
    let scratch_for = |n_ctx: usize| -> u64 { scratch_bytes(&gpu.info, cfg, out_rows, PF_WINDOW) + lanes + (n_ctx * cfg.rope_dims * 4) as u64 };
    let part_bytes = attn_part_floats(cfg, out_rows) as u64 * 4;
    let widest = (PF_WINDOW * cfg.n_ff.max(cfg.n_embd).max(cfg.q_dim()) * 4) as u64;
    if part_bytes.max(widest).max((out_rows * cfg.vocab * 4) as u64) > gpu.info.max_storage_range {
        return Err(decline(counters, format!("vulkan: a {PF_WINDOW}-row window's scratch is past the device's storage-buffer range")));
    }
    let budget = {
        let local = gpu.info.device_local_bytes();
        if local == 0 { u64::MAX } else { local / 10 * 9 }
    };
    let mut n_ctx = opts.n_ctx.unwrap_or(cfg.ctx_train.min(4096)).max(1);
    loop {
        let layer_side = opts.regions as u64 * n_ctx as u64 * side_row;
        let mirror = 2 * cfg.n_layer as u64 * layer_side;
        let scratch = scratch_for(n_ctx);
        let fits_range = layer_side <= gpu.info.max_storage_range && opts.regions as u64 * n_ctx as u64 * kv_dim < u32::MAX as u64;
        let fits_memory = weights + mirror + scratch <= budget;
        if fits_range && fits_memory {
            return Ok(Plan { n_ctx, q8_activations: opts.q8_activations, weights, mirror, scratch, out_rows });
        }
        let why = if fits_range { "device memory" } else { "the storage-buffer range of one layer's mirror" };
        if n_ctx <= 256 {
            return Err(decline(counters, format!("vulkan: the model and a {n_ctx}-position mirror do not fit {why}")));
        }
        let shorter = (n_ctx / 2).max(256);
        tracing::warn!("vulkan plan: {n_ctx} positions x {} regions do not fit {why}; shortening the context to {shorter}", opts.regions);
        n_ctx = shorter;
    }
}

impl Scratch {
    /// Scratch for passes of up to `rows` rows (PF_WINDOW or NROW_MAX: only windows and GEMM
    /// passes split K) landing up to `out_rows` logits rows; `scratch_bytes` counts it.
    fn new(gpu: &Arc<Gpu>, cfg: &ModelConfig, q8: bool, out_rows: usize, rows: usize) -> Result<Scratch, VkError> {
        let r = rows;
        let (split_part, split_done) = if rows > NROW_MAX { split_slot_bytes(&gpu.info, cfg) } else { (0, 0) };
        let dev = |n: usize| Buffer::new(gpu, (n * 4) as u64, Location::Device);
        let host = |n: usize| Buffer::new(gpu, (n * 4) as u64, Location::Host);
        Ok(Scratch {
            meta: host(r * META_WORDS)?,
            xg: dev(out_rows * cfg.n_embd)?,
            ag: dev(out_rows * cfg.q_dim())?,
            out_rows,
            x: dev(r * cfg.n_embd)?,
            xn: dev(r * cfg.n_embd)?,
            q: dev(r * cfg.q_dim())?,
            k: dev(r * cfg.kv_dim())?,
            v: dev(r * cfg.kv_dim())?,
            att: dev(r * cfg.q_dim())?,
            o: dev(r * cfg.n_embd)?,
            gate: dev(r * cfg.n_ff)?,
            up: dev(r * cfg.n_ff)?,
            down: dev(r * cfg.n_embd)?,
            part: dev(attn_part_floats(cfg, out_rows).max(out_rows * ARGMAX_PART_WORDS as usize))?,
            logits: dev(out_rows * cfg.vocab)?,
            logits_host: host(out_rows * cfg.vocab)?,
            ids: host(2 * out_rows)?,
            top_a: dev(2 * topk_pairs(cfg, out_rows))?,
            top_b: dev(2 * topk_pairs(cfg, out_rows))?,
            top_sel: dev(crate::kernels::topk_sel_words(out_rows as u32) as usize)?,
            top_host: host(2 * out_rows * TOPK_MAX as usize)?,
            rows_list: host(crate::kernels::rows_copy_words(out_rows as u32) as usize)?,
            xq32: dev(r * cfg.n_embd.max(cfg.q_dim()).max(cfg.n_ff))?,
            xq256: dev(r * cfg.n_embd.max(cfg.q_dim()).max(cfg.n_ff))?,
            xp32: Buffer::new(gpu, packed_bytes(cfg, 32), Location::Device)?,
            xp256: Buffer::new(gpu, packed_bytes(cfg, 256), Location::Device)?,
            q8,
            dot: q8 && crate::gemv_dot::dot_ok(&gpu.info),
            done: {
                let mut b = dev(WINDOW_ATTN_MIN_ROWS.max(HomeSpec::wide_rows(out_rows)) * cfg.n_head)?;
                b.fill_u32(0)?;
                b
            },
            split_part,
            split_done,
            gpart: Buffer::new(gpu, (SPLIT_SLOTS as u64 * split_part).max(4), Location::Device)?,
            gdone: {
                let mut b = Buffer::new(gpu, (SPLIT_SLOTS as u64 * split_done).max(4), Location::Device)?;
                b.fill_u32(0)?;
                b
            },
        })
    }
}

/// Bytes of the packed activations of NROW_MAX rows of the widest input, blocks of `block`.
fn packed_bytes(cfg: &ModelConfig, block: u32) -> u64 {
    let widest = cfg.n_embd.max(cfg.q_dim()).max(cfg.n_ff);
    let count = (NROW_MAX * widest.next_multiple_of(block as usize)) as u32;
    QPack::new(block, count).map(|q| q.bytes()).unwrap_or(4)
}

/// The activation block of `m` when an `n`-row pass runs it through the int8 dot GEMV.
fn dot_block(m: &Mat, n: usize, s: &Scratch) -> Option<u32> {
    if !s.dot || n > NROW_MAX || dot_format(m.ty).is_none() {
        return None;
    }
    act_block(m.ty).filter(|&b| m.cols.is_multiple_of(b as usize))
}

/// Which 8-bit activation roundings (blocks of 32, of 256) the matrices `ms` read.
fn act_blocks(ms: &[&Mat], s: &Scratch) -> [bool; 2] {
    let want = |block: u32| s.q8 && ms.iter().any(|m| act_block(m.ty) == Some(block) && m.cols % block as usize == 0);
    [want(32), want(256)]
}

/// Round the input of the matrices `ms` through the 8-bit blocks their formats read (once a
/// block size), then a barrier. The CPU home's integer dot products see these same values.
fn prep(rec: &mut Recorder<'_>, n: usize, x: &Buffer, ms: &[&Mat], s: &Scratch) -> Result<(), VkError> {
    let cols = ms[0].cols;
    let blocks = act_blocks(ms, s);
    for (want, block, y, xp) in [(blocks[0], 32u32, &s.xq32, &s.xp32), (blocks[1], 256, &s.xq256, &s.xp256)] {
        if !want {
            continue;
        }
        // Packed for the dot GEMV where it reads them, rounded as f32 for the others.
        if ms.iter().any(|m| dot_block(m, n, s) == Some(block)) {
            rec.qpack(QPack::new(block, (n * cols) as u32)?, x.into(), xp.into())?;
        }
        if ms.iter().any(|m| act_block(m.ty) == Some(block) && dot_block(m, n, s).is_none()) {
            rec.qact(block, (n * cols) as u32, x.into(), y.into())?;
        }
    }
    if blocks.iter().any(|&b| b) {
        rec.barrier();
    }
    Ok(())
}

/// gate <- silu(gate) * up as the input of `down`, then a barrier. Where `down` reads rounded or
/// packed activations, one dispatch writes them straight from gate and up (what swiglu then
/// `prep` would write; gate itself keeps the gate projection, which nothing reads after).
fn swiglu_for(rec: &mut Recorder<'_>, n: usize, down: &Mat, s: &Scratch) -> Result<(), VkError> {
    let count = (n * down.cols) as u32;
    let (g, u) = ((&s.gate).into(), (&s.up).into());
    let [b32, b256] = act_blocks(&[down], s);
    if b32 || b256 {
        let (block, xq, xp) = if b32 { (32, &s.xq32, &s.xp32) } else { (256, &s.xq256, &s.xp256) };
        if dot_block(down, n, s) == Some(block) {
            rec.swiglu_p(QPack::new(block, count)?, g, u, xp.into())?;
        } else {
            rec.swiglu_q(block, count, g, u, xq.into())?;
        }
    } else {
        rec.swiglu(count, g, u)?;
    }
    rec.barrier();
    Ok(())
}

/// The rounding of the decode attention's output for `attn_out` (n rows) that its combine can
/// write itself (what `prep` would write after it), or None where `prep` must.
fn attn_round<'a>(attn_out: &Mat, n: usize, cfg: &ModelConfig, s: &'a Scratch) -> Result<Option<AttnRound<'a>>, VkError> {
    let [b32, b256] = act_blocks(&[attn_out], s);
    if !(b32 || b256) {
        return Ok(None);
    }
    let (block, xq, xp) = if b32 { (32, &s.xq32, &s.xp32) } else { (256, &s.xq256, &s.xp256) };
    if attn_round_heads(block, cfg.head_dim as u32, cfg.n_head as u32).is_none() {
        return Ok(None);
    }
    Ok(Some(if dot_block(attn_out, n, s) == Some(block) {
        AttnRound::Packed { layout: QPack::new(block, (n * attn_out.cols) as u32)?, out: xp.into() }
    } else {
        AttnRound::Rounded { block, y: xq.into() }
    }))
}

/// out = rmsnorm(x (+= add)) * w, and in the same dispatch its rounding through the 8-bit
/// blocks the matrices `ms` read (what `prep` would do after it); then a barrier.
#[allow(clippy::too_many_arguments)]
fn norm_for(rec: &mut Recorder<'_>, rows: usize, x: &Buffer, add: Option<&Buffer>, w: &Buffer, out: &Buffer, ms: &[&Mat], s: &Scratch, p: NormPush) -> Result<(), VkError> {
    let [b32, b256] = act_blocks(ms, s);
    let add = add.map(Bind::from);
    let dots: Vec<Option<u32>> = ms.iter().map(|m| dot_block(m, rows, s)).collect();
    if dots.iter().all(|d| d.is_some()) {
        // Every matrix takes the dot GEMV: norm and pack in one dispatch.
        let p32 = dots.contains(&Some(32)).then(|| Bind::from(&s.xp32));
        let p256 = dots.contains(&Some(256)).then(|| Bind::from(&s.xp256));
        rec.rmsnorm_p(rows as u32, x.into(), add, w.into(), out.into(), p32, p256, p)?;
        rec.barrier();
        return Ok(());
    }
    if dots.iter().any(|d| d.is_some()) {
        // Mixed: norm, then pack and round what each matrix reads (prep).
        rec.rmsnorm(rows as u32, x.into(), add, w.into(), out.into(), p)?;
        rec.barrier();
        return prep(rec, rows, out, ms, s);
    }
    if b32 || b256 {
        let q32 = b32.then(|| Bind::from(&s.xq32));
        let q256 = b256.then(|| Bind::from(&s.xq256));
        rec.rmsnorm_q(rows as u32, x.into(), add, w.into(), out.into(), q32, q256, p)?;
    } else {
        rec.rmsnorm(rows as u32, x.into(), add, w.into(), out.into(), p)?;
    }
    rec.barrier();
    Ok(())
}

/// Where a pass's residual sum lives, and what is still to be added to it (the output of
/// attn_out or down: the norm that reads the sum next adds it).
struct Resid<'a> {
    x: &'a Buffer,
    add: Option<&'a Buffer>,
}

/// y = M (rmsnorm(x + add) * w) for each (M, y, y's row stride) of `ms`, n rows: the norm
/// dispatch (the add in place, rounded or packed for the matrices: `norm_for`, which marks
/// `norm_label` after its barrier), then the GEMVs; the caller puts the barrier after them.
/// The sum is then all of `r.x`.
#[allow(clippy::too_many_arguments)]
fn norm_mm(
    rec: &mut Recorder<'_>,
    n: usize,
    r: &mut Resid<'_>,
    w: &Buffer,
    ms: &[(&Mat, &Buffer, usize)],
    s: &Scratch,
    p: NormPush,
    clock: &mut Option<&mut StageClock<'_>>,
    norm_label: &str,
    l: usize,
) -> Result<(), VkError> {
    let mats: Vec<&Mat> = ms.iter().map(|(m, _, _)| *m).collect();
    norm_for(rec, n, r.x, r.add, w, &s.xn, &mats, s, p)?;
    r.add = None;
    mark(clock, rec.cmd, norm_label, l);
    for (slot, (m, y, stride)) in ms.iter().enumerate() {
        mm(rec, n, m, &s.xn, y, *stride, s, slot)?;
    }
    Ok(())
}

/// y[c][..] = M x[c] for the n rows, one dispatch per part; quantized formats read the
/// rounded activations `prep` (or a norm or swiglu fused with it) wrote. Up to NROW_MAX rows
/// take the GEMV (one-row or N-row form); more (a prefill window) the GEMM.
/// `slot`: which of the split-K scratch slots a GEMM takes (matrices recorded with no barrier
/// between them, as q, k and v, take different ones).
#[allow(clippy::too_many_arguments)]
fn mm(rec: &mut Recorder<'_>, n: usize, m: &Mat, x: &Buffer, y: &Buffer, y_stride: usize, s: &Scratch, slot: usize) -> Result<(), VkError> {
    let xin = match act_block(m.ty).filter(|_| s.q8) {
        Some(32) if m.cols.is_multiple_of(32) => &s.xq32,
        Some(256) if m.cols.is_multiple_of(256) => &s.xq256,
        _ => x,
    };
    for (i, (buf, r0, nr)) in m.parts.iter().enumerate() {
        let p = GemvPush { rows: *nr as u32, cols: m.cols as u32, row_bytes: m.row_bytes as u32, x_stride: m.cols as u32, y_stride: y_stride as u32, y_off: *r0 as u32 };
        if let Some(block) = dot_block(m, n, s) {
            let xp = if block == 32 { &s.xp32 } else { &s.xp256 };
            rec.gemv_dot(m.ty, n as u32, buf.into(), xp.into(), y.into(), p, QPack::new(block, (n * m.cols) as u32)?)?;
        } else if n <= NROW_MAX {
            rec.gemv(m.ty, n as u32, buf.into(), xin.into(), y.into(), p)?;
        } else {
            let split = s.split_part > 0 && crate::gemm::gemm_split(p.rows, p.cols).1 > 1;
            if split && i > 0 {
                rec.barrier(); // the parts of one matrix share its split-K slot
            }
            rec.gemm(m.ty, n as u32, buf.into(), xin.into(), y.into(), p, split.then(|| s.split_slot(slot)).transpose()?)?;
        }
    }
    Ok(())
}

/// Copy rows `idx[i]` of `src` to rows i of `dst` (`width` f32 a row), then a barrier.
fn gather(rec: &Recorder<'_>, src: &Buffer, dst: &Buffer, width: usize, idx: &[u32]) {
    let w = (width * 4) as u64;
    let regions: Vec<ash::vk::BufferCopy> = idx.iter().enumerate().map(|(i, &r)| ash::vk::BufferCopy { src_offset: r as u64 * w, dst_offset: i as u64 * w, size: w }).collect();
    // SAFETY: the command buffer is recording; both buffers hold the rows (sized for a window
    // and for out_rows rows) and are distinct.
    unsafe { rec.gpu.device.cmd_copy_buffer(rec.cmd, src.buffer, dst.buffer, &regions) };
}

/// What one pass computes: `n` rows (metadata rows 0..n) through every layer; `narrow` None
/// for a token command (every row lands logits), Some(rows) for a prefill window: the last
/// layer's attention output, FFN and the classifier run only for those rows (ascending; none:
/// the pass ends once the last layer's K/V are stored).
struct PassShape<'a> {
    n: usize,
    narrow: Option<&'a [u32]>,
    /// Copy the logits rows to the host (false: a greedy step reads only the argmax ids).
    to_host: bool,
    /// Select each row's TOP_CANDIDATES largest logits into `Scratch::top_host`.
    top: bool,
    /// Copy the logits rows `Scratch::rows_list` names to the first rows of `logits_host`.
    listed: bool,
}

/// What a token command reads back besides the argmax ids (which every pass computes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum ReadBack {
    /// The logits rows.
    Logits,
    /// Only the argmax ids.
    Ids,
    /// Each row's TOP_CANDIDATES largest logits (`Recorder::topk`), not the logits.
    Top,
    /// `Top`, and the whole logits rows the lane's `Scratch::rows_list` names (the streams of
    /// a top step whose draws need them).
    TopRows,
    /// The argmax ids and the whole logits rows `Scratch::rows_list` names.
    Rows,
}

impl ReadBack {
    const ALL: [ReadBack; 5] = [ReadBack::Ids, ReadBack::Logits, ReadBack::Top, ReadBack::TopRows, ReadBack::Rows];

    /// The least a step must read back for rows that need `needs`.
    fn for_needs(needs: &[Need]) -> ReadBack {
        let (top, logits) = (needs.contains(&Need::Top), needs.iter().filter(|&&n| n == Need::Logits).count());
        match (top, logits) {
            (_, l) if l == needs.len() => ReadBack::Logits,
            (false, 0) => ReadBack::Ids,
            (true, 0) => ReadBack::Top,
            (true, _) => ReadBack::TopRows,
            (false, _) => ReadBack::Rows,
        }
    }

    /// Whether the pass selects each row's top candidates.
    fn top(self) -> bool {
        matches!(self, ReadBack::Top | ReadBack::TopRows)
    }

    /// Whether the pass copies the listed rows' logits for the host.
    fn listed(self) -> bool {
        matches!(self, ReadBack::TopRows | ReadBack::Rows)
    }
}
const _: () = assert!(resin_core::TOP_CANDIDATES == crate::kernels::TOPK_MAX as usize);
// The home's top goes through the selection (a larger one would be sorted whole).
const _: () = assert!(crate::kernels::TOPK_MAX <= crate::kernels::TOPK_SLICES);

/// One pass: embed, every layer, final norm, classifier, argmax.
#[allow(clippy::too_many_arguments)]
fn record_pass(
    rec: &mut Recorder<'_>,
    shape: PassShape<'_>,
    cfg: &ModelConfig,
    codec: KvCodec,
    layers: &[Layer],
    embd: &Mat,
    output: Option<&Mat>,
    output_norm: &Buffer,
    rope: &Buffer,
    s: &Scratch,
    mut clock: Option<&mut StageClock<'_>>,
) -> Result<(), VkError> {
    let cmd = rec.cmd;
    let n = shape.n;
    let (d, nr) = (cfg.n_embd, n as u32);
    let norm = NormPush { n: d as u32, eps: cfg.rms_eps };
    for (buf, r0, rows) in &embd.parts {
        let p = EmbedPush { cols: d as u32, row_bytes: embd.row_bytes as u32, row_start: *r0 as u32, part_rows: *rows as u32 };
        rec.embed(embd.ty, nr, buf.into(), (&s.meta).into(), (&s.x).into(), p)?;
    }
    rec.barrier();
    mark(&mut clock, cmd, "embed", 0);
    let style = cfg.arch.rope_style();
    let flags = if cfg.qkv_bias { ROPE_BIAS } else { 0 } | if cfg.qk_norm { ROPE_QK_NORM } else { 0 };
    let rp = RopePush { n_head: cfg.n_head as u32, n_head_kv: cfg.n_head_kv as u32, head_dim: cfg.head_dim as u32, rope_dims: cfg.rope_dims as u32, flags, eps: cfg.rms_eps };
    let ap = AttnPush {
        n_head: cfg.n_head as u32,
        n_head_kv: cfg.n_head_kv as u32,
        head_dim: cfg.head_dim as u32,
        n_pieces: attn_pieces(n),
        scale: 1.0 / (cfg.head_dim as f32).sqrt(),
    };
    // The one-row token command's attention ropes and stores (the same bits as the rope_store
    // dispatch). The kernel serves any rows of regions of their
    // own (a peel's rows share one), but measured on the H200 (BENCHMARKS.md, thirteenth
    // session) it pays at one row only: the 1B's step 1,345 -> 1,268 us, the 3B's 3,095 ->
    // 3,000, while 8-row commands and 32-row wide steps lost 1-2%.
    let rope_in = shape.narrow.is_none() && n == 1 && !cfg.qk_norm && attn_rope_ok(codec, cfg.head_dim as u32);
    // After the last layer's attention a window keeps only the rows that need logits.
    let (mut r, mut att, mut m) = (Resid { x: &s.x, add: None }, &s.att, n);
    let out = output.unwrap_or(embd);
    for (l, ly) in layers.iter().enumerate() {
        let last = l + 1 == layers.len();
        // x += down (the previous layer's FFN), then q, k, v of norm(x) * attn_norm
        let qkv = [(&ly.q, &s.q, cfg.q_dim()), (&ly.k, &s.k, cfg.kv_dim()), (&ly.v, &s.v, cfg.kv_dim())];
        norm_mm(rec, n, &mut r, &ly.attn_norm, &qkv, s, norm, &mut clock, "attn_norm", l)?;
        rec.barrier();
        mark(&mut clock, cmd, "qkv", l);
        if !rope_in {
            let binds = [(&s.q).into(), (&s.k).into(), (&s.v).into(), (&ly.bias).into(), (&ly.qk_norm).into(), rope.into(), (&s.meta).into(), (&ly.mk).into(), (&ly.mv).into()];
            rec.rope_store(style, codec, nr, binds, rp)?;
            rec.barrier();
            mark(&mut clock, cmd, "rope_store", l);
        }
        if last && shape.narrow.is_some_and(|k| k.is_empty()) {
            // A window landing no logits: its last layer only stores K/V.
            return Ok(());
        }
        let mut rounded = false;
        if shape.narrow.is_some() && n >= WINDOW_ATTN_MIN_ROWS {
            // Flash-attention tiles: each K/V tile read once for a tile of query rows.
            rec.attention_window(codec, nr, (&s.q).into(), (&ly.mk).into(), (&ly.mv).into(), (&s.meta).into(), (&s.att).into(), ap)?;
        } else {
            // The combine rounds its output for attn_out itself, unless rows are gathered after.
            let round = if last && shape.narrow.is_some() { None } else { attn_round(&ly.attn_out, n, cfg, s)? };
            rounded = round.is_some();
            let own_rope = rope_in.then(|| AttnRope { k: (&s.k).into(), v: (&s.v).into(), bias: (&ly.bias).into(), table: rope.into(), rope_dims: cfg.rope_dims as u32, style, bias_on: cfg.qkv_bias });
            rec.attention_round(codec, nr, AttnBinds { q: (&s.q).into(), mk: (&ly.mk).into(), mv: (&ly.mv).into(), meta: (&s.meta).into(), part: (&s.part).into(), out: (&s.att).into() }, round, Some((&s.done).into()), own_rope, ap)?;
        }
        if last && shape.narrow.is_some() {
            rec.transfer_barrier(); // the gathers below copy
        } else {
            rec.barrier();
        }
        mark(&mut clock, cmd, "attention", l);
        if let (true, Some(keep)) = (last, shape.narrow) {
            if keep.len() > s.out_rows {
                return Err(VkError::Model(format!("{} logits rows in one pass (room for {})", keep.len(), s.out_rows)));
            }
            // r.x holds the previous layers' whole sum (the attention norm added the rest).
            gather(rec, r.x, &s.xg, d, keep);
            gather(rec, &s.att, &s.ag, cfg.q_dim(), keep);
            rec.transfer_barrier();
            (r.x, att, m) = (&s.xg, &s.ag, keep.len());
        }
        if !rounded {
            prep(rec, m, att, &[&ly.attn_out], s)?;
        }
        mm(rec, m, &ly.attn_out, att, &s.o, d, s, 0)?;
        rec.barrier();
        mark(&mut clock, cmd, "attn_out", l);
        // x += o, then gate and up of norm(x) * ffn_norm
        r.add = Some(&s.o);
        let gate_up = [(&ly.gate, &s.gate, cfg.n_ff), (&ly.up, &s.up, cfg.n_ff)];
        norm_mm(rec, m, &mut r, &ly.ffn_norm, &gate_up, s, norm, &mut clock, "ffn_norm", l)?;
        rec.barrier();
        mark(&mut clock, cmd, "gate_up", l);
        swiglu_for(rec, m, &ly.down, s)?;
        mark(&mut clock, cmd, "swiglu", l);
        mm(rec, m, &ly.down, &s.gate, &s.down, d, s, 0)?;
        rec.barrier();
        mark(&mut clock, cmd, "down", l);
        r.add = Some(&s.down);
    }
    let mr = m as u32;
    // x += down, then the classifier of norm(x) * output_norm (the sum is not read after)
    norm_mm(rec, m, &mut r, output_norm, &[(out, &s.logits, cfg.vocab)], s, norm, &mut clock, "output_norm", 0)?;
    rec.transfer_barrier(); // the logits are copied to the host below
    mark(&mut clock, cmd, "classifier", 0);
    rec.argmax(mr, cfg.vocab as u32, (&s.logits).into(), (&s.part).into(), (&s.ids).into())?;
    if shape.top {
        rec.topk(mr, cfg.vocab as u32, TOPK_MAX, (&s.logits).into(), (&s.top_a).into(), (&s.top_b).into(), (&s.top_sel).into(), (&s.top_host).into())?;
    }
    if shape.listed {
        rec.rows_copy(mr, cfg.vocab as u32, mr, (&s.logits).into(), (&s.rows_list).into(), (&s.logits_host).into())?;
    }
    if shape.to_host {
        let bytes = (m * cfg.vocab * 4) as u64;
        // SAFETY: the command buffer is recording; both buffers hold out_rows logits rows (m <= out_rows).
        unsafe { rec.gpu.device.cmd_copy_buffer(rec.cmd, s.logits.buffer, s.logits_host.buffer, &[ash::vk::BufferCopy { src_offset: 0, dst_offset: 0, size: bytes }]) };
    }
    mark(&mut clock, cmd, "argmax", 0);
    // Make the host-visible results available to the host.
    let mb = [ash::vk::MemoryBarrier::default().src_access_mask(ash::vk::AccessFlags::SHADER_WRITE | ash::vk::AccessFlags::TRANSFER_WRITE).dst_access_mask(ash::vk::AccessFlags::HOST_READ)];
    // SAFETY: the command buffer is recording.
    unsafe {
        rec.gpu.device.cmd_pipeline_barrier(
            rec.cmd,
            ash::vk::PipelineStageFlags::COMPUTE_SHADER | ash::vk::PipelineStageFlags::TRANSFER,
            ash::vk::PipelineStageFlags::HOST,
            ash::vk::DependencyFlags::empty(),
            &mb,
            &[],
            &[],
        )
    };
    Ok(())
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
        for &(lane, n, m) in &passes {
            let s = &self.lanes[lane].scratch;
            let ids = s.ids.read_u32(0, 2 * n).map_err(HomeError::from)?;
            let top = if back.top() { s.top_host.read_u32(0, 2 * n * k).map_err(HomeError::from)? } else { Vec::new() };
            let whole = if back == ReadBack::Logits { n } else { m };
            let logits = if whole > 0 { s.logits_host.read_f32(0, whole * vocab).map_err(HomeError::from)? } else { Vec::new() };
            let mut next_whole = 0;
            for (j, &need) in needs[at..at + n].iter().enumerate() {
                out.push(match need {
                    Need::Argmax => RowOut::Argmax(ids[2 * j]),
                    Need::Top => {
                        let row = &top[2 * k * j..2 * k * (j + 1)];
                        RowOut::Top(TopCandidates { argmax: ids[2 * j], top: row.chunks(2).map_while(|p| crate::kernels::topk_decode(p[0], p[1])).collect(), lse: f32::from_bits(ids[2 * j + 1]) })
                    }
                    Need::Logits => {
                        let i = if back == ReadBack::Logits { j } else { next_whole };
                        next_whole += 1;
                        RowOut::Logits(logits[i * vocab..(i + 1) * vocab].to_vec())
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
        for (l, ly) in self.layers.iter().enumerate() {
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
        for (l, ly) in self.layers.iter_mut().enumerate() {
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
}

impl Drop for VulkanHome {
    fn drop(&mut self) {
        // Nothing may be in flight when the buffers go (submit_wait waits, but be sure).
        let _ = self.gpu.wait_idle();
    }
}

#[cfg(test)]
mod wide_tests {
    use super::*;

    #[test]
    fn wide_modes_choose_lanes_or_one_pass_by_width() {
        let groups = |m: WideMode, n: usize, d: bool| m.passes(n, d).into_iter().map(|(_, r)| r).collect::<Vec<_>>();
        // Up to NROW_MAX rows: one token command in every mode.
        for m in [WideMode::Lanes, WideMode::Gemm, WideMode::Fast] {
            assert_eq!(m.passes(8, true), vec![(0, 8)]);
            assert_eq!(m.passes(1, true), vec![(0, 1)]);
        }
        // Lanes: balanced groups on lanes 0, 1, ...; rows sharing a region: one pass.
        assert_eq!(WideMode::Lanes.passes(17, true), vec![(0, 6), (1, 6), (2, 5)]);
        assert_eq!(groups(WideMode::Lanes, 64, true), vec![8; 8]);
        assert_eq!(WideMode::Lanes.passes(17, false), vec![(0, 17)]);
        // Gemm: always one pass.
        assert_eq!(WideMode::Gemm.passes(12, true), vec![(0, 12)]);
        // Fast: lanes below FAST_GEMM_MIN_ROWS, one pass from there.
        assert_eq!(groups(WideMode::Fast, FAST_GEMM_MIN_ROWS - 1, true), balanced_groups(FAST_GEMM_MIN_ROWS - 1, NROW_MAX));
        assert_eq!(WideMode::Fast.passes(FAST_GEMM_MIN_ROWS, true), vec![(0, FAST_GEMM_MIN_ROWS)]);
        assert_eq!(WideMode::Fast.passes(64, true), vec![(0, 64)]);
        // Lanes a home plans for its widest step: Fast never more than for 39 rows.
        assert_eq!(extra_lanes(WideMode::Fast, 64), (FAST_GEMM_MIN_ROWS - 1).div_ceil(NROW_MAX) - 1);
        assert_eq!(extra_lanes(WideMode::Fast, 16), 1);
        assert_eq!(extra_lanes(WideMode::Lanes, 64), 7);
        assert_eq!(extra_lanes(WideMode::Gemm, 64), 0);
    }
}
