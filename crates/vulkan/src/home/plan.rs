//! The residency plan: what goes where, in bytes, before anything is uploaded; the
//! declines of what this home does not serve.

use resin_core::{Counters, HomeSpec, KvCodec, NROW_MAX, PF_WINDOW};
use resin_gguf::GgufFile;
use resin_model::{LayerNames, ModelConfig};

use crate::attn_window::WINDOW_PIECES;
use crate::device::Gpu;
use crate::kernels::*;
use crate::VkError;

use super::*;

/// Bytes of one split-K slot (partial sums, counters) for the matrices of `cfg` over up to
/// PF_WINDOW activation rows, rounded up to the device's storage-offset alignment; none where
/// the device's GEMM tier does not split (only the cooperative-matrix tier does: see
/// Recorder::gemm).
pub(super) fn split_slot_bytes(info: &crate::device::DeviceInfo, cfg: &ModelConfig) -> (u64, u64) {
    if crate::gemm::pick_tier(&crate::gemm::GemmCaps::of(info)) != crate::gemm::GemmTier::CoopMat {
        return (0, 0);
    }
    let (d, q, kv, ff) = (cfg.n_embd as u32, cfg.q_dim() as u32, cfg.kv_dim() as u32, cfg.n_ff as u32);
    // (rows, cols) of every matrix a pass multiplies; the classifier's rows never split K
    // (its many row tiles fill the device), but it is counted the same way.
    // A mixture of experts' router too (the experts take the canonical product).
    let router = cfg.moe.map_or((q, d), |m| (m.n_expert as u32, d));
    let shapes = [(q, d), (kv, d), (d, q), (ff, d), (d, ff), (cfg.vocab as u32, d), router];
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
    /// Rows from which a `WideMode::Lanes` step is one canonical pass (`usize::MAX`: never).
    pub canon_from: usize,
    /// Rows up to which a step's pass takes the canonical product (`canon_rows`).
    pub canon_rows: usize,
}

/// Windows of at least this many rows take the tiled (flash) attention; fewer rows the
/// decode kernel, whose key pieces spread a short window over more workgroups.
pub(super) const WINDOW_ATTN_MIN_ROWS: usize = 16;

/// Rows x key pieces the attention partials hold: the decode attention's rows (a window's,
/// fewer than WINDOW_ATTN_MIN_ROWS; a step's, up to `step_rows`) in ATTN_SLOTS pieces each, and
/// a window's rows in WINDOW_PIECES each.
pub(super) fn part_rows(step_rows: usize) -> usize {
    (PF_WINDOW * WINDOW_PIECES as usize).max(step_rows * ATTN_SLOTS as usize)
}

/// Floats of the decode attention's partials for a home landing `out_rows` logits rows.
pub(super) fn attn_part_floats(cfg: &ModelConfig, out_rows: usize) -> usize {
    attn_part_len(part_rows(HomeSpec::wide_rows(out_rows)), cfg.n_head, cfg.head_dim, 1)
}

const _: () = assert!((WINDOW_ATTN_MIN_ROWS - 1) * ATTN_SLOTS as usize <= PF_WINDOW && NROW_MAX * ATTN_SLOTS as usize <= PF_WINDOW);

/// Bytes of a scratch for passes of up to `rows` rows landing `out_rows` logits rows, rope
/// table aside (what `Scratch::new` allocates).
pub(super) fn scratch_bytes(info: &crate::device::DeviceInfo, cfg: &ModelConfig, out_rows: usize, rows: usize, canon_rows: usize) -> u64 {
    let widest = cfg.n_embd.max(cfg.q_dim()).max(cfg.n_ff);
    let per_row = 4 * cfg.n_embd + 2 * cfg.q_dim() + 2 * cfg.kv_dim() + 2 * cfg.n_ff + 2 * widest + META_WORDS + moe_slot_words(cfg);
    let out = out_rows * (2 * cfg.vocab + cfg.n_embd + cfg.q_dim() + 1) + 2 * canon_rows.max(NROW_MAX) * widest;
    let (sp, sd) = if rows > NROW_MAX { split_slot_bytes(info, cfg) } else { (0, 0) };
    let out = out
        + SPLIT_SLOTS * (sp + sd) as usize / 4
        + 4 * topk_pairs(cfg, out_rows)
        + crate::kernels::topk_sel_words(out_rows as u32) as usize
        + 2 * out_rows * TOPK_MAX as usize
        + crate::kernels::rows_copy_words(out_rows as u32) as usize;
    ((rows * per_row + out + attn_part_floats(cfg, out_rows)) * 4) as u64
}

/// Experts a row of a mixture-of-experts model runs (0 for a dense model).
pub(super) fn moe_used(cfg: &ModelConfig) -> usize {
    cfg.moe.map_or(0, |m| m.n_expert_used)
}

/// Words a row of the mixture-of-experts scratch (`Scratch::moe_*`): its router logits, its
/// packed normed input and r (`Scratch::xpn`, `rs`: the grouped product takes windows too),
/// and each of its slots' gate, up, activation and down rows, expert id and weight.
pub(super) fn moe_slot_words(cfg: &ModelConfig) -> usize {
    let packed = if cfg.moe.is_some() { cfg.n_embd + 1 } else { 0 };
    moe_experts(cfg) + packed + moe_used(cfg) * (3 * cfg.n_ff + cfg.n_embd + 2)
}

/// Experts of a mixture-of-experts model (0 for a dense model).
pub(super) fn moe_experts(cfg: &ModelConfig) -> usize {
    cfg.moe.map_or(0, |m| m.n_expert)
}

/// Key pairs of each of the top-k's scratch lists for `out_rows` rows.
pub(super) fn topk_pairs(cfg: &ModelConfig, out_rows: usize) -> usize {
    crate::kernels::topk_scratch_pairs(out_rows as u32, cfg.vocab as u32, TOPK_MAX) as usize
}

/// Lanes beyond the first a home of `regions` regions takes for its widest step in `wide` mode
/// (`canon_from`: see `WideMode::passes`).
pub(super) fn extra_lanes(wide: WideMode, regions: usize, canon_from: usize) -> usize {
    let widest = HomeSpec::wide_rows(regions);
    match wide {
        WideMode::Lanes => widest.min(canon_from.saturating_sub(1).max(NROW_MAX)).div_ceil(NROW_MAX) - 1,
        WideMode::Fast => widest.min(FAST_GEMM_MIN_ROWS - 1).div_ceil(NROW_MAX) - 1,
        WideMode::Gemm | WideMode::Canon => 0,
    }
}

/// Rows up to which a step's pass takes the canonical product: a token command's, or the
/// widest step's where a step may be one canonical pass (`WideMode::Canon`, or `Lanes` from
/// `canon_from` rows).
pub(super) fn canon_rows(wide: WideMode, regions: usize, canon_from: usize) -> usize {
    let widest = HomeSpec::wide_rows(regions);
    match wide {
        WideMode::Canon => widest.max(NROW_MAX),
        WideMode::Lanes if widest >= canon_from => widest,
        _ => NROW_MAX,
    }
}

/// Rows from which `WideMode::Lanes` takes one canonical pass on this device: where it has the
/// int8 tiles (mm.comp), CANON_WIDE_MIN_ROWS; elsewhere never (mr.comp's registers were not
/// measured against the lanes there).
pub(super) fn canon_from(info: &crate::device::DeviceInfo) -> usize {
    if crate::mv::tiles_ok(info) {
        CANON_WIDE_MIN_ROWS
    } else {
        usize::MAX
    }
}

pub(super) fn decline(counters: &Counters, reason: String) -> VkError {
    if counters.decline(&reason) {
        tracing::warn!("vulkan home declines: {reason}; the CPU home serves");
    }
    VkError::Unsupported(reason)
}

/// Decide what goes where, before uploading anything; decline what this home does not serve.
pub(super) fn plan(gpu: &Gpu, f: &GgufFile, cfg: &ModelConfig, opts: &VulkanOptions, counters: &Counters) -> Result<Plan, VkError> {
    if let Some(m) = cfg.moe {
        if m.n_expert > MOE_MAX_EXPERTS as usize || m.n_expert_used > MOE_MAX_USED as usize {
            return Err(decline(
                counters,
                format!("vulkan: mixture-of-experts models of {} experts, {} a row (kernels take up to {MOE_MAX_EXPERTS}, {MOE_MAX_USED} a row)", m.n_expert, m.n_expert_used),
            ));
        }
        for l in 0..cfg.n_layer {
            let t = tensor(f, &LayerNames::new(l).gate_inp)?;
            if t.rows_cols() != (m.n_expert, cfg.n_embd) {
                return Err(decline(counters, format!("vulkan: a router of {:?} (rows, cols)", t.rows_cols())));
            }
        }
    }
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
        names.extend([n.q, n.k, n.v, n.attn_out]);
        if cfg.moe.is_some() {
            names.extend([n.gate_exps, n.up_exps, n.down_exps]);
        } else {
            names.extend([n.gate, n.up, n.down]);
        }
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
        let dev_bytes = (rows * crate::layout::device_row_bytes(t.ty, cols, row_bytes)) as u64;
        if t.dims.len() > 2 && (dev_bytes > gpu.info.max_storage_range || dev_bytes > u32::MAX as u64) {
            // The expert GEMV addresses a stack's bytes in one binding with 32-bit offsets.
            return Err(decline(counters, format!("vulkan: {name}'s {dev_bytes} bytes of experts are past one storage binding")));
        }
        weights += dev_bytes;
    }
    // Bytes of one position of one layer's side in the codec (q8_0: 34 a block of 32).
    let side_row = opts.codec.bytes_for(cfg.kv_dim()) as u64;
    let kv_dim = cfg.kv_dim() as u64;
    let out_rows = NROW_MAX.max(opts.regions);
    // The first lane's scratch holds a window; the other lanes' (wide steps in lanes) N rows.
    let canon_from = canon_from(&gpu.info);
    let canon_rows = canon_rows(opts.wide, opts.regions, canon_from);
    let lanes = extra_lanes(opts.wide, opts.regions, canon_from) as u64 * scratch_bytes(&gpu.info, cfg, NROW_MAX, NROW_MAX, NROW_MAX);
    let tables = cfg.rope_bases().len();
    let scratch_for = |n_ctx: usize| -> u64 { scratch_bytes(&gpu.info, cfg, out_rows, PF_WINDOW, canon_rows) + lanes + (tables * n_ctx * cfg.rope_dims * 4) as u64 };
    let part_bytes = attn_part_floats(cfg, out_rows) as u64 * 4;
    let widest = (PF_WINDOW * cfg.n_ff.max(cfg.n_embd).max(cfg.q_dim()) * 4) as u64;
    if part_bytes.max(widest).max((out_rows * cfg.vocab * 4) as u64) > gpu.info.max_storage_range {
        return Err(decline(counters, format!("vulkan: a {PF_WINDOW}-row window's scratch is past the device's storage-buffer range")));
    }
    let budget = {
        let local = gpu.info.device_local_bytes();
        if local == 0 {
            u64::MAX
        } else {
            local / 10 * 9
        }
    };
    let mut n_ctx = opts.n_ctx.unwrap_or(cfg.ctx_train.min(4096)).max(1);
    loop {
        let layer_side = opts.regions as u64 * n_ctx as u64 * side_row;
        let mirror = 2 * cfg.n_layer as u64 * layer_side;
        let scratch = scratch_for(n_ctx);
        let fits_range = layer_side <= gpu.info.max_storage_range && opts.regions as u64 * n_ctx as u64 * kv_dim < u32::MAX as u64;
        let fits_memory = weights + mirror + scratch <= budget;
        if fits_range && fits_memory {
            return Ok(Plan { n_ctx, q8_activations: opts.q8_activations, weights, mirror, scratch, out_rows, canon_from, canon_rows });
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
