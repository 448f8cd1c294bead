//! Each operation's push-constant block (a `#[repr(C)]` mirror of the shader's, size-checked)
//! and the recording of its dispatch.

use ash::vk;
use resin_gguf::GgmlType;
use resin_model::{FfnAct, RopeStyle};

use crate::buffers::{barrier, transfer_barrier};
use crate::device::{DeviceInfo, Gpu};
use crate::mv::QPack;
use crate::pipelines::{Bind, Descriptors, Pipelines};
use crate::VkError;
use resin_core::{KvCodec, NROW_MAX};

/// Workgroup size (specialization constant 0) of the kernels that take one.
pub const WG: u32 = 64;

/// Workgroup size of the RMS norms: one workgroup a row, so a step of few rows needs wide ones
/// (common/norm.glsl's NVT: a thread a virtual thread).
pub const NORM_WG: u32 = 256;
const _: () = assert!(NORM_WG == 256, "common/norm.glsl takes a thread for each of its 256 virtual threads");
/// Values a row the norm takes (common/norm.glsl: a thread holds at most 8 chunks of 8 of the
/// 256 threads' in registers).
pub const NORM_MAX: u32 = 16384;

/// Workgroups a row of the argmax's first stage (shaders/ops/argmax.comp SLICES).
pub const ARGMAX_SLICES: u32 = 64;
/// Words a row of the argmax's partials: (best value, index, max, sum) a slice.
pub const ARGMAX_PART_WORDS: u64 = 4 * ARGMAX_SLICES as u64;

/// Workgroups a row of [`Recorder::rows_copy`] (shaders/ops/rows_copy.comp SLICES).
pub const ROWS_COPY_SLICES: u32 = 64;

/// Words of [`Recorder::rows_copy`]'s list for up to `slots` rows: the count, then the indices.
pub fn rows_copy_words(slots: u32) -> u64 {
    1 + slots as u64
}

/// The bytes of [`Recorder::rows_copy`]'s list naming `rows`: the count, then the indices.
pub fn rows_copy_list(rows: &[u32]) -> Vec<u8> {
    std::iter::once(rows.len() as u32).chain(rows.iter().copied()).flat_map(u32::to_le_bytes).collect()
}

/// Logits a workgroup of the top-k's stages sorts (shaders/ops/topk.comp SPAN).
pub const TOPK_SPAN: u32 = 2048;

/// Keys ([`Recorder::topk`]) a row's largest logits take at most (a power of two up to 256):
/// a sampler with a top_k up to it can draw from them.
pub const TOPK_MAX: u32 = 64;

/// Key pairs (two words each) of the largest of the scratch lists [`Recorder::topk`] writes
/// between its stages, for `rows` rows of `n` logits and `k` keys a list.
pub fn topk_scratch_pairs(rows: u32, n: u32, k: u32) -> u64 {
    rows as u64 * n.div_ceil(TOPK_SPAN).max(1) as u64 * k as u64
}

/// Workgroups a row of the top-k's selection stages: as many slice bests, so the selection
/// serves a top of at most this many (a larger one is sorted; see shaders/ops/topk.comp).
pub const TOPK_SLICES: u32 = 64;

/// Words of the selection's buffer ([`Recorder::topk`] `sel`) for `rows` rows: a count, the
/// slice bests and TOPK_SPAN candidates a row.
pub fn topk_sel_words(rows: u32) -> u64 {
    rows as u64 * (1 + 2 * TOPK_SLICES as u64 + 2 * TOPK_SPAN as u64)
}

/// The (id, logit) of a key of [`Recorder::topk`]'s output, None for no candidate (fewer
/// finite logits than keys).
pub fn topk_decode(hi: u32, lo: u32) -> Option<(u32, f32)> {
    if hi == u32::MAX && lo == u32::MAX {
        return None;
    }
    Some((lo, resin_core::candidate_logit(hi)))
}

/// Words per row of the metadata block (see shaders/common/meta.glsl).
pub const META_WORDS: usize = 4;

/// One row's metadata as the kernels read it.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RowMeta {
    pub token: u32,
    pub pos: u32,
    /// Element offset of the row's region in every layer's mirror buffer.
    pub kv_base: u32,
    /// Keys the row attends to (pos + 1).
    pub keys: u32,
}
const _: () = assert!(std::mem::size_of::<RowMeta>() == META_WORDS * 4);

impl RowMeta {
    pub fn words(rows: &[RowMeta]) -> Vec<u8> {
        rows.iter().flat_map(|m| [m.token, m.pos, m.kv_base, m.keys]).flat_map(|w| w.to_le_bytes()).collect()
    }
}

/// A push-constant block: plain 32-bit fields, no padding.
pub trait Push: Copy {
    fn bytes(&self) -> Vec<u8> {
        let n = std::mem::size_of::<Self>();
        // SAFETY: implementors are #[repr(C)] structs of u32/f32 fields (no padding, every byte
        // initialised), checked by the size assertions below.
        unsafe { std::slice::from_raw_parts((self as *const Self).cast::<u8>(), n) }.to_vec()
    }
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct GemvPush {
    pub rows: u32,
    pub cols: u32,
    pub row_bytes: u32,
    pub x_stride: u32,
    pub y_stride: u32,
    pub y_off: u32,
}
const _: () = assert!(std::mem::size_of::<GemvPush>() == 24);
impl Push for GemvPush {}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct EmbedPush {
    pub cols: u32,
    pub row_bytes: u32,
    /// The bound part's first row and row count (0 and all rows when not split).
    pub row_start: u32,
    pub part_rows: u32,
    /// Each value times this (gemma's sqrt(n_embd); 1 for the others).
    pub scale: f32,
}
const _: () = assert!(std::mem::size_of::<EmbedPush>() == 20);
impl Push for EmbedPush {}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NormPush {
    pub n: u32,
    pub eps: f32,
}
const _: () = assert!(std::mem::size_of::<NormPush>() == 8);
impl Push for NormPush {}

/// The canonical norm's push block (`Recorder::normpack`): `count` = the packed layout's size.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NormPackPush {
    pub n: u32,
    pub eps: f32,
    pub count: u32,
}
const _: () = assert!(std::mem::size_of::<NormPackPush>() == 12);
impl Push for NormPackPush {}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CountPush {
    pub count: u32,
}
impl Push for CountPush {}

/// The grid-barrier probe's push block (`shaders/ops/grid_sync.comp`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct GridSyncPush {
    pub phases: u32,
    pub wgs: u32,
}
impl Push for GridSyncPush {}

/// The persistent-chain probe's push block (`shaders/ops/chain_probe.comp`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ChainProbePush {
    pub lo: u32,
    pub hi: u32,
    /// Floats an x region.
    pub xs: u32,
}
impl Push for ChainProbePush {}

/// flags: 1 = add the q/k/v bias, 2 = RMS-norm each q and k head (qwen3).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct RopePush {
    pub n_head: u32,
    pub n_head_kv: u32,
    pub head_dim: u32,
    pub rope_dims: u32,
    pub flags: u32,
    pub eps: f32,
}
const _: () = assert!(std::mem::size_of::<RopePush>() == 24);
impl Push for RopePush {}
pub const ROPE_BIAS: u32 = 1;
pub const ROPE_QK_NORM: u32 = 2;

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct AttnPush {
    pub n_head: u32,
    pub n_head_kv: u32,
    pub head_dim: u32,
    pub n_pieces: u32,
    pub scale: f32,
    /// A sliding-window layer's keys a row: its last `key_window`, its own included (0: all).
    pub key_window: u32,
}
const _: () = assert!(std::mem::size_of::<AttnPush>() == 24);
impl Push for AttnPush {}

/// What the decode attention reads and writes: the rows' queries, the layer's mirror (keys,
/// values), the rows' metadata, the pieces' partials and the merged output.
#[derive(Clone, Copy)]
pub struct AttnBinds<'a> {
    pub q: Bind<'a>,
    pub mk: Bind<'a>,
    pub mv: Bind<'a>,
    pub meta: Bind<'a>,
    pub part: Bind<'a>,
    pub out: Bind<'a>,
}

/// The rope-and-store that the merged decode attention takes in (attn.comp ROPE_IN): the rows'
/// k and v projections, the biases and the rope table rope_store reads. A region's rows in the
/// pass must be one run of consecutive positions in pass order, of at most `reads` rows.
#[derive(Clone, Copy)]
pub struct AttnRope<'a> {
    pub k: Bind<'a>,
    pub v: Bind<'a>,
    pub bias: Bind<'a>,
    pub table: Bind<'a>,
    pub rope_dims: u32,
    pub style: RopeStyle,
    /// Add the q/k/v bias.
    pub bias_on: bool,
    /// The QK norm (qwen3, gemma3): its weights (q's head_dim, then k's) and eps.
    pub qk_norm: Option<(Bind<'a>, f32)>,
    /// Keys of the pass a row reads at most, its own included: 1 where every row has a region
    /// of its own, else at least the longest run of a region's rows (a peel), at most
    /// NROW_MAX.
    pub reads: u32,
}

/// Whether the merged decode attention can rope and store itself over a mirror of `codec`
/// and heads of `head_dim` (f16 or f32, its shared arrays' 256 dims).
pub fn attn_rope_ok(codec: KvCodec, head_dim: u32) -> bool {
    codec != KvCodec::Q8_0 && head_dim <= 256
}

/// The merged attention's push block with its rope's fields (ROPE_IN).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct AttnRopePush {
    merge: AttnMergePush,
    rope_dims: u32,
    rflags: u32,
    qk_eps: f32,
}
const _: () = assert!(std::mem::size_of::<AttnRopePush>() == 44);
impl Push for AttnRopePush {}

/// The push block of the attention that merges its own pieces (attn.comp COMBINE).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct AttnMergePush {
    attn: AttnPush,
    heads: u32,
    count: u32,
}
const _: () = assert!(std::mem::size_of::<AttnMergePush>() == 32);
impl Push for AttnMergePush {}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CombinePush {
    pub n_head: u32,
    pub head_dim: u32,
    /// Heads a workgroup (1 unless it rounds its output).
    pub heads: u32,
    /// rows * n_head * head_dim: the packed layout's size (when it packs).
    pub count: u32,
    /// The attention's [`AttnPush::key_window`].
    pub key_window: u32,
}
const _: () = assert!(std::mem::size_of::<CombinePush>() == 20);

/// The soft-capping's push block: `count` values, x <- cap * tanh(x / cap).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct SoftcapPush {
    pub count: u32,
    pub cap: f32,
}
const _: () = assert!(std::mem::size_of::<SoftcapPush>() == 8);
impl Push for SoftcapPush {}
impl Push for CombinePush {}

/// What the decode attention's combine writes besides its f32 output: that output rounded
/// through 8-bit blocks for the matrix that reads it, bit for bit what [`Recorder::qact`]
/// (`Rounded`, into `y`) or [`Recorder::qpack`] (`Packed`, into `out`) would write after it.
#[derive(Clone, Copy)]
pub enum AttnRound<'a> {
    Rounded { block: u32, y: Bind<'a> },
    Packed { layout: QPack, out: Bind<'a> },
}

/// Heads a combine workgroup covers to round its output in blocks of `block` (32 or 256):
/// whole blocks a workgroup (`head_dim` a multiple of the block, or the block a multiple of
/// `head_dim` and of at most 8 heads that divide `n_head`). None: round after, with qact/qpack.
pub fn attn_round_heads(block: u32, head_dim: u32, n_head: u32) -> Option<u32> {
    if block != 32 && block != 256 || head_dim == 0 {
        return None;
    }
    let g = if head_dim.is_multiple_of(block) {
        1
    } else if block.is_multiple_of(head_dim) {
        block / head_dim
    } else {
        return None;
    };
    (g <= 8 && n_head.is_multiple_of(g) && g * head_dim <= WG * 8).then_some(g)
}

/// The shader name stem of a gated FFN's activation.
fn act_name(act: FfnAct) -> &'static str {
    match act {
        FfnAct::Silu => "swiglu",
        FfnAct::GeluTanh => "geglu",
    }
}

/// Partials a row and head of the decode attention holds (shaders/common/meta.glsl
/// ATTN_SLOTS): a row's keys go in at most this many pieces, of whole chunks of
/// [`ATTN_CHUNK`] keys, sized from its key count alone.
pub const ATTN_SLOTS: u32 = 32;
/// Keys a workgroup of the decode attention scores at once (meta.glsl ATTN_CHUNK, its [`WG`]).
pub const ATTN_CHUNK: u32 = 64;
const _: () = assert!(ATTN_CHUNK == WG);

/// The shader name suffix of a weight format the GEMV and embedding kernels read, or None
/// when this home has no kernel for it (a decline).
pub fn format_name(ty: GgmlType) -> Option<&'static str> {
    use GgmlType::*;
    Some(match ty {
        F32 => "f32",
        F16 => "f16",
        Q4_0 => "q4_0",
        Q4_1 => "q4_1",
        Q5_0 => "q5_0",
        Q8_0 => "q8_0",
        Q4_K => "q4_k",
        Q5_K => "q5_k",
        Q6_K => "q6_k",
        _ => return None,
    })
}

/// The activation rounding a weight format's GEMV reads (as the CPU home's integer dot
/// products do): None for float weights (f32 activations), else the block of 32 (the
/// Q4_0..Q8_0 family, ggml's q8_0) or 256 values (K-quants, ggml's q8_K).
pub fn act_block(ty: GgmlType) -> Option<u32> {
    use GgmlType::*;
    match ty {
        F32 | F16 | BF16 => None,
        Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q8_1 => Some(32),
        _ => Some(256),
    }
}

/// Experts a mixture-of-experts router takes at most (shaders/ops/moe.comp MAX_EXPERTS).
pub const MOE_MAX_EXPERTS: u32 = 256;
/// Experts a row chooses at most (moe.comp MAX_USED).
pub const MOE_MAX_USED: u32 = 8;

/// Words of what [`Recorder::moe_group`] writes for `slots` slots over `n_expert` experts: an
/// offset an expert and the total, then every slot once in the experts' lists, then the
/// [`moe_active_entries`] entries of the chosen experts.
pub fn moe_group_words(n_expert: u32, slots: u32) -> u32 {
    n_expert + 1 + slots + moe_active_entries(n_expert, slots)
}

/// Entries of [`Recorder::moe_group`]'s list of chosen experts: the most distinct experts
/// `slots` slots can choose.
pub fn moe_active_entries(n_expert: u32, slots: u32) -> u32 {
    n_expert.min(slots)
}

/// The entry [`Recorder::moe_group`] writes past its chosen experts.
pub const MOE_NO_EXPERT: u32 = u32::MAX;

/// moe.comp's reductions: subgroup operations `ops` over a power-of-two subgroup of 8 to 64
/// lanes (a route's lane holds at most a 32-bit mask of experts; ROUTE's workgroup holds 64
/// threads), else why `what` declines.
fn subgroups_for(info: &crate::device::DeviceInfo, ops: &[&str], what: &str) -> Result<(), VkError> {
    let lanes = info.subgroup_size;
    if ops.iter().all(|op| info.subgroup_ops.contains(op)) && lanes.is_power_of_two() && (8..=64).contains(&lanes) {
        return Ok(());
    }
    Err(VkError::Unsupported(format!(
        "{what} needs subgroup {} over a power-of-two subgroup of 8 to 64 lanes (device: {lanes} lanes, [{}])",
        ops.join(" and "),
        info.subgroup_ops.join(" ")
    )))
}

/// The router's checks: its experts and their count a row, within what moe.comp holds.
fn route_shape(n_expert: u32, k: u32) -> Result<(), VkError> {
    if n_expert == 0 || n_expert > MOE_MAX_EXPERTS || k == 0 || k > MOE_MAX_USED || k > n_expert {
        return Err(VkError::Unsupported(format!("routing {k} of {n_expert} experts (at most {MOE_MAX_USED} of {MOE_MAX_EXPERTS})")));
    }
    Ok(())
}

/// moe.comp's specialization constants: the form's first three (ROUTER SS_IN's chunk cut),
/// then the experts a subgroup lane holds, a row's chosen experts and (ROUTER) the subgroups
/// an expert's threads make, so the loops unroll over registers.
fn route_spec(info: &DeviceInfo, first: [u32; 3], n_expert: u32, k: u32) -> [u32; 6] {
    let lanes = info.subgroup_size;
    [first[0], first[1], first[2], n_expert.div_ceil(lanes), k, (ROUTER_THREADS / ROUTER_EXPERTS_A_WG / lanes).max(1)]
}

/// Experts a workgroup of [`Recorder::moe_router`] takes (moe.comp EPW), and its threads
/// (GROUP_WG); the threads of a [`Recorder::moe_route`] workgroup (RWG).
const ROUTER_EXPERTS_A_WG: u32 = 2;
const ROUTER_THREADS: u32 = 256;
const ROUTE_THREADS: u32 = 64;

/// The rows [`Recorder::moe_router`] reads: normed, or made from the residual rows `x`, their
/// 32-value blocks' sums of squares `ss` ([rows][d / 32], what `mv::MvOut::AddPack` writes)
/// and the norm's weights `w` with its `eps`, as normpack writes them (`Recorder::normpack_xn`).
#[derive(Clone, Copy)]
pub enum RouterIn<'a> {
    Normed(Bind<'a>),
    Sums { x: Bind<'a>, ss: Bind<'a>, w: Bind<'a>, eps: f32 },
}

/// The buffers of [`Recorder::moe_router`]: the F32 router, the rows it reads, and what it
/// writes (the logits, the slots' experts and weights, the slot lists), and its counter.
pub struct RouterBinds<'a> {
    pub router: Bind<'a>,
    pub input: RouterIn<'a>,
    pub logits: Bind<'a>,
    pub sel: Bind<'a>,
    pub wt: Bind<'a>,
    pub grp: Bind<'a>,
    /// A word left zero between dispatches.
    pub done: Bind<'a>,
}

/// The expert GEMV's push block: the GEMV's, then the slots a row of activations.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct GemvExpertPush {
    pub g: GemvPush,
    pub x_div: u32,
}
const _: () = assert!(std::mem::size_of::<GemvExpertPush>() == 28);
impl Push for GemvExpertPush {}

/// The router's and the weighted sum's push block (shaders/ops/moe.comp).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct MoePush {
    a: u32,
    d: u32,
    k: u32,
}
impl Push for MoePush {}

/// moe.comp ROUTER's push block.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct RouterPush {
    rows: u32,
    n_expert: u32,
    k: u32,
    d: u32,
    eps: f32,
}
impl Push for RouterPush {}

/// Largest head dimension the attention and rope kernels take.
pub const MAX_HEAD_DIM: usize = 256;

/// The GEMV kernels (`shaders/ops/gemv.comp`), one source with two tiers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GemvTier {
    /// Any device: one workgroup of [`WG`] threads per weight row, 32-value units a thread,
    /// a shared-memory tree reduction (`gemv_<fmt>`).
    Portable,
    /// Subgroup arithmetic: one subgroup per weight row, [`GEMV_SG_ROWS`] rows a workgroup,
    /// lanes reading neighbouring 8-value pieces, `subgroupAdd` (`gemv_sg_<fmt>`).
    Subgroup,
}

/// Rows a workgroup of the subgroup tier (one subgroup each), before the device's limit on
/// workgroup invocations.
pub const GEMV_SG_ROWS: u32 = 4;

impl GemvTier {
    /// The fastest tier the device runs: the subgroup tier when compute shaders have subgroup
    /// arithmetic and subgroups of at least 4 lanes, else the portable one.
    pub fn for_device(info: &DeviceInfo) -> GemvTier {
        if GemvTier::subgroup_ok(info) {
            GemvTier::Subgroup
        } else {
            GemvTier::Portable
        }
    }

    fn subgroup_ok(info: &DeviceInfo) -> bool {
        info.subgroup_ops.contains(&"arithmetic") && info.subgroup_size >= 4 && info.subgroup_size <= info.max_workgroup_invocations
    }

    /// (workgroup size, rows a workgroup) of the subgroup tier on this device. The workgroup is
    /// a multiple of the reported subgroup size (the largest a device runs), so no subgroup is
    /// partial even where the driver picks narrower ones (the shader then loops its rows).
    pub fn subgroup_shape(info: &DeviceInfo) -> (u32, u32) {
        let s = info.subgroup_size.max(1);
        let rows = GEMV_SG_ROWS.min(info.max_workgroup_invocations / s).max(1);
        (rows * s, rows)
    }
}

/// Split `n` workgroups into an (x, y) grid within the 65535 per-dimension minimum limit.
pub fn grid(n: u32) -> [u32; 3] {
    let x = n.clamp(1, 65535);
    [x, n.div_ceil(x).max(1), 1]
}

/// Records dispatches into one command buffer, making pipelines and descriptor sets as it goes.
pub struct Recorder<'a> {
    pub gpu: &'a Gpu,
    pub pipes: &'a mut Pipelines,
    pub desc: &'a mut Descriptors,
    pub cmd: vk::CommandBuffer,
    /// What has been recorded so far: dispatches, barriers, dependent stages.
    pub tally: std::cell::Cell<StepCounts>,
}

impl<'a> Recorder<'a> {
    pub fn new(gpu: &'a Gpu, pipes: &'a mut Pipelines, desc: &'a mut Descriptors, cmd: vk::CommandBuffer) -> Self {
        Recorder { gpu, pipes, desc, cmd, tally: Default::default() }
    }

    pub(crate) fn run(&mut self, name: &str, spec: &[u32], binds: &[Bind<'_>], push: &[u8], groups: [u32; 3]) -> Result<(), VkError> {
        let k = self.pipes.get(name, binds.len() as u32, push.len() as u32, spec)?;
        let set = self.desc.set(&k, binds)?;
        k.dispatch(self.cmd, set, push, groups);
        self.tally_work();
        Ok(())
    }

    /// Count work recorded since the last barrier (a dispatch, or a copy the caller records).
    pub fn tally_work(&self) {
        let mut t = self.tally.get();
        t.dispatches += 1;
        if !t.open {
            t.open = true;
            t.stages += 1;
        }
        self.tally.set(t);
    }

    fn tally_barrier(&self) {
        let mut t = self.tally.get();
        t.barriers += 1;
        t.open = false;
        self.tally.set(t);
    }

    /// Make shader writes so far visible to the shaders that follow.
    pub fn barrier(&self) {
        barrier(self.gpu, self.cmd);
        self.tally_barrier();
    }

    /// [`Recorder::barrier`] that also orders copies (before and after it) with shaders.
    pub fn transfer_barrier(&self) {
        transfer_barrier(self.gpu, self.cmd);
        self.tally_barrier();
    }

    /// y[c][y_off + r] = W[r] . x[c] for c < n (1..=8): the one-row form at n = 1, the N-row
    /// form otherwise, in the device's tier ([`GemvTier::for_device`]).
    pub fn gemv(&mut self, ty: GgmlType, n: u32, w: Bind<'_>, x: Bind<'_>, y: Bind<'_>, p: GemvPush) -> Result<(), VkError> {
        self.gemv_tier(GemvTier::for_device(&self.gpu.info), ty, n, w, x, y, p)
    }

    /// [`Recorder::gemv`] in a chosen tier (tests run both); the subgroup tier on a device
    /// without it is an `Unsupported` error.
    #[allow(clippy::too_many_arguments)]
    pub fn gemv_tier(&mut self, tier: GemvTier, ty: GgmlType, n: u32, w: Bind<'_>, x: Bind<'_>, y: Bind<'_>, p: GemvPush) -> Result<(), VkError> {
        let f = format_name(ty).ok_or_else(|| VkError::Unsupported(format!("no GEMV kernel for {ty}")))?;
        if !(1..=8).contains(&n) || !p.cols.is_multiple_of(32) {
            return Err(VkError::Unsupported(format!("GEMV of {n} columns over {} values a row", p.cols)));
        }
        let form = if n == 1 { "" } else { "_nrow" };
        match tier {
            GemvTier::Portable => self.run(&format!("gemv_{f}{form}"), &[WG, n], &[w, x, y], &p.bytes(), grid(p.rows)),
            GemvTier::Subgroup => {
                let info = &self.gpu.info;
                if !GemvTier::subgroup_ok(info) {
                    return Err(VkError::Unsupported(format!(
                        "the subgroup GEMV needs subgroup arithmetic and subgroups of 4+ lanes (device: {} lanes, [{}])",
                        info.subgroup_size,
                        info.subgroup_ops.join(" ")
                    )));
                }
                let (wg, rows) = GemvTier::subgroup_shape(info);
                self.run(&format!("gemv_sg_{f}{form}"), &[wg, n, rows], &[w, x, y], &p.bytes(), grid(p.rows.div_ceil(rows)))
            }
        }
    }

    /// The experts' GEMV (shaders/ops/gemv.comp EXPERT): for each of `slots` slots s,
    /// y[s * y_stride + y_off + r] = W_e[r] . x[s / x_div] over the `p.rows` rows of expert
    /// e = sel[s] of the stack `w` (experts of `p.rows` rows each, one after another), so a
    /// slot reads its own expert's rows only. In the device's tier, one activation row a slot.
    #[allow(clippy::too_many_arguments)]
    pub fn gemv_expert(&mut self, ty: GgmlType, slots: u32, w: Bind<'_>, x: Bind<'_>, y: Bind<'_>, sel: Bind<'_>, p: GemvPush, x_div: u32) -> Result<(), VkError> {
        let f = format_name(ty).ok_or_else(|| VkError::Unsupported(format!("no GEMV kernel for {ty}")))?;
        if !p.cols.is_multiple_of(32) || x_div == 0 || slots > 65535 {
            return Err(VkError::Unsupported(format!("an expert GEMV of {slots} slots over {} values a row", p.cols)));
        }
        if sel.range < slots as u64 * 4 {
            return Err(VkError::OutOfRange(format!("{} bytes of expert ids for {slots} slots", sel.range)));
        }
        let push = GemvExpertPush { g: p, x_div }.bytes();
        let g = |wgs: u32| {
            let [x, y, _] = grid(wgs);
            [x, y, slots]
        };
        match GemvTier::for_device(&self.gpu.info) {
            GemvTier::Portable => self.run(&format!("gemv_x_{f}"), &[WG, 1], &[w, x, y, sel], &push, g(p.rows)),
            GemvTier::Subgroup => {
                let (wg, rows) = GemvTier::subgroup_shape(&self.gpu.info);
                self.run(&format!("gemv_sg_x_{f}"), &[wg, 1, rows], &[w, x, y, sel], &push, g(p.rows.div_ceil(rows)))
            }
        }
    }

    /// Each of `rows` rows' chosen experts (shaders/ops/moe.comp ROUTE): from the row's router
    /// logits (`logits`: [rows][n_expert]), softmax, the top `k`, renormalised; slot r * k + j
    /// (j in rank order) gets its expert id in `sel` and its weight in `wt`.
    pub fn moe_route(&mut self, rows: u32, n_expert: u32, k: u32, logits: Bind<'_>, sel: Bind<'_>, wt: Bind<'_>) -> Result<(), VkError> {
        route_shape(n_expert, k)?;
        subgroups_for(&self.gpu.info, &["shuffle"], "the route")?;
        let slots = rows as u64 * k as u64 * 4;
        if logits.range < rows as u64 * n_expert as u64 * 4 || sel.range < slots || wt.range < slots {
            return Err(VkError::OutOfRange(format!("router buffers for {rows} rows, {n_expert} experts, {k} a row")));
        }
        let rows_a_wg = ROUTE_THREADS / self.gpu.info.subgroup_size;
        let spec = route_spec(&self.gpu.info, [0; 3], n_expert, k);
        self.run("moe_route", &spec, &[logits, sel, wt], &MoePush { a: rows, d: n_expert, k }.bytes(), grid(rows.div_ceil(rows_a_wg)))
    }

    /// A token command's router in one dispatch (shaders/ops/moe.comp ROUTER): for `rows`
    /// (1..=8) rows of `d` normed values, the logits of the F32 router ([n_expert][d]), each
    /// row's route as [`Recorder::moe_route`] writes it, and the slots' lists as
    /// [`Recorder::moe_group`] writes them. A row's logits are the same bits whatever rows
    /// share the dispatch.
    pub fn moe_router(&mut self, rows: u32, n_expert: u32, k: u32, d: u32, b: RouterBinds<'_>) -> Result<(), VkError> {
        route_shape(n_expert, k)?;
        subgroups_for(&self.gpu.info, &["shuffle", "arithmetic"], "the router")?;
        if !(1..=NROW_MAX as u32).contains(&rows) || d == 0 || !d.is_multiple_of(4) {
            return Err(VkError::Unsupported(format!("a router over {rows} rows of {d} values (1..={NROW_MAX} rows, a multiple of 4)")));
        }
        let slots = (rows * k) as u64 * 4;
        let f = |n: u32| n as u64 * 4;
        let x = match b.input {
            RouterIn::Normed(x) => x,
            RouterIn::Sums { x, ss, w, .. } => {
                if !d.is_multiple_of(32) || ss.range < rows as u64 * f(d / 32) || w.range < f(d) {
                    return Err(VkError::OutOfRange(format!("the sums of squares and norm of {rows} rows of {d} for the router")));
                }
                x
            }
        };
        if b.router.range < n_expert as u64 * f(d)
            || x.range < rows as u64 * f(d)
            || b.logits.range < rows as u64 * f(n_expert)
            || b.sel.range < slots
            || b.wt.range < slots
            || b.grp.range < f(moe_group_words(n_expert, rows * k))
            || b.done.range < 4
        {
            return Err(VkError::OutOfRange(format!("router buffers for {rows} rows of {d}, {n_expert} experts, {k} a row")));
        }
        let wgs = [n_expert.div_ceil(ROUTER_EXPERTS_A_WG), 1, 1];
        let binds = [b.router, x, b.logits, b.sel, b.wt, b.grp, b.done];
        match b.input {
            RouterIn::Normed(_) => {
                let spec = route_spec(&self.gpu.info, [0; 3], n_expert, k);
                self.run("moe_router", &spec, &binds, &RouterPush { rows, n_expert, k, d, eps: 0.0 }.bytes(), wgs)
            }
            RouterIn::Sums { ss, w, eps, .. } => {
                let cut = resin_core::canon::Cut::of(d as usize).ok_or_else(|| VkError::Unsupported(format!("a canonical norm of rows of {d} values")))?;
                let spec = route_spec(&self.gpu.info, [cut.lanes as u32, cut.chunk_blocks as u32, cut.chunks as u32], n_expert, k);
                let binds: Vec<Bind<'_>> = binds.into_iter().chain([ss, w]).collect();
                self.run("moe_router_ss", &spec, &binds, &RouterPush { rows, n_expert, k, d, eps }.bytes(), wgs)
            }
        }
    }

    /// The slots that chose each expert (shaders/ops/moe.comp GROUP), from the expert ids `sel`
    /// of `slots` slots: `grp` gets [`moe_group_words`] words, expert e's slots (in slot order)
    /// at words n_expert + 1 + grp[e] .. n_expert + 1 + grp[e + 1]: the columns of the
    /// canonical product's expert form ([`crate::mv::Experts`]). An id of no expert (n_expert
    /// or more) is in no list, and the words past the lists' end are left as they were. From
    /// word n_expert + 1 + slots, [`moe_active_entries`] words: the experts some slot chose,
    /// in index order, then [`MOE_NO_EXPERT`] (the expert products take a workgroup an entry).
    pub fn moe_group(&mut self, slots: u32, n_expert: u32, sel: Bind<'_>, grp: Bind<'_>) -> Result<(), VkError> {
        if n_expert == 0 || n_expert > MOE_MAX_EXPERTS {
            return Err(VkError::Unsupported(format!("grouping slots by {n_expert} experts (at most {MOE_MAX_EXPERTS})")));
        }
        subgroups_for(&self.gpu.info, &["arithmetic"], "grouping slots")?;
        if sel.range < slots as u64 * 4 || grp.range < moe_group_words(n_expert, slots) as u64 * 4 {
            return Err(VkError::OutOfRange(format!("expert lists of {slots} slots over {n_expert} experts in {} bytes", grp.range)));
        }
        self.run("moe_group", &[], &[sel, grp], &MoePush { a: slots, d: n_expert, k: 0 }.bytes(), [1, 1, 1])
    }

    /// out[r] = the sum over j in rank order of wt[r * k + j] * y[r * k + j], rows of `d`
    /// (shaders/ops/moe.comp COMBINE).
    pub fn moe_combine(&mut self, rows: u32, d: u32, k: u32, wt: Bind<'_>, y: Bind<'_>, out: Bind<'_>) -> Result<(), VkError> {
        let count = rows * d;
        if wt.range < (rows * k) as u64 * 4 || y.range < (count * k) as u64 * 4 || out.range < count as u64 * 4 {
            return Err(VkError::OutOfRange(format!("expert sum buffers for {rows} rows of {d}, {k} experts a row")));
        }
        self.run("moe_combine", &[], &[wt, y, out], &MoePush { a: count, d, k }.bytes(), grid(count.div_ceil(64)))
    }

    /// x[r] = embedding row of meta[r].token, for `rows` rows.
    pub fn embed(&mut self, ty: GgmlType, rows: u32, w: Bind<'_>, meta: Bind<'_>, x: Bind<'_>, p: EmbedPush) -> Result<(), VkError> {
        let f = format_name(ty).ok_or_else(|| VkError::Unsupported(format!("no embedding kernel for {ty}")))?;
        self.run(&format!("embed_{f}"), &[WG], &[w, meta, x], &p.bytes(), [rows, 1, 1])
    }

    /// out = rmsnorm(x (+= add when `add` is Some)) * w, for `rows` rows of at most 16384.
    pub fn rmsnorm(&mut self, rows: u32, x: Bind<'_>, add: Option<Bind<'_>>, w: Bind<'_>, out: Bind<'_>, p: NormPush) -> Result<(), VkError> {
        if p.n > NORM_MAX {
            return Err(VkError::Unsupported(format!("a norm of {} values a row (at most {NORM_MAX})", p.n)));
        }
        let (name, a) = match add {
            Some(a) => ("rmsnorm_add", a),
            None => ("rmsnorm", x),
        };
        self.run(name, &[NORM_WG], &[x, a, w, out], &p.bytes(), [rows, 1, 1])
    }

    /// [`Recorder::rmsnorm`] that also writes `out` rounded through 8-bit blocks of 32 values to
    /// `q32` and of 256 values to `q256` (each when Some), bit for bit what [`Recorder::qact`]
    /// over `out` would write, in the same dispatch. `p.n` must be a multiple of each block.
    #[allow(clippy::too_many_arguments)]
    pub fn rmsnorm_q(
        &mut self,
        rows: u32,
        x: Bind<'_>,
        add: Option<Bind<'_>>,
        w: Bind<'_>,
        out: Bind<'_>,
        q32: Option<Bind<'_>>,
        q256: Option<Bind<'_>>,
        p: NormPush,
    ) -> Result<(), VkError> {
        self.norm_rounded(rows, [x, w, out], add, [q32, q256], p)
    }

    /// The norm with its output rounded through the blocks of 32 and 256 asked for.
    fn norm_rounded(&mut self, rows: u32, [x, w, out]: [Bind<'_>; 3], add: Option<Bind<'_>>, [q32, q256]: [Option<Bind<'_>>; 2], p: NormPush) -> Result<(), VkError> {
        let base = if add.is_some() { "rmsnorm_add" } else { "rmsnorm" };
        let name = format!("{base}_q");
        let a = add.unwrap_or(x);
        let mask = u32::from(q32.is_some()) | (u32::from(q256.is_some()) << 1);
        if p.n > NORM_MAX {
            return Err(VkError::Unsupported(format!("a fused norm and rounding of {} values a row (at most {NORM_MAX})", p.n)));
        }
        for (q, b) in [(q32, 32), (q256, 256)] {
            if q.is_some() && !p.n.is_multiple_of(b) {
                return Err(VkError::Unsupported(format!("rounding {} values a row in blocks of {b}", p.n)));
            }
        }
        let push = p.bytes();
        // An unused rounded output binds `out` (never written through that binding).
        self.run(&name, &[NORM_WG, mask], &[x, a, w, out, q32.unwrap_or(out), q256.unwrap_or(out)], &push, [rows, 1, 1])
    }

    /// The grid-barrier probe (`shaders/ops/grid_sync.comp`, a measurement): `phases` phases
    /// of `wgs` workgroups in one dispatch, each phase ended by a spin on a global counter.
    /// `sync` holds [arrived = 0, bad = 0, wgs words]; `bad` comes back non-zero when a phase
    /// timed out (not every workgroup resident) or a workgroup saw a stale word.
    /// `rmw`: waiting workgroups poll with atomic adds of 0 instead of plain volatile loads.
    pub fn grid_sync(&mut self, phases: u32, wgs: u32, rmw: bool, sync: Bind<'_>) -> Result<(), VkError> {
        self.run(if rmw { "grid_sync_rmw" } else { "grid_sync" }, &[], &[sync], &GridSyncPush { phases, wgs }.bytes(), [wgs, 1, 1])
    }

    /// The persistent-chain probe (`shaders/ops/chain_probe.comp`, a measurement): stages
    /// `p.lo..p.hi` of the int8 products described by `stages` in one dispatch of `wgs`
    /// workgroups, a grid-wide barrier between two stages (`ahead`: each subgroup loads its
    /// next row before it waits); `sync` holds the arrivals and the timed-out waits.
    pub fn chain_probe(&mut self, ahead: bool, wgs: u32, p: ChainProbePush, b: [Bind<'_>; 4]) -> Result<(), VkError> {
        if self.gpu.info.subgroup_size < 8 || p.xs == 0 {
            return Err(VkError::Unsupported(format!("the chain probe on subgroups of {}", self.gpu.info.subgroup_size)));
        }
        self.run(if ahead { "chain_probe_ahead" } else { "chain_probe" }, &[], &b, &p.bytes(), [wgs, 1, 1])
    }

    /// g <- act(g) * u over `count` values (silu: SwiGLU; tanh GELU: GeGLU).
    pub fn swiglu(&mut self, act: FfnAct, count: u32, g: Bind<'_>, u: Bind<'_>) -> Result<(), VkError> {
        self.run(act_name(act), &[], &[g, u], &CountPush { count }.bytes(), grid(count.div_ceil(256)))
    }

    /// y = act(g) * u rounded through 8-bit blocks of `block` values (32 or 256), `count`
    /// values: bit for bit [`Recorder::swiglu`] then [`Recorder::qact`], in one dispatch (g is
    /// left as it was).
    pub fn swiglu_q(&mut self, act: FfnAct, block: u32, count: u32, g: Bind<'_>, u: Bind<'_>, y: Bind<'_>) -> Result<(), VkError> {
        if block != 32 && block != 256 {
            return Err(VkError::Unsupported(format!("activation blocks of {block}")));
        }
        let name = format!("{}_q{block}", act_name(act));
        if !count.is_multiple_of(block) {
            return Err(VkError::Unsupported(format!("{count} activations in blocks of {block}")));
        }
        self.run(&name, &[], &[g, u, y], &CountPush { count }.bytes(), grid(count.div_ceil(2048)))
    }

    /// act(g) * u packed for the canonical product (`layout.count` values into `out`): bit for bit
    /// [`Recorder::swiglu`] then [`Recorder::qpack`], in one dispatch (g is left as it was).
    pub fn swiglu_p(&mut self, act: FfnAct, layout: QPack, g: Bind<'_>, u: Bind<'_>, out: Bind<'_>) -> Result<(), VkError> {
        let name = format!("{}_p32", act_name(act));
        if out.range < layout.bytes() {
            return Err(VkError::OutOfRange(format!("{} bytes for a packed layout of {}", out.range, layout.bytes())));
        }
        self.run(&name, &[], &[g, u, out], &CountPush { count: layout.count }.bytes(), grid(layout.count.div_ceil(2048)))
    }

    /// x <- cap * tanh(x / cap) over `count` values (final logit soft-capping).
    pub fn softcap(&mut self, count: u32, cap: f32, x: Bind<'_>) -> Result<(), VkError> {
        if !(cap > 0.0 && cap.is_finite()) {
            return Err(VkError::Model(format!("a soft-cap of {cap}")));
        }
        self.run("softcap", &[], &[x], &SoftcapPush { count, cap }.bytes(), grid(count.div_ceil(256)))
    }

    /// Rope-and-store for `rows` rows (see shaders/ops/rope_store.comp).
    #[allow(clippy::too_many_arguments)]
    pub fn rope_store(&mut self, style: RopeStyle, codec: KvCodec, rows: u32, [q, k, v, bias, norm, table, meta, mk, mv]: [Bind<'_>; 9], p: RopePush) -> Result<(), VkError> {
        let s = match style {
            RopeStyle::Norm => "norm",
            RopeStyle::Neox => "neox",
        };
        let c = codec_name(codec, p.head_dim)?;
        self.run(&format!("rope_{s}_{c}"), &[WG], &[q, k, v, bias, norm, table, meta, mk, mv], &p.bytes(), [p.n_head + p.n_head_kv, rows, 1])
    }

    /// Decode attention, then the combine (with a barrier between): each row's keys in pieces
    /// sized from its key count alone (see [`ATTN_SLOTS`]), `p.n_pieces` (1..=ATTN_SLOTS)
    /// workgroups a row and head taking them; `part` holds [`attn_part_len`]`(rows, n_head,
    /// head_dim, ATTN_SLOTS)` floats. A row's result does not depend on `rows` or `n_pieces`.
    #[allow(clippy::too_many_arguments)]
    pub fn attention(&mut self, codec: KvCodec, rows: u32, b: AttnBinds<'_>, p: AttnPush) -> Result<(), VkError> {
        self.attention_round(codec, rows, b, None, None, None, p)
    }

    /// [`Recorder::attention`] whose combine also writes its output rounded as `round` asks
    /// (see [`AttnRound`]; the block must pass [`attn_round_heads`]), in the same dispatch.
    /// With `done` (at least `rows * n_head` zeroed words, left zeroed) the workgroup that
    /// finishes a row's head group last merges its pieces, in the attention's dispatch (no
    /// combine dispatch and barrier); the same results bit for bit. With `rope` too (f16 or
    /// f32 mirror), the attention ropes and stores its rows' q, k and v itself, what
    /// [`Recorder::rope_store`] then a barrier would do, bit for bit (every row's region its
    /// own).
    #[allow(clippy::too_many_arguments)]
    pub fn attention_round(
        &mut self,
        codec: KvCodec,
        rows: u32,
        b: AttnBinds<'_>,
        round: Option<AttnRound<'_>>,
        done: Option<Bind<'_>>,
        rope: Option<AttnRope<'_>>,
        p: AttnPush,
    ) -> Result<(), VkError> {
        let AttnBinds { q, mk, mv, meta, part, out } = b;
        let c = codec_name(codec, p.head_dim)?;
        if let Some(rp) = rope {
            if done.is_none()
                || !attn_rope_ok(codec, p.head_dim)
                || !(1..=resin_core::NROW_MAX as u32).contains(&rp.reads)
                || rp.rope_dims > p.head_dim
                || !rp.rope_dims.is_multiple_of(2)
                || p.n_head_kv == 0
                || !p.n_head.is_multiple_of(p.n_head_kv)
            {
                return Err(VkError::Unsupported(format!(
                    "the attention's own rope-and-store ({codec:?} mirror, head_dim {}, rope_dims {}, merged: {}, keys of the pass a row reads {})",
                    p.head_dim,
                    rp.rope_dims,
                    done.is_some(),
                    rp.reads
                )));
            }
        }
        if !(1..=ATTN_SLOTS).contains(&p.n_pieces) || p.head_dim as usize > MAX_HEAD_DIM || !p.head_dim.is_multiple_of(2) {
            return Err(VkError::Unsupported(format!("decode attention of {} workgroups a head over head_dim {}", p.n_pieces, p.head_dim)));
        }
        let need = attn_part_len(rows as usize, p.n_head as usize, p.head_dim as usize, ATTN_SLOTS as usize) as u64 * 4;
        if part.range < need {
            return Err(VkError::OutOfRange(format!("{} bytes of attention partials for {rows} rows (need {need})", part.range)));
        }
        if let Some(d) = done {
            if d.range < (rows * p.n_head) as u64 * 4 {
                return Err(VkError::OutOfRange(format!("{} bytes of attention counters for {rows} rows of {} heads", d.range, p.n_head)));
            }
        }
        let count = rows * p.n_head * p.head_dim;
        if done.is_none() {
            self.run(&format!("attn_{c}"), &[WG], &[q, mk, mv, meta, part], &p.bytes(), [p.n_head, p.n_pieces, rows])?;
            self.barrier();
        }
        // The merged forms: the combine's binds after the attention's, its push after AttnPush.
        let merged = |rec: &mut Self, form: &str, block: u32, heads: u32, y: Bind<'_>, done: Bind<'_>| {
            let mp = AttnMergePush { attn: p, heads, count };
            let groups = [p.n_head, p.n_pieces, rows];
            match rope {
                None => rec.run(&format!("attn_{form}_{c}"), &[WG, block], &[q, mk, mv, meta, part, out, y, done], &mp.bytes(), groups),
                Some(rp) => {
                    let rflags = u32::from(rp.bias_on) | if rp.style == RopeStyle::Neox { 2 } else { 0 } | if rp.qk_norm.is_some() { 4 } else { 0 };
                    let (qkn, qk_eps) = rp.qk_norm.unwrap_or((rp.bias, 0.0));
                    let push = AttnRopePush { merge: mp, rope_dims: rp.rope_dims, rflags, qk_eps };
                    rec.run(
                        &format!("attn_{form}_{c}_rope"),
                        &[WG, block, rp.reads],
                        &[q, mk, mv, meta, part, out, y, done, rp.k, rp.v, rp.bias, rp.table, qkn],
                        &push.bytes(),
                        groups,
                    )
                }
            }
        };
        let (name, block, y) = match round {
            None => {
                if let Some(d) = done {
                    return merged(self, "c", 32, 1, out, d);
                }
                let cp = CombinePush { n_head: p.n_head, head_dim: p.head_dim, heads: 1, count, key_window: p.key_window };
                return self.run("attn_combine", &[WG], &[part, meta, out], &cp.bytes(), [p.n_head, rows, 1]);
            }
            Some(AttnRound::Rounded { block, y }) => {
                if y.range < count as u64 * 4 {
                    return Err(VkError::OutOfRange(format!("{} bytes for {count} rounded attention outputs", y.range)));
                }
                ("attn_combine_q", block, y)
            }
            Some(AttnRound::Packed { layout, out: y }) => {
                if layout.count != count || y.range < layout.bytes() {
                    return Err(VkError::OutOfRange(format!("a packed layout of {} values in {} bytes for {count} attention outputs", layout.count, y.range)));
                }
                ("attn_combine_p", 32, y)
            }
        };
        let heads = attn_round_heads(block, p.head_dim, p.n_head)
            .ok_or_else(|| VkError::Unsupported(format!("the combine rounding {} heads of {} values in blocks of {block}", p.n_head, p.head_dim)))?;
        if let Some(d) = done {
            let form = if name == "attn_combine_p" { "cp" } else { "cq" };
            return merged(self, form, block, heads, y, d);
        }
        let cp = CombinePush { n_head: p.n_head, head_dim: p.head_dim, heads, count, key_window: p.key_window };
        self.run(name, &[WG, block], &[part, meta, out, y], &cp.bytes(), [p.n_head / heads, rows, 1])
    }

    /// y = x rounded through 8-bit blocks of `block` values (32 or 256), `count` values.
    pub fn qact(&mut self, block: u32, count: u32, x: Bind<'_>, y: Bind<'_>) -> Result<(), VkError> {
        let name = match block {
            32 => "qact32",
            256 => "qact256",
            _ => return Err(VkError::Unsupported(format!("activation blocks of {block}"))),
        };
        if !count.is_multiple_of(block) {
            return Err(VkError::Unsupported(format!("{count} activations in blocks of {block}")));
        }
        // A workgroup rounds 2048 values (whole blocks of either size).
        self.run(name, &[], &[x, y], &CountPush { count }.bytes(), grid(count.div_ceil(2048)))
    }

    /// The `k` largest finite logits of each of `rows` rows of `n`, best first, as key pairs
    /// (see shaders/ops/topk.comp; [`topk_decode`] reads one) into `out` (`rows * k` pairs),
    /// ordered as the host sampler orders candidates (descending logits, ties by id). `sel`
    /// holds [`topk_sel_words`] words: the selection's candidates, the few hundred keys a row
    /// that can be among the best, ranked by one workgroup a row (for `k` up to
    /// TOPK_SLICES). A row with more (many equal or non-finite logits), or every row of a
    /// larger `k`, is sorted instead: `a` and `b` hold [`topk_scratch_pairs`] pairs each
    /// between the sort's stages (`b` unused up to TOPK_SPAN x TOPK_SPAN / k logits a row),
    /// whose workgroups pass over the rows the selection served. `k`: a power of two up to
    /// 256.
    #[allow(clippy::too_many_arguments)]
    pub fn topk(&mut self, rows: u32, n: u32, k: u32, logits: Bind<'_>, a: Bind<'_>, b: Bind<'_>, sel: Bind<'_>, out: Bind<'_>) -> Result<(), VkError> {
        if !k.is_power_of_two() || k > 256 || n == 0 {
            return Err(VkError::Unsupported(format!("the top {k} of {n} logits (a power of two up to 256)")));
        }
        let scratch = topk_scratch_pairs(rows, n, k) * 8;
        if out.range < rows as u64 * k as u64 * 8 || a.range < scratch || b.range < scratch || sel.range < topk_sel_words(rows) * 4 {
            return Err(VkError::OutOfRange(format!("top-k buffers of {}, {}, {} and {} bytes for {rows} rows of {n} (k {k})", out.range, a.range, b.range, sel.range)));
        }
        let fan = TOPK_SPAN / k;
        let slices = if k <= TOPK_SLICES { TOPK_SLICES } else { 0 };
        let mut lists = n.div_ceil(TOPK_SPAN);
        let push = |lists: u32, out_lists: u32| [n, lists, out_lists, slices].iter().flat_map(|w| w.to_le_bytes()).collect::<Vec<u8>>();
        if slices > 0 {
            // The selection: slice bests, then the candidates up to the worst of them, ranked.
            self.run("topk_thresh", &[k], &[logits, out, sel], &push(lists, 1), [slices, rows, 1])?;
            self.barrier();
            self.run("topk_gather", &[k], &[logits, out, sel], &push(lists, 1), [slices, rows, 1])?;
            self.barrier();
            self.run("topk_select", &[k], &[logits, out, sel], &push(lists, 1), [1, rows, 1])?;
            self.barrier();
        }
        // The sort, of the rows with too many candidates.
        let first = if lists == 1 { out } else { a };
        self.run("topk_part", &[k], &[logits, first, sel], &push(lists, lists), [lists, rows, 1])?;
        let (mut src, mut dst) = (a, b);
        while lists > 1 {
            self.barrier();
            let groups = lists.div_ceil(fan);
            let to = if groups == 1 { out } else { dst };
            self.run("topk_merge", &[k], &[src, to, sel], &push(lists, groups), [groups, rows, 1])?;
            (src, dst) = (dst, src);
            lists = groups;
        }
        Ok(())
    }

    /// dst row j = src row list[1 + j] for j < list[0] (at most `slots`), rows of `n` values,
    /// `rows` of them in src (an index past them copies nothing): the rows a top step reads
    /// back whole, named by a list the host writes before each submit ([`rows_copy_words`]),
    /// so the recorded command serves any choice of them.
    pub fn rows_copy(&mut self, slots: u32, n: u32, rows: u32, src: Bind<'_>, list: Bind<'_>, dst: Bind<'_>) -> Result<(), VkError> {
        let need = slots as u64 * n as u64 * 4;
        if src.range < rows as u64 * n as u64 * 4 || dst.range < need || list.range < rows_copy_words(slots) * 4 {
            return Err(VkError::OutOfRange(format!("row copy buffers of {}, {} and {} bytes for {slots} of {rows} rows of {n}", src.range, list.range, dst.range)));
        }
        let push = [n, rows].iter().flat_map(|w| w.to_le_bytes()).collect::<Vec<u8>>();
        self.run("rows_copy", &[], &[src, list, dst], &push, [ROWS_COPY_SLICES, slots, 1])
    }

    /// dst = src for `words` 16-byte words over `groups` workgroups (shaders/ops/copy.comp).
    pub fn copy16(&mut self, words: u32, groups: u32, src: Bind<'_>, dst: Bind<'_>) -> Result<(), VkError> {
        if src.range < words as u64 * 16 || dst.range < words as u64 * 16 {
            return Err(VkError::OutOfRange(format!("copy buffers of {} and {} bytes for {words} words", src.range, dst.range)));
        }
        self.run("copy", &[], &[src, dst], &CountPush { count: words }.bytes(), [groups.max(1), 1, 1])
    }

    /// ids[2r] = argmax of logits row r (n values a row), ids[2r + 1] = the bits of its
    /// log-sum-exp (shaders/ops/argmax.comp), in one dispatch: `part` holds ARGMAX_PART_WORDS
    /// words a row of the workgroups' partials, `done` a word a row (zero, and left zero)
    /// counting them for the row's last workgroup, which merges them.
    pub fn argmax(&mut self, rows: u32, n: u32, logits: Bind<'_>, part: Bind<'_>, ids: Bind<'_>, done: Bind<'_>) -> Result<(), VkError> {
        if part.range < rows as u64 * ARGMAX_PART_WORDS * 4 || ids.range < rows as u64 * 8 || done.range < rows as u64 * 4 {
            return Err(VkError::OutOfRange(format!("argmax buffers of {}, {} and {} bytes for {rows} rows", part.range, ids.range, done.range)));
        }
        self.run("argmax", &[], &[logits, part, ids, done], &CountPush { count: n }.bytes(), [rows, ARGMAX_SLICES, 1])
    }
}

/// What a recorded command holds: its dispatches (copies counted with them), its pipeline
/// barriers, and its dependent stages: the runs of work between two barriers, each of which
/// waits for the one before (every barrier here is a full compute barrier, so the chain of
/// waits a row's data passes through is this count).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StepCounts {
    pub stages: u32,
    pub dispatches: u32,
    pub barriers: u32,
    /// Work recorded since the last barrier (a stage is open).
    open: bool,
}

/// Floats of attention partials for `rows` rows.
pub fn attn_part_len(rows: usize, n_head: usize, head_dim: usize, n_pieces: usize) -> usize {
    rows * n_head * n_pieces * (head_dim + 2)
}

/// The shader suffix of a K/V mirror codec for heads of `head_dim` values (the q8_0 mirror
/// stores whole 32-value blocks a head, so its head dim must be a multiple of 32, as the CPU
/// home's). Mirror element `e` of a q8_0 mirror is in block `e / 32` at byte `e / 32 * 34`.
pub(crate) fn codec_name(codec: KvCodec, head_dim: u32) -> Result<&'static str, VkError> {
    match codec {
        KvCodec::F16 => Ok("f16"),
        KvCodec::F32 => Ok("f32"),
        KvCodec::Q8_0 if head_dim.is_multiple_of(32) => Ok("q8"),
        KvCodec::Q8_0 => Err(VkError::Unsupported(format!("the q8_0 K/V mirror needs a head dimension that is a multiple of 32, not {head_dim}"))),
    }
}
