//! The canonical matrix product (`shaders/ops/mv.comp` for 1..=8 activation rows, the token
//! command's; `shaders/ops/mm.comp` for more, a wide step's or a window's, in one pass over the
//! weights; the formats' side in `shaders/common/dotfmt.glsl`; docs/canonical-order.md): rows
//! quantized in 32-value int8 blocks, exact integer dot products with the weight quants, each
//! block's float expression, chunks of blocks fixed by the row length summed left to right
//! and the chunks by a pairwise tree. A stage's residual add or SwiGLU runs in its epilogue
//! ([`MvOut`]); its RMS norm folds into the prologue at one row ([`MvIn::Normed`], so a
//! one-row layer is five dependent stages) and runs ahead of N rows ([`Recorder::normpack`],
//! [`MvIn::NormPacked`]: the same bits). A row's result does not depend on how many rows
//! share the pass.
//!
//! Packed activations ([`QPack`]) of `count` values (n rows of `cols` values, row c starting
//! at value c * cols) in one buffer of 32-bit words:
//!
//! | words | what |
//! | --- | --- |
//! | `[0, count/4)` | the quants q (int8), value 4i+k in byte k of word i |
//! | `[d_off, d_off + count/32)`, `d_off = count/4` | d of each 32-value block (f32), amax/127 |
//! | `[s_off, s_off + count/32)`, `s_off = d_off + count/32` | the sum of each block's quants (i32) |
//!
//! `float(q) * d` is [`Recorder::qact`]'s 32-block output bit for bit.

use resin_core::canon::{Cut, BLOCK};
use resin_core::NROW_MAX;
use resin_gguf::GgmlType;
use resin_model::FfnAct;

use crate::device::DeviceInfo;
use crate::kernels::{format_name, grid, moe_active_entries, CountPush, NormPackPush, Push, Recorder};
use crate::pipelines::Bind;
use crate::VkError;

/// The layout of `count` activations packed in 32-value blocks (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QPack {
    pub count: u32,
}

impl QPack {
    /// The layout for `count` values, a positive multiple of 32.
    pub fn new(count: u32) -> Result<QPack, VkError> {
        if count == 0 || !count.is_multiple_of(BLOCK as u32) {
            return Err(VkError::Unsupported(format!("{count} packed activations in blocks of {BLOCK}")));
        }
        Ok(QPack { count })
    }
    /// Word offset of the block scales.
    pub fn d_off(&self) -> u32 {
        self.count / 4
    }
    /// Word offset of the block sums.
    pub fn s_off(&self) -> u32 {
        self.d_off() + self.count / BLOCK as u32
    }
    /// Words of the whole layout.
    pub fn words(&self) -> u32 {
        self.s_off() + self.count / BLOCK as u32
    }
    /// Bytes of the whole layout (the buffer to allocate).
    pub fn bytes(&self) -> u64 {
        self.words() as u64 * 4
    }
}

/// What a product reads: packed activations, or f32 rows whose RMS norm it folds in.
#[derive(Clone, Copy)]
pub enum MvIn<'a> {
    /// Rows packed as `layout` says, row c at value c * x_stride.
    Packed { x: Bind<'a>, layout: QPack },
    /// One f32 row, normed by the weights `w` with `eps`: the product is W (rmsnorm(x) * w),
    /// the norm folded into its prologue. One row only: N rows quantized again in every
    /// workgroup cost more than [`Recorder::normpack`] ahead of the product.
    Normed { x: Bind<'a>, w: Bind<'a>, eps: f32 },
    /// What [`Recorder::normpack`] wrote: u = x * w packed as `layout` says, and each row's
    /// r = 1 / rms(x) in `r`; the product is r W u, the bits `Normed` gives that row.
    NormPacked { x: Bind<'a>, layout: QPack, r: Bind<'a> },
    /// What [`MvOut::AddPack`] wrote: u = x * w packed as `layout` says, and each 32-value
    /// block's sum of the squares of x in `ss` ([row][block], rows of `x_stride` values), from
    /// which the product finds each row's r with the norm's `eps`: the bits `NormPacked`
    /// gives that row.
    PackedSs { x: Bind<'a>, layout: QPack, ss: Bind<'a>, eps: f32 },
}

/// What a product writes; row i of column c at value c * y_stride + y_off + i.
#[derive(Clone, Copy)]
pub enum MvOut<'a> {
    /// y = W x.
    Store(Bind<'a>),
    /// y += W x (the residual sum).
    Add(Bind<'a>),
    /// The bound weights hold the gate matrix's rows and, `up_off` bytes on, the up matrix's:
    /// act(gate x) * (up x) (silu: SwiGLU; GELU's tanh form: GeGLU), packed as `layout` for
    /// the next matrix.
    SwiGlu { act: FfnAct, up_off: u32, out: Bind<'a>, layout: QPack },
    /// As `Add` (y, the residual rows, each `y_stride` values), then the next norm's input
    /// of the sums, what [`Recorder::normpack`] would write from them (N-row form, whole
    /// 32-row blocks): u = y * `norm` packed as `layout` into `out`, each block's sum of the
    /// squares of y into `ss` ([row][block]); `done` (a word a block of a row, left zero)
    /// counts the workgroups of a block, the last of which packs it. [`MvIn::PackedSs`] reads it.
    AddPack { y: Bind<'a>, norm: Bind<'a>, layout: QPack, out: Bind<'a>, ss: Bind<'a>, done: Bind<'a> },
}

/// The rows of a product: `rows` weight rows of `cols` values (`row_bytes` each), activation
/// rows `x_stride` values apart, output rows `y_stride` apart from `y_off`: the six numbers the
/// GEMV's push block holds, so a pass describes a matrix once for either product.
pub type MvShape = crate::kernels::GemvPush;

/// One product: `n` activation rows through the weights `w` of format `ty` (mv.comp up to
/// NROW_MAX rows, mm.comp past it: the same bits for each row either way).
#[derive(Clone, Copy)]
pub struct Mv<'a> {
    pub ty: GgmlType,
    pub n: u32,
    pub w: Bind<'a>,
    pub input: MvIn<'a>,
    pub out: MvOut<'a>,
    pub shape: MvShape,
}

/// A product whose columns are a mixture-of-experts layer's slots (mm.comp EXPERT): the
/// weights are a stack of `n_expert` matrices of `shape.rows` rows each, the product's `n` is
/// the step's rows, each choosing `used` distinct experts (slot s is row s / used's), and each
/// expert's rows are read once for the slots that chose it ([`Recorder::moe_group`]'s lists).
/// Slot s reads activation row s / x_div and writes output row s; its result is the bits the
/// plain product gives that activation row through its expert's matrix.
#[derive(Clone, Copy)]
pub struct Experts<'a> {
    pub n_expert: u32,
    pub used: u32,
    /// Slots a row of activations: `used` where a row's slots all read the row (gate, up), 1
    /// where each slot has its own (down).
    pub x_div: u32,
    /// What [`Recorder::moe_group`] wrote from the step's expert ids.
    pub groups: Bind<'a>,
    /// A stored product of up to NROW_MAX rows may also sum each row's slots (mv.comp OUT 3).
    pub combine: Option<Combine<'a>>,
}

/// The weighted sum of each row's slots that a token command's expert product (the down)
/// writes beside its slots' rows: out[r][i] = the sum over j in rank order of
/// wt[r * used + j] * y[r * used + j][i], moe.comp COMBINE's arithmetic, by the workgroup
/// that finishes a tile of rows last (counted in `done`, a word a tile, left zero); with
/// `add`, out[r][i] += that sum (the residual's add), and with `pack` too the next norm's
/// input of the sums (mv.comp OUT 6; `done` then also holds a word a 32-row block after the
/// tiles').
#[derive(Clone, Copy)]
pub struct Combine<'a> {
    pub wt: Bind<'a>,
    pub out: Bind<'a>,
    pub done: Bind<'a>,
    pub add: bool,
    pub pack: Option<PackNext<'a>>,
}

/// The next norm's input of a residual's rows that an expert product's sum packs beside
/// itself (as [`MvOut::AddPack`] does for a plain product): u = x * norm packed as `layout`
/// says at `out`, and each 32-value block's sum of the squares of x at `ss`.
#[derive(Clone, Copy)]
pub struct PackNext<'a> {
    pub norm: Bind<'a>,
    pub layout: QPack,
    pub out: Bind<'a>,
    pub ss: Bind<'a>,
}

impl Experts<'_> {
    /// The expert form's push block after the product's `mv` for `slots` slots, and its
    /// workgroups along z: one an entry of the groups' chosen experts.
    fn push<P: Copy>(&self, mv: P, slots: u32) -> (ExpertPush<P>, u32) {
        let list_off = self.n_expert + 1;
        let push = ExpertPush { mv, x_div: self.x_div, list_off, act_off: list_off + slots, used: self.used };
        (push, moe_active_entries(self.n_expert, slots))
    }
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct MvPush {
    rows: u32,
    cols: u32,
    row_bytes: u32,
    x_stride: u32,
    y_stride: u32,
    y_off: u32,
    xd_off: u32,
    xs_off: u32,
    eps: f32,
    up_off: u32,
    pd_off: u32,
    ps_off: u32,
}
const _: () = assert!(std::mem::size_of::<MvPush>() == 48);
impl Push for MvPush {}

/// A product's bindings and push offsets for its input and output, their shapes checked
/// against the packed layouts (`nx` activation rows read, `ny` output rows written).
struct Io<'a> {
    x: Bind<'a>,
    /// The norm's weights (`Normed`), each row's r (`NormPacked`), else `x` again.
    nw: Bind<'a>,
    /// 0 packed, 1 normed (folded), 2 normpacked, 3 packed with blocks' sums of squares; the
    /// shaders' XIN.
    xin: u32,
    eps: f32,
    xd_off: u32,
    xs_off: u32,
    y: Bind<'a>,
    pk: Bind<'a>,
    /// 0 store, 1 add, 2 SwiGLU, 5 add and pack; the shaders' OUT.
    out: u32,
    /// OUT 5's next norm's weights, blocks' sums of squares and counters.
    pack_out: Option<[Bind<'a>; 3]>,
    /// OUT 2's gate activation: 0 silu, 1 GELU (the shaders' ACT).
    act: u32,
    up_off: u32,
    pd_off: u32,
    ps_off: u32,
}

impl<'a> Io<'a> {
    fn of(input: MvIn<'a>, out: MvOut<'a>, s: &MvShape, nx: u32, ny: u32) -> Result<Io<'a>, String> {
        let (x, nw, xin, eps, xd_off, xs_off) = match input {
            MvIn::Packed { x, layout } => {
                if (nx - 1) * s.x_stride + s.cols > layout.count {
                    return Err(format!("{} packed values", layout.count));
                }
                (x, x, 0, 0.0, layout.d_off(), layout.s_off())
            }
            MvIn::NormPacked { x, layout, r } => {
                if (nx - 1) * s.x_stride + s.cols > layout.count || r.range < 4 * nx as u64 {
                    return Err(format!("{} packed values, {} bytes of r", layout.count, r.range));
                }
                (x, r, 2, 0.0, layout.d_off(), layout.s_off())
            }
            MvIn::Normed { x, w, eps } => (x, w, 1, eps, 0, 0),
            MvIn::PackedSs { x, layout, ss, eps } => {
                let blocks = (nx - 1) * s.x_stride / 32 + s.cols / 32;
                if (nx - 1) * s.x_stride + s.cols > layout.count || ss.range < 4 * blocks as u64 {
                    return Err(format!("{} packed values, {} bytes of sums of squares", layout.count, ss.range));
                }
                (x, ss, 3, eps, layout.d_off(), layout.s_off())
            }
        };
        let mut pack_out = None;
        let (y, pk, outk, act, up_off, pd_off, ps_off) = match out {
            MvOut::Store(y) => (y, y, 0, 0, 0, 0, 0),
            MvOut::Add(y) => (y, y, 1, 0, 0, 0, 0),
            MvOut::SwiGlu { act, up_off, out, layout } => {
                if !s.rows.is_multiple_of(32) || !s.y_off.is_multiple_of(32) || !s.y_stride.is_multiple_of(32) || (ny - 1) * s.y_stride + s.y_off + s.rows > layout.count {
                    return Err(format!("a SwiGLU packed in 32-row blocks from row {} at stride {} ({} values)", s.y_off, s.y_stride, layout.count));
                }
                if out.range < layout.bytes() || !up_off.is_multiple_of(16) {
                    return Err(format!("{} bytes for the packed output, the up rows {up_off} bytes on", out.range));
                }
                let act = u32::from(act == FfnAct::GeluTanh);
                (out, out, 2, act, up_off, layout.d_off(), layout.s_off())
            }
            MvOut::AddPack { y, norm, layout, out, ss, done } => {
                let (end, rowb) = (s.y_off + s.rows, s.y_stride / 32);
                if !s.rows.is_multiple_of(32) || !s.y_off.is_multiple_of(32) || !s.y_stride.is_multiple_of(32) || end > s.y_stride || (ny - 1) * s.y_stride + end > layout.count {
                    return Err(format!("the next norm's input packed in 32-row blocks from row {} at stride {} ({} values)", s.y_off, s.y_stride, layout.count));
                }
                let short = out.range < layout.bytes() || norm.range < 4 * end as u64 || ss.range < 4 * (ny * rowb) as u64 || done.range < 4 * rowb as u64;
                if short || y.range < 4 * ((ny - 1) * s.y_stride + end) as u64 {
                    return Err(format!("{} / {} / {} / {} bytes for the packs, the norm, the sums of squares, the counters", out.range, norm.range, ss.range, done.range));
                }
                pack_out = Some([norm, ss, done]);
                (y, out, 5, 0, 0, layout.d_off(), layout.s_off())
            }
        };
        Ok(Io { x, nw, xin, eps, xd_off, xs_off, y, pk, out: outk, act, up_off, pd_off, ps_off, pack_out })
    }
}

/// What [`Recorder::normpack`] adds to the rows first: `y`, or (`post`, gemma3's post-norms)
/// rmsnorm(y) * post with `y`'s own r found as the norm's (the same eps).
#[derive(Clone, Copy)]
pub struct NormAdd<'a> {
    pub y: Bind<'a>,
    pub post: Option<Bind<'a>>,
}

impl<'a> From<&'a crate::buffers::Buffer> for NormAdd<'a> {
    fn from(y: &'a crate::buffers::Buffer) -> NormAdd<'a> {
        NormAdd { y: y.into(), post: None }
    }
}

/// Blocks a row [`Recorder::normpack`] takes at most (its shared memory).
const NORMPACK_BLOCKS: usize = 512;

/// How the integer dot products are computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DotTier {
    /// bitfieldExtract multiply-adds (`mv_<fmt>`, `mr_<fmt>`): any device.
    Emulated,
    /// OpSDot on packed 4x8-bit vectors (`mvx_<fmt>`, `mrx_<fmt>`): needs the integer dot
    /// product feature (`DeviceInfo::int_dot`).
    Hardware,
    /// 16x16x32 int8 tensor-core tiles for products of more than NROW_MAX rows (`mm_cm_<fmt>`;
    /// fewer rows take `Hardware`): needs [`tiles_ok`].
    Tiles,
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
    /// The tier of a product of `n` rows, more than NROW_MAX: `Tiles` where the device has
    /// them and the rows are many enough that the tile arithmetic pays (docs/lessons.md), else
    /// mr.comp's.
    pub fn wide_for_device(info: &DeviceInfo, n: u32) -> DotTier {
        if n >= TILES_MIN_ROWS && tiles_ok(info) {
            DotTier::Tiles
        } else {
            DotTier::for_device(info)
        }
    }
}

/// Whether the device runs mm.comp's tensor-core tier: 16x16x32 int8 x int8 -> int32
/// cooperative matrices at subgroup scope, subgroups of 32 (eight of them a workgroup: a 16x16
/// region each), 8-bit arithmetic.
pub fn tiles_ok(info: &DeviceInfo) -> bool {
    info.coopmat
        && info.int8_arith
        && info.subgroup_size == 32
        && info.max_workgroup_invocations >= MM_THREADS
        && info.coopmat_shapes.iter().any(|s| (s.m, s.n, s.k) == (16, 16, 32) && s.types == "s8xs8->s32")
}

/// Shared memory an mr.comp workgroup of `cs` chunk slots, `nv` weight rows a thread and `nc`
/// columns declares: each chunk slot's subtree roots of its 32 row slots.
const fn mr_shared_bytes(cs: u32, nv: u32, nc: u32) -> u32 {
    4 * cs * nv * nc * 32
}

/// The most mr.comp declares: 8 chunk slots, gate and up rows, 16 columns.
const MR_SHARED_MAX: u32 = mr_shared_bytes(8, 2, 16);

/// Rows from which a product takes the int8 tiles where the device has them: below, mr.comp's
/// registers were as fast or faster on the H100.
const TILES_MIN_ROWS: u32 = 32;

/// Threads of the largest mm.comp workgroup (its 64-row tile).
const MM_THREADS: u32 = 256;
/// Shared memory mm.comp declares at most (its tensor-core tier with DOT_HALVES): the staged
/// weight quants (64 rows of 4 blocks and a pad word, 16 bytes each), their parameters, two
/// copies of the activation quants, their d and sums, the finished tile and the index tile.
const MM_SHARED_BYTES: u32 = 16 * (64 * 9 + 64 * 4 + 2 * 32 * 9) + 8 * 32 * 4 + 4 * (64 * 32 + 256);
/// Activation rows of an mm.comp tile.
const MM_TILE_N: u32 = 32;
/// Workgroups below which a product takes mm.comp's 16-row tiles: fewer would leave a large
/// GPU's compute units idle while the weights stream.
const MM_SMALL_TILES_BELOW: u32 = 512;

#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct MmPush {
    mv: MvPush,
    n: u32,
}
const _: () = assert!(std::mem::size_of::<MmPush>() == 52);
impl Push for MmPush {}

/// The EXPERT forms' push block (mv.comp after [`MvPush`], mm.comp and mr.comp after
/// [`MmPush`]): the product's, then the slots a row of activations and the word offsets of
/// the slot lists and of the chosen experts.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct ExpertPush<P> {
    mv: P,
    x_div: u32,
    list_off: u32,
    act_off: u32,
    used: u32,
}
const _: () = assert!(std::mem::size_of::<ExpertPush<MvPush>>() == 64);
const _: () = assert!(std::mem::size_of::<ExpertPush<MmPush>>() == 68);
impl Push for ExpertPush<MvPush> {}
impl Push for ExpertPush<MmPush> {}

/// Rows of activations a product of `n` rows reads and rows of outputs it writes: n, or (an
/// expert product) its slots' activation rows and its slots.
fn slot_rows(n: u32, ex: Option<&Experts<'_>>) -> (u32, u32) {
    match ex {
        Some(e) => (n * e.used / e.x_div, n * e.used),
        None => (n, n),
    }
}

/// The shader suffix of a format the canonical product reads (the spec's table).
pub fn mv_format(ty: GgmlType) -> Option<&'static str> {
    use GgmlType::*;
    match ty {
        Q4_0 | Q4_1 | Q5_0 | Q8_0 | Q4_K | Q5_K | Q6_K => format_name(ty),
        _ => None,
    }
}

/// Whether the device runs the canonical product at all (subgroup IDs, a power-of-two
/// subgroup size).
pub fn mv_ok(info: &DeviceInfo) -> bool {
    info.subgroup_size.is_power_of_two() && NSG * info.subgroup_size <= info.max_workgroup_invocations
}

/// Subgroups a workgroup of the product (a subgroup takes one or two rows at a time).
const NSG: u32 = 4;
/// Rows of SwiGLU packed a workgroup (a 32-value block of the next matrix's input).
const SWIGLU_TILE: u32 = 32;

/// Subgroups a SwiGLU workgroup takes at most: a whole tile's 32 (where the device runs 1,024
/// threads a workgroup) leaves a gate/up matrix few and large workgroups, which fill the
/// compute units unevenly; half a tile is the measured best (docs/lessons.md).
const SWIGLU_SG_MAX: u32 = 16;

/// The subgroups a workgroup may have, most first: NSG, or for SwiGLU as many of its tile's
/// rows as the device lets one workgroup take at once, up to SWIGLU_SG_MAX (so that many
/// subgroups are at work on a matrix of few tiles), fewer where their shared memory would not
/// fit.
fn mv_subgroups(info: &DeviceInfo, swiglu: bool) -> Vec<u32> {
    if !swiglu {
        return vec![NSG];
    }
    let most = (info.max_workgroup_invocations / info.subgroup_size.max(1)).clamp(1, SWIGLU_SG_MAX);
    (1..=SWIGLU_TILE).rev().filter(|&g| g <= most && SWIGLU_TILE.is_multiple_of(g)).collect()
}

/// Subgroups that share each row's passes over K (mv.comp's KS): as many as split the passes
/// evenly, up to 4 and the workgroup's subgroups, where each pass holds whole chunks. More
/// subgroups then stream a matrix of few rows (the FFN's down matrix, the N-row command's
/// smaller ones) at once; an uneven split (3 passes) and the folded norm's one-row form were
/// slower split (docs/lessons.md).
fn mv_ksplit(subgroup_size: u32, cut: &Cut, normed: bool, subgroups: u32) -> u32 {
    let s = subgroup_size.max(1);
    let passes = (cut.blocks as u32).div_ceil(s);
    if normed || cut.chunk_blocks as u32 > s {
        return 1;
    }
    let mut k = 1;
    while k < KSPLIT_MAX && 2 * k <= subgroups && passes.is_multiple_of(2 * k) {
        k *= 2;
    }
    k
}

/// Subgroups that share a row's passes at most.
const KSPLIT_MAX: u32 = 4;

/// The specialization constants after the workgroup size and the row count (mv.comp).
struct MvSpec {
    lanes: u32,
    chunk_blocks: u32,
    chunks: u32,
    xin: u32,
    out: u32,
    xq_words: u32,
    x_blocks: u32,
    /// Passes of NSG subgroups' rows a workgroup takes.
    passes: u32,
    /// Weight rows a subgroup takes at once.
    rows_sg: u32,
    /// Shared floats of the chunk partials, of the SwiGLU tile and of a pass's block terms.
    part: u32,
    hv: u32,
    fs: u32,
    /// Subgroups a workgroup.
    subgroups: u32,
    /// Subgroups that share a row group's passes over K.
    ksplit: u32,
}

impl MvSpec {
    /// The form for `n` rows of a `rows` x `cols` matrix: the most subgroups a workgroup
    /// whose shared memory fits the device (else the fewest, which the caller refuses).
    fn new(info: &DeviceInfo, n: u32, rows: u32, cols: u32, normed: bool, swiglu: bool) -> Option<MvSpec> {
        let mut spec = None;
        for subgroups in mv_subgroups(info, swiglu) {
            let s = MvSpec::with(info, n, rows, cols, normed, swiglu, subgroups)?;
            let fits = s.shared_bytes() <= info.shared_memory as u64;
            spec = Some(s);
            if fits {
                break;
            }
        }
        spec
    }

    fn with(info: &DeviceInfo, n: u32, rows: u32, cols: u32, normed: bool, swiglu: bool, subgroups: u32) -> Option<MvSpec> {
        let cut = Cut::of(cols as usize)?;
        let ksplit = mv_ksplit(info.subgroup_size, &cut, normed, subgroups);
        // Two rows a subgroup share each activation block's loads where there are several
        // activation rows; SwiGLU's two are the gate row and its up row.
        let rows_sg = if swiglu || n > 1 { 2 } else { 1 };
        let outs = if swiglu { 1 } else { rows_sg };
        // SwiGLU packs 32 rows a workgroup; the folded norm's prologue is shared by the
        // workgroup's rows, so it takes more of them where the matrix has many.
        let passes = if swiglu {
            SWIGLU_TILE / (subgroups / ksplit)
        } else if normed {
            (rows / (NSG * outs * info.workgroup_spread)).clamp(1, 16)
        } else {
            1
        };
        Some(MvSpec {
            lanes: cut.lanes as u32,
            chunk_blocks: cut.chunk_blocks as u32,
            chunks: cut.chunks as u32,
            xin: normed as u32,
            out: 0,
            xq_words: if normed { n * cols / 4 } else { 1 },
            x_blocks: if normed { n * cut.blocks as u32 } else { 1 },
            passes,
            rows_sg,
            part: subgroups * 2 * n * cut.lanes as u32,
            hv: if swiglu { n * 64 } else { 1 },
            fs: subgroups * rows_sg * n * info.subgroup_size,
            ksplit,
            subgroups,
        })
    }
    /// Output rows a workgroup.
    fn tile(&self) -> u32 {
        self.passes * (self.subgroups / self.ksplit) * if self.out == 2 { 1 } else { self.rows_sg }
    }
    /// Bytes of shared memory the kernel declares (mv.comp).
    fn shared_bytes(&self) -> u64 {
        4 * (self.xq_words as u64 + 3 * self.x_blocks as u64 + self.part as u64 + self.hv as u64 + self.fs as u64 + 8 * 33)
    }
}

/// Whether an `n`-row product over rows of `cols` values fits the device with its norm folded
/// in (the rows quantized in shared memory) and, with `swiglu`, its SwiGLU epilogue.
pub fn mv_fits(info: &DeviceInfo, n: u32, cols: u32, normed: bool, swiglu: bool) -> bool {
    if n as usize > NROW_MAX {
        return !normed && cols.is_multiple_of(32) && MM_SHARED_BYTES.max(MR_SHARED_MAX) <= info.shared_memory && MM_THREADS <= info.max_workgroup_invocations;
    }
    !(normed && n > 1) && MvSpec::new(info, n, 0, cols, normed, swiglu).is_some_and(|s| s.shared_bytes() <= info.shared_memory as u64)
}

impl Recorder<'_> {
    /// Pack `layout.count` activations of `x` (f32) into `out` (at least `layout.bytes()`).
    pub fn qpack(&mut self, layout: QPack, x: Bind<'_>, out: Bind<'_>) -> Result<(), VkError> {
        if out.range < layout.bytes() {
            return Err(VkError::OutOfRange(format!("{} bytes for a packed layout of {}", out.range, layout.bytes())));
        }
        // A workgroup packs 2048 values (whole blocks).
        self.run("qpack32", &[], &[x, out], &CountPush { count: layout.count }.bytes(), grid(layout.count.div_ceil(2048)))
    }

    /// The RMS norm of `rows` rows of `cols` values in the canonical order, for products that
    /// read [`MvIn::NormPacked`]: x += add first where given (written back; [`NormAdd`]: its
    /// own RMS norm first where it has one), then u = x * w packed as `layout` into `out` and
    /// each row's r into `r` (`shaders/ops/normpack.comp`).
    #[allow(clippy::too_many_arguments)]
    pub fn normpack(
        &mut self,
        rows: u32,
        cols: u32,
        eps: f32,
        x: Bind<'_>,
        add: Option<NormAdd<'_>>,
        w: Bind<'_>,
        layout: QPack,
        out: Bind<'_>,
        r: Bind<'_>,
    ) -> Result<(), VkError> {
        self.normpack_xn(rows, cols, eps, x, add, w, layout, (out, r), None)
    }

    /// [`Recorder::normpack`] that also writes the normed rows in f32 to `xn` where given:
    /// (x * r) * w, the expression of [`Recorder::rmsnorm`] with the pack's r (a mixture of
    /// experts' router reads them beside the experts' packs).
    #[allow(clippy::too_many_arguments)]
    pub fn normpack_xn(
        &mut self,
        rows: u32,
        cols: u32,
        eps: f32,
        x: Bind<'_>,
        add: Option<NormAdd<'_>>,
        w: Bind<'_>,
        layout: QPack,
        (out, r): (Bind<'_>, Bind<'_>),
        xn: Option<Bind<'_>>,
    ) -> Result<(), VkError> {
        if xn.is_some_and(|b| b.range < 4 * (rows as u64) * (cols as u64)) {
            return Err(VkError::OutOfRange(format!("{rows} normed rows of {cols} values")));
        }
        let cut = Cut::of(cols as usize).filter(|c| c.blocks <= NORMPACK_BLOCKS).ok_or_else(|| VkError::Unsupported(format!("a canonical norm of rows of {cols} values")))?;
        if rows * cols > layout.count || out.range < layout.bytes() || r.range < 4 * rows as u64 {
            return Err(VkError::OutOfRange(format!("{rows} rows of {cols}: {} packed values, {} bytes of r", layout.count, r.range)));
        }
        let push = NormPackPush { n: cols, eps, count: layout.count };
        let consts = [cut.lanes as u32, cut.chunk_blocks as u32, cut.chunks as u32];
        match (add, xn) {
            (None, None) => self.run("normpack", &consts, &[x, x, w, out, r], &push.bytes(), [rows, 1, 1]),
            (Some(NormAdd { y, post: None }), None) => self.run("normpack_add", &consts, &[x, y, w, out, r], &push.bytes(), [rows, 1, 1]),
            (Some(NormAdd { y, post: Some(wp) }), None) => self.run("normpack_post", &consts, &[x, y, w, out, r, wp], &push.bytes(), [rows, 1, 1]),
            (None, Some(xn)) => self.run("normpack_xn", &consts, &[x, x, w, out, r, xn], &push.bytes(), [rows, 1, 1]),
            (Some(NormAdd { y, post: None }), Some(xn)) => self.run("normpack_add_xn", &consts, &[x, y, w, out, r, xn], &push.bytes(), [rows, 1, 1]),
            (Some(NormAdd { post: Some(_), .. }), Some(_)) => Err(VkError::Unsupported("the normed rows beside a post-norm's pack".into())),
        }
    }

    /// The product `m` in the device's [`DotTier`] for its rows.
    pub fn mv(&mut self, m: Mv<'_>) -> Result<(), VkError> {
        let info = &self.gpu.info;
        let tier = if m.n as usize > NROW_MAX { DotTier::wide_for_device(info, m.n) } else { DotTier::for_device(info) };
        self.mv_tier(tier, m)
    }

    /// The expert product `m` over the slots `ex` groups ([`Experts`]), in the device's
    /// [`DotTier`].
    pub fn mv_experts(&mut self, m: Mv<'_>, ex: Experts<'_>) -> Result<(), VkError> {
        let tier = DotTier::for_device(&self.gpu.info);
        self.mv_experts_tier(tier, m, ex)
    }

    /// [`Recorder::mv_experts`] with a chosen way of taking the integer dot products: mv.comp
    /// EXPERT for steps of up to NROW_MAX rows, mm.comp EXPERT past it (its tiles' columns an
    /// expert's slots).
    pub fn mv_experts_tier(&mut self, tier: DotTier, m: Mv<'_>, ex: Experts<'_>) -> Result<(), VkError> {
        let f = self.mv_check(tier, &m)?;
        let s = m.shape;
        let bad = |what: String| Err(VkError::Unsupported(format!("an expert product of {} rows over {} x {}: {what}", m.n, s.rows, s.cols)));
        if ex.n_expert == 0 || ex.n_expert > crate::kernels::MOE_MAX_EXPERTS || ex.used == 0 || ex.used > ex.n_expert || (ex.x_div != 1 && ex.x_div != ex.used) {
            return bad(format!("{} of {} experts a row, {} slots a row of activations", ex.used, ex.n_expert, ex.x_div));
        }
        let Some(slots) = m.n.checked_mul(ex.used) else {
            return bad(format!("{} slots a row", ex.used));
        };
        if ex.groups.range < crate::kernels::moe_group_words(ex.n_expert, slots) as u64 * 4 {
            return bad(format!("{} bytes of slot lists", ex.groups.range));
        }
        let up = match m.out {
            MvOut::SwiGlu { up_off, .. } => up_off as u64,
            _ => 0,
        };
        if m.w.range < up + ex.n_expert as u64 * s.rows as u64 * s.row_bytes as u64 {
            return bad(format!("{} bytes of weights for {} experts", m.w.range, ex.n_expert));
        }
        if matches!(m.input, MvIn::Normed { .. }) {
            return bad("a folded norm (normpack the rows)".into());
        }
        if let Some(c) = ex.combine {
            let MvOut::Store(_) = m.out else {
                return bad("a sum of the slots after a product that does not store them".into());
            };
            if m.n as usize > NROW_MAX || s.y_off != 0 || s.y_stride < s.rows {
                return bad(format!("a sum of the slots of {} rows {} values apart", m.n, s.y_stride));
            }
            // A word a tile of at least a row, and (pack) a word a 32-row block after them.
            let words = s.rows as u64 + if c.pack.is_some() { s.rows.div_ceil(32) as u64 } else { 0 };
            if c.wt.range < slots as u64 * 4 || c.out.range < (m.n as u64 - 1) * s.y_stride as u64 * 4 + s.rows as u64 * 4 || c.done.range < words * 4 {
                return bad(format!("{} / {} / {} bytes for the slots' weights, the sums and the counters", c.wt.range, c.out.range, c.done.range));
            }
            if let Some(pn) = c.pack {
                let rowb = s.y_stride / 32;
                if !c.add || !s.rows.is_multiple_of(32) || !s.y_stride.is_multiple_of(32) || (m.n - 1) * s.y_stride + s.rows > pn.layout.count {
                    return bad(format!("the next norm's input of {} rows {} values apart packed in {} values", m.n, s.y_stride, pn.layout.count));
                }
                if pn.out.range < pn.layout.bytes() || pn.norm.range < 4 * s.rows as u64 || pn.ss.range < 4 * (m.n * rowb) as u64 {
                    return bad(format!("{} / {} / {} bytes for the packs, the norm and the sums of squares", pn.out.range, pn.norm.range, pn.ss.range));
                }
            }
        }
        if m.n as usize > NROW_MAX {
            return self.mv_wide(tier, f, m, Some(ex));
        }
        self.mv_rows(tier, f, m, Some(ex))
    }

    /// The checks every product makes: a format it reads, a device that runs the tier, rows,
    /// activation rows of whole blocks. Returns the format's shader suffix.
    fn mv_check(&self, tier: DotTier, m: &Mv<'_>) -> Result<&'static str, VkError> {
        let Mv { ty, n, input, shape: s, .. } = *m;
        let f = mv_format(ty).ok_or_else(|| VkError::Unsupported(format!("no canonical product for {ty}")))?;
        let info = &self.gpu.info;
        if !mv_ok(info) {
            return Err(VkError::Unsupported(format!("the canonical product needs subgroup shuffles (device: {} lanes, [{}])", info.subgroup_size, info.subgroup_ops.join(" "))));
        }
        if tier != DotTier::Emulated && !info.int_dot {
            return Err(VkError::Unsupported("OpSDot needs the integer dot product feature".into()));
        }
        if tier == DotTier::Tiles && !tiles_ok(info) {
            return Err(VkError::Unsupported("the device has no 16x16x32 int8 cooperative matrices for subgroups of 32".into()));
        }
        let bad = |what: String| Err(VkError::Unsupported(format!("a canonical product of {n} rows over {} x {}: {what}", s.rows, s.cols)));
        if n == 0 {
            return bad("no rows".into());
        }
        if !s.x_stride.is_multiple_of(32) || s.x_stride < s.cols {
            return bad(format!("activation rows {} values apart", s.x_stride));
        }
        let normed = matches!(input, MvIn::Normed { .. });
        if normed && n > 1 {
            return bad("a folded norm of one row".into());
        }
        Ok(f)
    }

    /// [`Recorder::mv`] with a chosen way of taking the integer dot products.
    pub fn mv_tier(&mut self, tier: DotTier, m: Mv<'_>) -> Result<(), VkError> {
        let f = self.mv_check(tier, &m)?;
        if m.n as usize > NROW_MAX {
            return self.mv_wide(tier, f, m, None);
        }
        self.mv_rows(tier, f, m, None)
    }

    /// mv.comp: the product of up to NROW_MAX rows, or (`ex`) an expert product of a step of
    /// up to NROW_MAX rows (its checks on the shape as `mv_tier` makes them).
    fn mv_rows(&mut self, tier: DotTier, f: &str, m: Mv<'_>, ex: Option<Experts<'_>>) -> Result<(), VkError> {
        let Mv { n, w, input, out, shape: s, .. } = m;
        let (nx, ny) = slot_rows(n, ex.as_ref());
        let info = &self.gpu.info;
        let bad = |what: String| Err(VkError::Unsupported(format!("a canonical product of {n} rows over {} x {}: {what}", s.rows, s.cols)));
        let normed = matches!(input, MvIn::Normed { .. });
        let swiglu = matches!(out, MvOut::SwiGlu { .. });
        let Some(mut spec) = MvSpec::new(info, n, s.rows, s.cols, normed, swiglu) else {
            return bad("rows of whole 32-value blocks".into());
        };
        if spec.shared_bytes() > info.shared_memory as u64 {
            return bad(format!("{} bytes of shared memory (the device has {})", spec.shared_bytes(), info.shared_memory));
        }
        let io = match Io::of(input, out, &s, nx, ny) {
            Ok(io) => io,
            Err(what) => return bad(what),
        };
        let Io { x, nw, eps, xd_off, xs_off, y, mut pk, up_off, mut pd_off, mut ps_off, .. } = io;
        let out = match ex.and_then(|e| e.combine) {
            Some(Combine { pack: Some(pn), .. }) => {
                (pk, pd_off, ps_off) = (pn.out, pn.layout.d_off(), pn.layout.s_off());
                6
            }
            Some(c) => 3 + u32::from(c.add),
            None => io.out,
        };
        (spec.xin, spec.out) = (io.xin, out);
        let push =
            MvPush { rows: s.rows, cols: s.cols, row_bytes: s.row_bytes, x_stride: s.x_stride, y_stride: s.y_stride, y_off: s.y_off, xd_off, xs_off, eps, up_off, pd_off, ps_off };
        // The expert form is the N-row form's (its column count a specialization constant),
        // and so is the form that packs the next norm's input.
        let form = match (n, &ex, io.pack_out) {
            (_, Some(_), Some(_)) => return bad("the next norm's input from an expert product".into()),
            (_, None, Some(_)) => "_nrow_po",
            (1, None, None) => "",
            _ => "_nrow",
        };
        let tile = spec.tile();
        if (io.pack_out.is_some() || out == 6) && !(32 % tile == 0 || tile % 32 == 0) {
            return bad(format!("the next norm's 32-row blocks over workgroups of {tile} rows"));
        }
        let hw = match tier {
            DotTier::Emulated => "",
            DotTier::Hardware | DotTier::Tiles => "x",
        };
        let consts = [
            spec.subgroups * info.subgroup_size,
            n,
            spec.lanes,
            spec.chunk_blocks,
            spec.chunks,
            spec.xin,
            spec.out,
            spec.xq_words,
            spec.x_blocks,
            spec.subgroups,
            spec.passes,
            spec.rows_sg,
            spec.part,
            spec.hv,
            spec.fs,
            spec.ksplit,
            io.act,
        ];
        let wgs = grid(s.rows.div_ceil(spec.tile()));
        match ex {
            // An expert has at most n slots (a row's slots choose distinct experts): n columns
            // for each chosen expert, those past its count loading its last slot's and writing
            // nothing.
            Some(e) => {
                let (push, chosen) = e.push(push, ny);
                // Without a sum (or a pack) the form's bindings for it are the lists again
                // (never read).
                let c = e.combine.unwrap_or(Combine { wt: e.groups, out: e.groups, done: e.groups, add: false, pack: None });
                let (norm, ss) = c.pack.map_or((e.groups, e.groups), |pn| (pn.norm, pn.ss));
                self.run(&format!("mv{hw}_x_{f}{form}"), &consts, &[w, x, nw, y, pk, e.groups, c.wt, c.out, c.done, norm, ss], &push.bytes(), [wgs[0], wgs[1], chosen])
            }
            None => match io.pack_out {
                Some([norm, ss, done]) => self.run(&format!("mv{hw}_{f}{form}"), &consts, &[w, x, nw, y, pk, norm, ss, done], &push.bytes(), wgs),
                None => self.run(&format!("mv{hw}_{f}{form}"), &consts, &[w, x, nw, y, pk], &push.bytes(), wgs),
            },
        }
    }

    /// The product of more than NROW_MAX rows, or (`ex`) an expert product of any (packed or
    /// normpacked input; its checks on the shape as `mv_tier` makes them): mr.comp in the dot4
    /// and OpSDot tiers, mm.comp in `Tiles`.
    fn mv_wide(&mut self, tier: DotTier, f: &str, m: Mv<'_>, ex: Option<Experts<'_>>) -> Result<(), VkError> {
        let Mv { n, w, input, out, shape: s, .. } = m;
        // Rows of activations read and of outputs written: the step's rows, or (experts) its
        // slots' activation rows and its slots.
        let (nx, ny) = slot_rows(n, ex.as_ref());
        let bad = |what: String| Err(VkError::Unsupported(format!("a canonical product of {n} rows over {} x {}: {what}", s.rows, s.cols)));
        let Some(cut) = Cut::of(s.cols as usize) else {
            return bad("rows of whole 32-value blocks".into());
        };
        let info = &self.gpu.info;
        let io = match Io::of(input, out, &s, nx, ny) {
            Ok(io) if io.xin == 1 => return bad("a folded norm of one row".into()),
            Ok(io) if io.xin == 3 || io.pack_out.is_some() => return bad("the next norm's input packed by the N-row form".into()),
            Ok(io) => io,
            Err(what) => return bad(what),
        };
        let Io { x, nw: nr, xin, xd_off, xs_off, y, pk, out: outk, act, up_off, pd_off, ps_off, .. } = io;
        let mv = MvPush {
            rows: s.rows,
            cols: s.cols,
            row_bytes: s.row_bytes,
            x_stride: s.x_stride,
            y_stride: s.y_stride,
            y_off: s.y_off,
            xd_off,
            xs_off,
            eps: 0.0,
            up_off,
            pd_off,
            ps_off,
        };
        let lpow = cut.lanes as u32;
        let form = if ex.is_some() { "x_" } else { "" };
        let mm = MmPush { mv, n };
        if tier != DotTier::Tiles {
            // mr.comp: 32 row slots x CS chunk slots a workgroup, NC columns. Chunk slots: up
            // to 8 (a thread then owns up to 4 chunks: K's at most 32).
            let cs = lpow.min(8);
            let nv = if outk == 2 { 2 } else { 1 };
            // An expert's slots are few (a step's rows spread over its experts).
            let nc = if ex.is_some() { 8 } else { 16 };
            let shared = mr_shared_bytes(cs, nv, nc);
            if shared > info.shared_memory || 32 * cs > info.max_workgroup_invocations {
                return bad(format!("workgroups of {} threads and {shared} bytes of shared memory", 32 * cs));
            }
            let hw = if tier == DotTier::Hardware { "x" } else { "" };
            let name = format!("mr{hw}_{form}{f}");
            let consts = [cut.chunk_blocks as u32, cut.chunks as u32, lpow, cs, xin, outk, nv, 32 * cs, nc, act];
            let outs = if outk == 2 { 32 } else { 32 * nv };
            let grid = [n.div_ceil(nc), s.rows.div_ceil(outs), 1];
            return match ex {
                Some(e) => {
                    let (push, chosen) = e.push(mm, ny);
                    self.run(&name, &consts, &[w, x, nr, y, pk, e.groups], &push.bytes(), [grid[0], grid[1], chosen])
                }
                None => self.run(&name, &consts, &[w, x, nr, y, pk], &mm.bytes(), grid),
            };
        }
        if MM_SHARED_BYTES > info.shared_memory || MM_THREADS > info.max_workgroup_invocations {
            return bad(format!("workgroups of {MM_THREADS} threads and {MM_SHARED_BYTES} bytes of shared memory"));
        }
        let consts = [cut.chunk_blocks as u32, cut.chunks as u32, lpow, lpow.trailing_zeros(), xin, outk];
        // mm.comp: the int8 tiles.
        let name = format!("mm_cm_{form}{f}");
        // 16-row regions a tile: 4 (SwiGLU's 32 gate rows and their up rows; and wherever
        // 64-row tiles are enough to fill the device), else 1. Experts: each takes its own
        // tiles, so the stack's tiles count.
        let cols = n.div_ceil(MM_TILE_N);
        let stacks = ex.as_ref().map_or(1, |e| moe_active_entries(e.n_expert, ny));
        let rt = if outk == 2 || s.rows.div_ceil(64) * cols * stacks >= MM_SMALL_TILES_BELOW { 4 } else { 1 };
        let outs = if outk == 2 { 32 } else { 16 * rt };
        let consts = [consts[0], consts[1], consts[2], consts[3], consts[4], consts[5], rt, 64 * rt, act];
        let row_tiles = s.rows.div_ceil(outs);
        match ex {
            // An expert has at most n slots (a row's slots choose distinct experts): n's
            // column tiles for each chosen expert, those past its count leaving at once.
            Some(e) => {
                let (push, chosen) = e.push(mm, ny);
                self.run(&name, &consts, &[w, x, nr, y, pk, e.groups], &push.bytes(), [row_tiles, cols, chosen])
            }
            None => self.run(&name, &consts, &[w, x, nr, y, pk], &mm.bytes(), [row_tiles, cols, 1]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The split follows the row's passes: 2048 values (2 passes of 32 lanes) in two, 8192
    /// (8 passes) in four, 3072 (3) and 576 (1) not at all; never the folded norm's form, nor
    /// past the workgroup's subgroups, nor where a chunk spans passes (16-block chunks in
    /// lavapipe's 8-lane passes).
    #[test]
    fn k_splits_where_the_passes_divide_evenly() {
        let cut = |k: usize| Cut::of(k).unwrap();
        assert_eq!(mv_ksplit(32, &cut(2048), false, 4), 2);
        assert_eq!(mv_ksplit(32, &cut(8192), false, 4), 4);
        assert_eq!(mv_ksplit(32, &cut(8192), false, 2), 2);
        assert_eq!(mv_ksplit(32, &cut(8192), false, 32), KSPLIT_MAX);
        assert_eq!(mv_ksplit(32, &cut(3072), false, 4), 1);
        assert_eq!(mv_ksplit(32, &cut(576), false, 4), 1);
        assert_eq!(mv_ksplit(32, &cut(8192), true, 4), 1);
        assert_eq!(mv_ksplit(8, &cut(2048), false, 4), 4);
        assert_eq!(mv_ksplit(8, &cut(16384), false, 4), 1);
    }
}
