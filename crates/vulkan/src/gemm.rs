//! Prefill GEMM: the weights times a window of activation rows (see shaders/ops/gemm.comp).
//!
//! `y[c * y_stride + y_off + r] = W[r] . x[c * x_stride ..]` for `r < rows`, `c < n`: the GEMV's
//! semantics ([`GemvPush`]'s fields mean what they mean there) for any `n >= 1` activation
//! rows. Two tiers from one shader body:
//! - [`GemmTier::Tiled`], portable: tiles of 64 weight rows x 8..64 activation rows
//!   ([`tiled_tile_n`]), weights dequantized once per tile and K step into shared memory
//!   (at most 16 KiB), f32 throughout.
//! - [`GemmTier::CoopMat`]: tiles of 64 weight rows x 64 or 128 activation rows
//!   ([`coopmat_tile_n`]) through `GL_KHR_cooperative_matrix` 16x16x16
//!   f16 x f16 -> f32 (weights and activations rounded to f16). Chosen by [`pick_tier`] only
//!   when the device offers that shape and everything else the module needs.

use resin_gguf::GgmlType;

use crate::device::{CoopShape, DeviceInfo};
use crate::kernels::{format_name, GemvPush, Push, Recorder};
use crate::pipelines::Bind;
use crate::VkError;

/// Weight rows a workgroup tile covers (BM in the shader).
pub const TILE_ROWS: u32 = 64;
/// Activation rows of the portable tier's widest tile and of the cooperative-matrix tier's
/// narrower one (BN in the shader).
pub const TILE_N: u32 = 64;
/// Threads of a portable-tier workgroup (the shader's literal local size).
pub const TILED_THREADS: u32 = 128;
/// Subgroups a cooperative-matrix workgroup of a `tile_n`-row activation tile is sized for:
/// one per 32x32 region of the 64 x `tile_n` tile.
pub const fn coopmat_subgroups(tile_n: u32) -> u32 {
    (TILE_ROWS / 32) * (tile_n / 32)
}
/// Those of the 64-row activation tile (the one every cooperative-matrix device runs).
pub const COOPMAT_SUBGROUPS: u32 = coopmat_subgroups(TILE_N);
/// The widest activation tile of the cooperative-matrix tier.
pub const COOPMAT_TILE_N_MAX: u32 = 128;
/// Shared memory of the cooperative-matrix tier at `ku` 32-value units a K step and `tile_n`
/// activation rows a tile: f16 weights (64 rows) and activations (`tile_n` rows), each row
/// padded by 8 values, and a 16x16 f32 staging slot a 32x32 region.
pub const fn coopmat_shared_bytes(ku: u32, tile_n: u32) -> u32 {
    (TILE_ROWS + tile_n) * (32 * ku + 8) * 2 + coopmat_subgroups(tile_n) * 16 * 16 * 4
}

/// Activation rows a portable-tier tile covers for a pass of `n` rows: `n` rounded up to a
/// power of two from 8 to [`TILE_N`], so a short window's threads do not multiply rows of
/// zeros (each output's sum runs over K in the same order in every tile: the same bits).
pub fn tiled_tile_n(n: u32) -> u32 {
    n.clamp(8, TILE_N).next_power_of_two()
}

/// Activation rows a cooperative-matrix tile covers for a pass of `n` rows: 128 when the pass
/// has more than 64 (each weight unit dequantized once for twice the rows), else 64. A row's
/// sums are the same 16x16x16 products in the same K order in either tile, so its result does
/// not depend on the choice.
pub fn coopmat_tile_n(n: u32) -> u32 {
    if n > 64 {
        COOPMAT_TILE_N_MAX
    } else {
        TILE_N
    }
}

/// Whether a device of subgroup size `sg`, at most `max_threads` a workgroup and
/// `shared_memory` bytes of it runs the cooperative-matrix tile of `tile_n` activation rows
/// (a subgroup a 32x32 region): the workgroup, its shared memory, and a K step's activation
/// quads held in registers (gemm.comp MAXXP: tile_n * KU * 8 quads over the threads, at most
/// 16 each). The home falls back to the 64-row tile where the 128-row one does not fit.
pub fn coopmat_tile_fits(tile_n: u32, sg: u32, max_threads: u32, shared_memory: u32) -> bool {
    let wg = coopmat_subgroups(tile_n) * sg;
    let ku = coopmat_k_units(wg);
    wg >= 32 && wg <= max_threads && coopmat_shared_bytes(ku, tile_n) <= shared_memory && tile_n * ku * 8 <= 16 * wg
}

/// 32-value units the cooperative-matrix tier stages a K step for a workgroup of `wg` threads:
/// 2, cut to wg / 32 (a thread holds at most 8 weight pieces and 16 activation quads of a step
/// in registers: gemm.comp `fetch`). The results do not depend on it.
pub fn coopmat_k_units(wg: u32) -> u32 {
    2.min(wg / 32).max(1)
}

/// The GEMV's push block plus the activation-row count (the shader's `Push`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct GemmPush {
    pub rows: u32,
    pub cols: u32,
    pub row_bytes: u32,
    pub x_stride: u32,
    pub y_stride: u32,
    pub y_off: u32,
    pub n: u32,
    /// 32-value units a K piece, and the pieces (1: no split; see [`gemm_split`]).
    pub upp: u32,
    pub pieces: u32,
}
const _: () = assert!(std::mem::size_of::<GemmPush>() == 36);
impl Push for GemmPush {}

impl GemmPush {
    /// `split`: cut K as [`gemm_split`] says for the shape (else one piece).
    pub fn new(p: GemvPush, n: u32, split: bool) -> Self {
        let (upp, pieces) = if split { gemm_split(p.rows, p.cols) } else { ((p.cols / 32).max(1), 1) };
        GemmPush { rows: p.rows, cols: p.cols, row_bytes: p.row_bytes, x_stride: p.x_stride, y_stride: p.y_stride, y_off: p.y_off, n, upp, pieces }
    }
}

/// Weight-row tiles x K pieces a matrix is cut into at least, where its K allows: about two
/// workgroups for each of a large GPU's compute units, whatever the activation rows.
const SPLIT_TARGET: u32 = 256;
/// A K piece holds at least this many 32-value units (its partial sums must be worth writing).
const SPLIT_MIN_UNITS: u32 = 16;
/// pieces x weight rows stays within this, which bounds the partial sums a split writes.
const SPLIT_MAX_ROWS: u32 = 8192;

/// How the GEMM of a `rows` x `cols` matrix cuts K: (32-value units a piece, pieces). From the
/// matrix's shape alone, never from the activation rows, so each row's result is the same
/// whatever rows share the pass. A matrix of few weight-row tiles (a wide step's or a small
/// model's) takes more pieces.
pub fn gemm_split(rows: u32, cols: u32) -> (u32, u32) {
    let units = (cols / 32).max(1);
    let max_rows = SPLIT_MAX_ROWS;
    let tiles = rows.div_ceil(TILE_ROWS).max(1);
    let want = SPLIT_TARGET.div_ceil(tiles).min(units / SPLIT_MIN_UNITS).min(max_rows / rows.max(1)).max(1);
    // Whole K steps of the cooperative-matrix tier (at most 4 units) in every piece but the last.
    let upp = units.div_ceil(want).next_multiple_of(4).min(units);
    (upp, units.div_ceil(upp))
}

/// Floats of partial sums a split GEMM of a `rows` x `cols` matrix over `n` activation rows
/// writes (0 when it does not split).
pub fn gemm_part_floats(rows: u32, cols: u32, n: u32) -> usize {
    let (_, pieces) = gemm_split(rows, cols);
    if pieces == 1 {
        return 0;
    }
    // Either activation tile (64 or 128 rows) fits: tiles x their rows covers n rounded up.
    (rows.div_ceil(TILE_ROWS) * pieces) as usize * (TILE_ROWS * n.next_multiple_of(COOPMAT_TILE_N_MAX)) as usize
}

/// Counter words a split GEMM of `rows` weight rows over `n` activation rows uses (a tile each,
/// at the narrowest activation tile).
pub fn gemm_done_words(rows: u32, n: u32) -> usize {
    (rows.div_ceil(TILE_ROWS) * n.div_ceil(TILE_N)) as usize
}

/// Where a split GEMM keeps its partial sums and per-tile counters (zero between dispatches:
/// the last workgroup of a tile sets its word back). GEMMs running at once need their own.
#[derive(Clone, Copy)]
pub struct GemmSplit<'a> {
    pub part: Bind<'a>,
    pub done: Bind<'a>,
}

/// Which GEMM kernel runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GemmTier {
    /// Shared-memory tiles in f32; every device.
    Tiled,
    /// Cooperative-matrix 16x16x16 f16 -> f32 tiles.
    CoopMat,
}

/// What the tier choice reads from the device (a plain struct, so the choice is testable
/// without one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GemmCaps {
    /// VK_KHR_cooperative_matrix present and its feature enabled.
    pub coopmat: bool,
    pub coopmat_shapes: Vec<CoopShape>,
    /// shaderFloat16 (the module declares the Float16 capability).
    pub f16_arith: bool,
    /// The device's Vulkan version (the module is SPIR-V 1.6: Vulkan 1.3).
    pub api: (u32, u32, u32),
    /// Subgroup operations in compute shaders (the module uses gl_SubgroupID: "basic").
    pub subgroup_basic: bool,
    pub subgroup_size: u32,
    pub max_workgroup_invocations: u32,
    pub shared_memory: u32,
    /// The vulkanMemoryModel feature enabled at device creation: glslang emits the
    /// VulkanMemoryModel capability for every GL_KHR_cooperative_matrix module.
    pub vulkan_memory_model: bool,
}

impl GemmCaps {
    pub fn of(info: &DeviceInfo) -> GemmCaps {
        GemmCaps {
            coopmat: info.coopmat,
            coopmat_shapes: info.coopmat_shapes.clone(),
            f16_arith: info.f16_arith,
            api: info.api,
            subgroup_basic: info.subgroup_ops.contains(&"basic"),
            subgroup_size: info.subgroup_size,
            max_workgroup_invocations: info.max_workgroup_invocations,
            shared_memory: info.shared_memory,
            vulkan_memory_model: info.vulkan_memory_model,
        }
    }
}

/// Whether the device offers the 16x16x16 f16 x f16 -> f32 subgroup shape the tier uses.
pub fn has_f16_16x16x16(shapes: &[CoopShape]) -> bool {
    shapes.iter().any(|s| s.m == 16 && s.n == 16 && s.k == 16 && s.types == "f16xf16->f32")
}

/// The tier a device runs: the cooperative-matrix tier only when every requirement of its
/// module holds, else the portable tier.
///
/// The shape must accumulate in f32: a 16x16x16 shape with f16 results only is declined (an
/// f16 sum over thousands of products loses the precision the GEMV keeps).
pub fn pick_tier(c: &GemmCaps) -> GemmTier {
    let wg = COOPMAT_SUBGROUPS * c.subgroup_size;
    let ok = c.coopmat
        && has_f16_16x16x16(&c.coopmat_shapes)
        && c.f16_arith
        && c.api >= (1, 3, 0)
        && c.subgroup_basic
        && c.subgroup_size > 0
        && wg <= c.max_workgroup_invocations
        && wg >= 32
        && coopmat_shared_bytes(coopmat_k_units(wg), TILE_N) <= c.shared_memory
        && c.vulkan_memory_model;
    if ok {
        GemmTier::CoopMat
    } else {
        GemmTier::Tiled
    }
}

/// Workgroups of a GEMM of `tile_n`-row activation tiles: x over weight-row tiles, y over
/// activation-row tiles, z over K pieces.
pub fn gemm_grid(rows: u32, n: u32, pieces: u32, tile_n: u32) -> Result<[u32; 3], VkError> {
    let tm = rows.div_ceil(TILE_ROWS).max(1);
    let tn = n.div_ceil(tile_n.max(1)).max(1);
    if tn > 65535 || tm > 65535 || pieces > 65535 {
        return Err(VkError::TooLarge(format!("GEMM of {rows} weight rows x {n} activation rows")));
    }
    Ok([tm, tn, pieces.max(1)])
}

/// The variant name of a format and tier.
pub fn gemm_variant(ty: GgmlType, tier: GemmTier) -> Result<String, VkError> {
    let f = format_name(ty).ok_or_else(|| VkError::Unsupported(format!("no GEMM kernel for {ty}")))?;
    Ok(match tier {
        GemmTier::Tiled => format!("gemm_{f}"),
        GemmTier::CoopMat => format!("gemm_cm_{f}"),
    })
}

impl Recorder<'_> {
    /// y[c * y_stride + y_off + r] = W[r] . x[c] for c < n (any n >= 1), in the tier
    /// [`pick_tier`] chooses for this device.
    /// With `split` a matrix whose shape splits K ([`gemm_split`]) runs in pieces, the buffers
    /// holding at least [`gemm_part_floats`] floats and [`gemm_done_words`] zeroed words;
    /// without, in one. (The home splits only in the cooperative-matrix tier: the portable
    /// tier's devices are small, and its unsplit sums run in the CPU home's order, which keeps
    /// its 8-bit activation roundings closest to the oracle's.)
    #[allow(clippy::too_many_arguments)]
    pub fn gemm(&mut self, ty: GgmlType, n: u32, w: Bind<'_>, x: Bind<'_>, y: Bind<'_>, p: GemvPush, split: Option<GemmSplit<'_>>) -> Result<(), VkError> {
        let tier = pick_tier(&GemmCaps::of(&self.gpu.info));
        self.gemm_in(tier, ty, n, w, x, y, p, split)
    }

    /// [`Recorder::gemm`] in a given tier (tests force the portable one; the cooperative-matrix
    /// tier is refused on a device without the shape).
    #[allow(clippy::too_many_arguments)]
    pub fn gemm_in(&mut self, tier: GemmTier, ty: GgmlType, n: u32, w: Bind<'_>, x: Bind<'_>, y: Bind<'_>, p: GemvPush, split: Option<GemmSplit<'_>>) -> Result<(), VkError> {
        let name = gemm_variant(ty, tier)?;
        if n == 0 || p.cols == 0 || !p.cols.is_multiple_of(32) {
            return Err(VkError::Unsupported(format!("GEMM of {n} activation rows over {} values a row", p.cols)));
        }
        if !p.cols.is_multiple_of(ty.block_len() as u32) {
            return Err(VkError::Unsupported(format!("{ty} rows of {} values", p.cols)));
        }
        // K-quant blocks are read 16 bytes at a time (formats.glsl with HAVE_WDATA4).
        if !w.offset.is_multiple_of(16) {
            return Err(VkError::Unsupported(format!("GEMM weights at byte {} (16-byte aligned needed)", w.offset)));
        }
        let gp = GemmPush::new(p, n, split.is_some());
        let push = gp.bytes();
        // Unsplit, the partial-sum bindings are never touched: y stands in for them.
        let (part, done) = split.map_or((y, y), |s| (s.part, s.done));
        if gp.pieces > 1 && (part.range < gemm_part_floats(p.rows, p.cols, n) as u64 * 4 || done.range < gemm_done_words(p.rows, n) as u64 * 4) {
            return Err(VkError::Unsupported(format!("split GEMM of {} x {} over {n} rows: partial-sum buffers too small", p.rows, p.cols)));
        }
        match tier {
            GemmTier::Tiled => {
                let tile_n = tiled_tile_n(n);
                self.run(&name, &[tile_n / 8], &[w, x, y, part, done], &push, gemm_grid(p.rows, n, gp.pieces, tile_n)?)
            }
            GemmTier::CoopMat => {
                let info = &self.gpu.info;
                if !info.coopmat || !has_f16_16x16x16(&info.coopmat_shapes) {
                    return Err(VkError::Unsupported("cooperative-matrix GEMM: no 16x16x16 f16 x f16 -> f32 shape on this device".into()));
                }
                let sg = info.subgroup_size.max(1);
                let tile_n = Some(coopmat_tile_n(n)).filter(|&t| coopmat_tile_fits(t, sg, info.max_workgroup_invocations, info.shared_memory)).unwrap_or(TILE_N);
                let wg = coopmat_subgroups(tile_n) * sg;
                if wg < 32 {
                    return Err(VkError::Unsupported(format!("cooperative-matrix GEMM: workgroups of {wg} threads (32 or more)")));
                }
                // The tier reads x four values at a time.
                if !x.offset.is_multiple_of(16) || !p.x_stride.is_multiple_of(4) {
                    return Err(VkError::Unsupported(format!(
                        "cooperative-matrix GEMM: activations at byte {} with a stride of {} values (16-byte aligned rows needed)",
                        x.offset, p.x_stride
                    )));
                }
                self.run(&name, &[wg, coopmat_k_units(wg), tile_n / 32], &[w, x, y, part, done], &push, gemm_grid(p.rows, n, gp.pieces, tile_n)?)
            }
        }
    }
}
