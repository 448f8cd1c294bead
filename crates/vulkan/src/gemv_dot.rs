//! The int8 dot-product tier of the decode GEMV: activations packed as int8 blocks
//! ([`Recorder::qpack`], `shaders/ops/qact.comp` with `QPACK`), then per weight row one subgroup
//! that takes exact integer dot products of the weight quants with the activation quants and
//! scales them in float ([`Recorder::gemv_dot`], `shaders/ops/gemv.comp` with `TIER_DOT`, the
//! formats' side in `shaders/common/dotfmt.glsl`). It reads 1 byte (+ a scale and a sum per
//! block) an activation instead of the f32 the other tiers read.
//!
//! Packed layout ([`QPack`]) of `count` values (n activation rows of `cols` values, row c
//! starting at value c * cols) in one buffer of 32-bit words:
//!
//! | words | what |
//! | --- | --- |
//! | `[0, count/4)` | the quants q (int8), value 4i+k in byte k of word i |
//! | `[d_off, d_off + count/block)`, `d_off = count/4` | d of each block (f32), amax/127 as `qact` |
//! | `[s_off, s_off + count/sum_group)`, `s_off = d_off + count/block` | sum of the quants of each `sum_group` values (i32) |
//!
//! `block` is 32 (Q4_0..Q8_0, ggml's q8_0/q8_1) or 256 (K-quants, q8_K); `sum_group` 32 or 16.
//! `float(q) * d` is `qact`'s output bit for bit, so this tier multiplies the same numbers as
//! the other tiers fed by `qact`.

use resin_gguf::GgmlType;

use crate::device::DeviceInfo;
use crate::kernels::{act_block, format_name, grid, CountPush, GemvPush, GemvTier, Push, Recorder};
use crate::pipelines::Bind;
use crate::VkError;

/// The layout of `count` packed activations in blocks of `block` values (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QPack {
    pub block: u32,
    pub count: u32,
}

impl QPack {
    /// The layout for `count` values in blocks of `block` (32 or 256); `count` a multiple of it.
    pub fn new(block: u32, count: u32) -> Result<QPack, VkError> {
        if block != 32 && block != 256 {
            return Err(VkError::Unsupported(format!("packed activation blocks of {block}")));
        }
        if count == 0 || !count.is_multiple_of(block) {
            return Err(VkError::Unsupported(format!("{count} packed activations in blocks of {block}")));
        }
        Ok(QPack { block, count })
    }
    /// The layout a weight format's dot GEMV reads (None for formats without one).
    pub fn for_type(ty: GgmlType, count: u32) -> Option<Result<QPack, VkError>> {
        dot_format(ty)?;
        act_block(ty).map(|b| QPack::new(b, count))
    }
    /// Values per int sum: 32 for blocks of 32, 16 for blocks of 256 (the K-quants' sub-blocks).
    pub fn sum_group(&self) -> u32 {
        if self.block == 256 {
            16
        } else {
            32
        }
    }
    /// Word offset of the block scales.
    pub fn d_off(&self) -> u32 {
        self.count / 4
    }
    /// Word offset of the int sums.
    pub fn s_off(&self) -> u32 {
        self.d_off() + self.count / self.block
    }
    /// Words of the whole layout.
    pub fn words(&self) -> u32 {
        self.s_off() + self.count / self.sum_group()
    }
    /// Bytes of the whole layout (the buffer to allocate).
    pub fn bytes(&self) -> u64 {
        self.words() as u64 * 4
    }
}

/// The dot GEMV's push block: [`GemvPush`] plus the word offsets of the packed scales and sums.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct GemvDotPush {
    pub rows: u32,
    pub cols: u32,
    pub row_bytes: u32,
    /// Values between activation rows (a multiple of the block).
    pub x_stride: u32,
    pub y_stride: u32,
    pub y_off: u32,
    pub d_off: u32,
    pub s_off: u32,
}
const _: () = assert!(std::mem::size_of::<GemvDotPush>() == 32);
impl Push for GemvDotPush {}

/// How the integer dot products are computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DotTier {
    /// bitfieldExtract multiply-adds (`gemv_dot_<fmt>`): any device with subgroup arithmetic.
    Emulated,
    /// OpSDot on packed 4x8-bit vectors (`gemv_dotx_<fmt>`): needs the integer dot product
    /// feature (`DeviceInfo::int_dot`).
    Hardware,
}

impl DotTier {
    /// `Hardware` where the device accelerates 4x8-bit packed signed dot products, else
    /// `Emulated` (the same integer results either way).
    pub fn for_device(info: &DeviceInfo) -> DotTier {
        if info.int_dot && info.int_dot_accel {
            DotTier::Hardware
        } else {
            DotTier::Emulated
        }
    }
}

/// The shader suffix of a format the dot GEMV reads.
pub fn dot_format(ty: GgmlType) -> Option<&'static str> {
    use GgmlType::*;
    match ty {
        Q4_0 | Q4_1 | Q5_0 | Q8_0 | Q4_K | Q5_K | Q6_K => format_name(ty),
        _ => None,
    }
}

/// Weight rows a subgroup takes together in an `n`-row pass over a matrix of `rows` rows (each
/// activation unit is loaded once for all of them; the results do not depend on it). More
/// rows a subgroup cut the activation loads (n of them a weight unit) but leave fewer
/// subgroups to keep the memory busy: the most of 1, 2, 4 that leaves at least 4096 subgroups,
/// for one row and for N rows (at 8 rows too, more rows a subgroup lost to more subgroups:
/// docs/lessons.md).
pub fn dot_rows(rows: u32) -> u32 {
    [4, 2].into_iter().find(|&r| rows / r >= 4096).unwrap_or(1)
}

/// How a dot GEMV's subgroups take their rows: `rows` neighbouring rows together (1..=4), each
/// lane loading `unroll` units of them (1..=4, rows x unroll <= 4) before it computes, and a
/// row's units split over `split` subgroups (1, 2 or 4) whose sums are added in order. `rows`
/// and `unroll` do not change a bit of the results; `split` changes the order of the sum, so
/// it is chosen from the matrix alone (a row's N-row result still equals the row run alone).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DotShape {
    pub rows: u32,
    pub unroll: u32,
    pub split: u32,
}

impl DotShape {
    /// The shape for an `n`-row pass over a matrix of `rows` rows of `ty`: [`dot_rows`]; 2
    /// units a lane for N rows of the 32-value formats at up to 2 rows a subgroup (more loads
    /// in flight a lane; it won on Q8_0 and lost at one row: docs/lessons.md), else 1; no split
    /// (splitting a one-row pass's rows over more subgroups lost: docs/lessons.md).
    pub fn pick(ty: GgmlType, n: u32, rows: u32) -> DotShape {
        let r = dot_rows(rows);
        let unroll = if n > 1 && act_block(ty) == Some(32) && r <= 2 { 2 } else { 1 };
        DotShape { rows: r, unroll: unroll.min(4 / r).max(1), split: 1 }
    }
}

/// Whether the device runs the dot tier at all (the subgroup GEMV's requirements).
pub fn dot_ok(info: &DeviceInfo) -> bool {
    info.subgroup_ops.contains(&"arithmetic") && info.subgroup_size >= 4 && info.subgroup_size <= info.max_workgroup_invocations
}

impl Recorder<'_> {
    /// Pack `layout.count` activations of `x` (f32) into `out` (at least `layout.bytes()`),
    /// rounded through 8-bit blocks exactly as [`Recorder::qact`].
    pub fn qpack(&mut self, layout: QPack, x: Bind<'_>, out: Bind<'_>) -> Result<(), VkError> {
        let name = match layout.block {
            32 => "qpack32",
            _ => "qpack256",
        };
        if out.range < layout.bytes() {
            return Err(VkError::OutOfRange(format!("{} bytes for a packed layout of {}", out.range, layout.bytes())));
        }
        // A workgroup packs 2048 values (whole blocks of either size).
        self.run(name, &[], &[x, out], &CountPush { count: layout.count }.bytes(), grid(layout.count.div_ceil(2048)))
    }

    /// y[c][y_off + r] = W[r] . x[c] for c < n (1..=8), x the packed activations of `layout`
    /// (row c at value c * p.x_stride), in the device's [`DotTier`].
    #[allow(clippy::too_many_arguments)]
    pub fn gemv_dot(&mut self, ty: GgmlType, n: u32, w: Bind<'_>, xp: Bind<'_>, y: Bind<'_>, p: GemvPush, layout: QPack) -> Result<(), VkError> {
        let tier = DotTier::for_device(&self.gpu.info);
        self.gemv_dot_tier(tier, None, ty, n, w, xp, y, p, layout)
    }

    /// [`Recorder::gemv_dot`] with a chosen way of taking the integer dot products and,
    /// where given, a chosen [`DotShape`] (else [`DotShape::pick`]).
    #[allow(clippy::too_many_arguments)]
    pub fn gemv_dot_tier(
        &mut self,
        tier: DotTier,
        shape: Option<DotShape>,
        ty: GgmlType,
        n: u32,
        w: Bind<'_>,
        xp: Bind<'_>,
        y: Bind<'_>,
        p: GemvPush,
        layout: QPack,
    ) -> Result<(), VkError> {
        let f = dot_format(ty).ok_or_else(|| VkError::Unsupported(format!("no int8 dot GEMV for {ty}")))?;
        let info = &self.gpu.info;
        if !dot_ok(info) {
            return Err(VkError::Unsupported(format!(
                "the int8 dot GEMV needs subgroup arithmetic and subgroups of 4+ lanes (device: {} lanes, [{}])",
                info.subgroup_size,
                info.subgroup_ops.join(" ")
            )));
        }
        if tier == DotTier::Hardware && !info.int_dot {
            return Err(VkError::Unsupported("OpSDot needs the integer dot product feature".into()));
        }
        let block = act_block(ty).unwrap_or(0);
        if layout.block != block {
            return Err(VkError::Unsupported(format!("{ty} reads activations packed in blocks of {block}, not {}", layout.block)));
        }
        if !(1..=8).contains(&n) || !p.cols.is_multiple_of(block) || !p.x_stride.is_multiple_of(block) || (n - 1) * p.x_stride + p.cols > layout.count {
            return Err(VkError::Unsupported(format!("a dot GEMV of {n} columns over {} values a row at stride {} ({} packed values)", p.cols, p.x_stride, layout.count)));
        }
        let form = if n == 1 { "" } else { "_nrow" };
        let x = match tier {
            DotTier::Emulated => "",
            DotTier::Hardware => "x",
        };
        let (wg, subgroups) = GemvTier::subgroup_shape(info);
        let DotShape { rows: sgr, unroll, split } = match shape {
            Some(s) if (1..=4).contains(&s.rows) && (1..=4).contains(&s.unroll) && s.rows * s.unroll <= 4 && [1, 2, 4].contains(&s.split) => s,
            Some(s) => {
                return Err(VkError::Unsupported(format!(
                    "{} rows a subgroup, {} units a lane, split over {} subgroups in the dot GEMV (1..=4 rows and units, 4 in all; a split of 1, 2 or 4)",
                    s.rows, s.unroll, s.split
                )))
            }
            None => DotShape::pick(ty, n, p.rows),
        };
        // A split wider than the workgroup's subgroups (a device with few) is cut to them.
        let split = if subgroups.is_multiple_of(split) { split } else { 1 };
        let dp = GemvDotPush {
            rows: p.rows,
            cols: p.cols,
            row_bytes: p.row_bytes,
            x_stride: p.x_stride,
            y_stride: p.y_stride,
            y_off: p.y_off,
            d_off: layout.d_off(),
            s_off: layout.s_off(),
        };
        let need = p.rows.div_ceil(subgroups / split * sgr);
        self.run(&format!("gemv_dot{x}_{f}{form}"), &[wg, n, subgroups, sgr, unroll, split], &[w, xp, y], &dp.bytes(), grid(need))
    }
}
