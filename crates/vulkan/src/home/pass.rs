//! One pass, the GPU twin of `resin_cpu`'s forward pass: embed (scaled, for gemma), every
//! layer (norm and Q/K/V, rope-and-store, attention over all keys or a sliding window,
//! attention output and its post-norm (gemma3), norm and gate/up, SwiGLU or GeGLU, down and
//! its post-norm), the final norm and classifier (soft-capped where the model says), the
//! argmax and what the step reads back; recorded into a command buffer, top to bottom.

use resin_core::{Counters, KvCodec, NROW_MAX};
use resin_model::{FfnAct, ModelConfig};

use crate::buffers::Buffer;
use crate::kernels::*;
use crate::mv::{mv_fits, mv_format, Combine, Experts, Mv, MvIn, MvOut, MvShape, NormAdd, PackNext, QPack};
use crate::pipelines::Bind;
use crate::VkError;

use super::*;

/// Timestamps between the stages of a profiled token command.
pub(super) struct StageClock<'a> {
    pub(super) ts: &'a crate::buffers::Timestamps,
    pub(super) labels: Vec<String>,
}

impl StageClock<'_> {
    pub(super) fn mark(&mut self, cmd: ash::vk::CommandBuffer, label: impl Into<String>) {
        if (self.labels.len() as u32) < self.ts.count {
            self.ts.write(cmd, self.labels.len() as u32);
            self.labels.push(label.into());
        }
    }
}

pub(super) fn mark(clock: &mut Option<&mut StageClock<'_>>, cmd: ash::vk::CommandBuffer, label: &str, l: usize) {
    if let Some(c) = clock {
        c.mark(cmd, format!("{label}.{l}"));
    }
}

/// Workgroups a row and head of the decode attention for a pass of `rows` rows: the split
/// follows the rows, so a step of few rows still spreads its keys over many workgroups
/// (rows x workgroups <= about the device's workgroup spread: on a GPU 8 rows take 32 each,
/// every piece of a 2048-key row its own workgroup). The pieces themselves follow each row's
/// key count alone, so a row's result is the same whatever this says.
pub(super) fn attn_pieces(rows: usize, info: &crate::device::DeviceInfo) -> u32 {
    (info.workgroup_spread as usize / rows.max(1)).clamp(1, ATTN_SLOTS as usize) as u32
}

/// Whether matrix `m` of an `n`-row pass takes the canonical product (mv.comp up to NROW_MAX
/// rows, the int8 tiles of mm.comp or mr.comp past it): the matrices of the formats it reads,
/// on a device that runs it, in passes of up to `PassScratch::canon_upto` rows (a token
/// command's; for a step, the widest step's where a step may be one canonical pass).
pub(super) fn canon(m: &Mat, n: usize, s: &PassScratch<'_>) -> bool {
    canon_reads(m, s) && n <= s.canon_upto
}

/// A lane's scratch as the pass being recorded sees it, with the rows up to which the pass's
/// products take the canonical order: the plan's `Scratch::canon_rows` for a step, NROW_MAX for
/// a window (whose rows take its GEMM past a token command's width, as in the prompt's own
/// window chain).
pub(super) struct PassScratch<'a> {
    scratch: &'a Scratch,
    canon_upto: usize,
}

impl std::ops::Deref for PassScratch<'_> {
    type Target = Scratch;
    fn deref(&self) -> &Scratch {
        self.scratch
    }
}

/// Whether the canonical product reads matrix `m` at all: its format, on a device that runs
/// it. A mixture-of-experts FFN takes it at any row count (windows too): its grouped form
/// reads each expert once for the slots that chose it, where the GEMV would read it a slot.
fn canon_reads(m: &Mat, s: &Scratch) -> bool {
    s.dot && mv_format(m.ty).is_some() && m.cols.is_multiple_of(32)
}

/// Whether `m`, outside the canonical product, reads its input rounded through 8-bit blocks
/// of `block` values (the CPU home's integer dot products see these same values).
fn rounds(m: &Mat, block: u32, s: &Scratch) -> bool {
    s.q8 && act_block(m.ty) == Some(block) && m.cols.is_multiple_of(block as usize)
}

/// The layout of `n` packed rows of `cols` values.
fn packed(n: usize, cols: usize) -> Result<QPack, VkError> {
    QPack::new((n * cols) as u32)
}

/// Put the input `x` of the matrices `ms` the way each reads it (packed for the canonical
/// product, rounded through its blocks for the others; once a kind), then a barrier.
pub(super) fn prep(rec: &mut Recorder<'_>, n: usize, x: &Buffer, ms: &[&Mat], s: &PassScratch<'_>) -> Result<(), VkError> {
    let cols = ms[0].cols;
    let mut any = false;
    if ms.iter().any(|m| canon(m, n, s)) {
        rec.qpack(packed(n, cols)?, x.into(), (&s.xp32).into())?;
        any = true;
    }
    for (block, y) in [(32u32, &s.xq32), (256, &s.xq256)] {
        if ms.iter().any(|m| !canon(m, n, s) && rounds(m, block, s)) {
            rec.qact(block, (n * cols) as u32, x.into(), y.into())?;
            any = true;
        }
    }
    if any {
        rec.barrier();
    }
    Ok(())
}

/// gate <- act(gate) * up as the input of `down`, then a barrier. Where `down` reads packed
/// or rounded activations, one dispatch writes them straight from gate and up (what swiglu
/// then `prep` would write; gate itself keeps the gate projection, which nothing reads after).
pub(super) fn swiglu_for(rec: &mut Recorder<'_>, act: FfnAct, n: usize, down: &Mat, s: &PassScratch<'_>) -> Result<(), VkError> {
    let count = (n * down.cols) as u32;
    let (g, u) = ((&s.gate).into(), (&s.up).into());
    if canon(down, n, s) {
        rec.swiglu_p(act, packed(n, down.cols)?, g, u, (&s.xp32).into())?;
    } else if let Some((block, y)) = [(32u32, &s.xq32), (256, &s.xq256)].into_iter().find(|&(b, _)| rounds(down, b, s)) {
        rec.swiglu_q(act, block, count, g, u, y.into())?;
    } else {
        rec.swiglu(act, count, g, u)?;
    }
    rec.barrier();
    Ok(())
}

/// What the decode attention's combine can write for `attn_out` (n rows) itself (what `prep`
/// would write after it), or None where `prep` must.
pub(super) fn attn_round<'a>(attn_out: &Mat, n: usize, cfg: &ModelConfig, s: &'a PassScratch<'a>) -> Result<Option<AttnRound<'a>>, VkError> {
    let heads_ok = |block| attn_round_heads(block, cfg.head_dim as u32, cfg.n_head as u32).is_some();
    if canon(attn_out, n, s) {
        return Ok(heads_ok(32).then_some(AttnRound::Packed { layout: packed(n, attn_out.cols)?, out: (&s.xp32).into() }));
    }
    Ok([(32u32, &s.xq32), (256, &s.xq256)].into_iter().find(|&(b, _)| rounds(attn_out, b, s) && heads_ok(b)).map(|(block, y)| AttnRound::Rounded { block, y: y.into() }))
}

/// s.xn = rmsnorm(r.x (+= r.add)) * w, and in the same dispatch what the matrices `ms` read
/// of it (what `prep` would write after it); then a barrier.
pub(super) fn norm_for(rec: &mut Recorder<'_>, rows: usize, r: &mut Resid<'_>, w: &Buffer, ms: &[&Mat], s: &PassScratch<'_>, p: NormPush) -> Result<(), VkError> {
    r.settle(rec, rows, p)?;
    let (x, add, out) = (r.x, r.add.map(Bind::from), &s.xn);
    if ms.iter().any(|m| canon(m, rows, s)) {
        // Mixed: norm, then pack and round what each matrix reads (prep).
        rec.rmsnorm(rows as u32, x.into(), add, w.into(), out.into(), p)?;
        rec.barrier();
        return prep(rec, rows, out, ms, s);
    }
    let (b32, b256) = (ms.iter().any(|m| rounds(m, 32, s)), ms.iter().any(|m| rounds(m, 256, s)));
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
/// attn_out or down outside the canonical product: the norm that reads the sum next adds it).
pub(super) struct Resid<'a> {
    pub(super) x: &'a Buffer,
    pub(super) add: Option<&'a Buffer>,
    /// gemma3's post-norm of `add` (its weights, and a buffer of the pass's rows that nothing
    /// reads until it is written again): what is added is rmsnorm(add) * w. `normpack` folds
    /// it in; the other norms take it first (`settle`).
    pub(super) post: Option<(&'a Buffer, &'a Buffer)>,
    /// The norm weights whose input of the sum the product that finished it packed beside it
    /// (`MvOut::AddPack`: `Scratch::xpn` and `Scratch::xss`), which `canon_input` then reads.
    pub(super) packed: Option<&'a Buffer>,
}

impl<'a> Resid<'a> {
    /// Apply a pending post-norm on its own (rmsnorm(add) * w into its spare buffer, then a
    /// barrier), for the norms that do not fold it in.
    fn settle(&mut self, rec: &mut Recorder<'_>, rows: usize, p: NormPush) -> Result<(), VkError> {
        if let (Some(y), Some((w, spare))) = (self.add, self.post.take()) {
            rec.rmsnorm(rows as u32, y.into(), None, w.into(), spare.into(), p)?;
            rec.barrier();
            self.add = Some(spare);
        }
        Ok(())
    }

    /// Whether the sum is whole and its input to the norm of weights `w` was packed beside it
    /// (`packed`, which this clears: the next product that ends a sub-block sets it again).
    fn take_packed(&mut self, w: &Buffer) -> bool {
        let packed = self.packed.take();
        self.add.is_none() && packed.is_some_and(|p| std::ptr::eq(p, w))
    }
}

/// A norm of a pass: its weights and push block, and the stage label it marks (`label.layer`).
pub(super) struct Norm<'a> {
    pub(super) w: &'a Buffer,
    pub(super) p: NormPush,
    pub(super) label: &'a str,
    pub(super) layer: usize,
}

/// How the canonical products `ms` (n rows) read their normed input, where every one takes
/// the canonical product (else None: `norm_for`'s rounding).
#[derive(Clone, Copy, PartialEq, Eq)]
enum CanonNorm {
    /// Folded into each product's prologue: one row, the sum whole (nothing left to add), the
    /// row in the product's shared memory.
    Fold,
    /// `normpack` ahead of the products (the same bits).
    Pack,
}

fn canon_norm(rec: &Recorder<'_>, n: usize, r: &Resid<'_>, ms: &[&Mat], s: &PassScratch<'_>, swiglu: bool) -> Option<CanonNorm> {
    if !ms.iter().all(|m| canon(m, n, s)) {
        return None;
    }
    Some(if n == 1 && r.add.is_none() && r.post.is_none() && mv_fits(&rec.gpu.info, 1, ms[0].cols as u32, true, swiglu) { CanonNorm::Fold } else { CanonNorm::Pack })
}

/// The canonical products' input of n rows of `r`: `Normed` to fold, or `normpack` now (then
/// a barrier, the norm's label marked) and `NormPacked`. The sum is then all of `r.x`.
#[allow(clippy::too_many_arguments)]
fn canon_input<'a>(
    rec: &mut Recorder<'_>,
    how: CanonNorm,
    n: usize,
    r: &mut Resid<'a>,
    norm: &Norm<'a>,
    cols: usize,
    s: &'a PassScratch<'a>,
    clock: &mut Option<&mut StageClock<'_>>,
) -> Result<MvIn<'a>, VkError> {
    if how == CanonNorm::Fold {
        return Ok(MvIn::Normed { x: r.x.into(), w: norm.w.into(), eps: norm.p.eps });
    }
    let layout = packed(n, cols)?;
    if r.take_packed(norm.w) {
        return Ok(MvIn::PackedSs { x: (&s.xpn).into(), layout, ss: (&s.xss).into(), eps: norm.p.eps });
    }
    let add = r.add.map(|y| NormAdd { y: y.into(), post: r.post.take().map(|(w, _)| w.into()) });
    rec.normpack(n as u32, cols as u32, norm.p.eps, r.x.into(), add, norm.w.into(), layout, (&s.xpn).into(), (&s.rs).into())?;
    rec.barrier();
    r.add = None;
    mark(clock, rec.cmd, norm.label, norm.layer);
    Ok(MvIn::NormPacked { x: (&s.xpn).into(), layout, r: (&s.rs).into() })
}

/// y = M (rmsnorm(x + add) * w) for each (M, y, y's row stride) of `ms`, n rows: canonical
/// products read the norm as `canon_input` gives it; else the norm dispatch (the add in
/// place, packed or rounded for the matrices: `norm_for`, which marks the norm's label after
/// its barrier), then the products; the caller puts the barrier after them. The sum is then
/// all of `r.x`.
pub(super) fn norm_mm<'a>(
    rec: &mut Recorder<'_>,
    n: usize,
    r: &mut Resid<'a>,
    norm: Norm<'a>,
    ms: &[(&Mat, &Buffer, usize)],
    s: &'a PassScratch<'a>,
    clock: &mut Option<&mut StageClock<'_>>,
) -> Result<(), VkError> {
    let mats: Vec<&Mat> = ms.iter().map(|(m, _, _)| *m).collect();
    if let Some(how) = canon_norm(rec, n, r, &mats, s, false) {
        let input = canon_input(rec, how, n, r, &norm, mats[0].cols, s, clock)?;
        for &(m, y, stride) in ms {
            for part in &m.parts {
                rec.mv(Mv { ty: m.ty, n: n as u32, w: part.bind(), input, out: MvOut::Store(y.into()), shape: shape(m, part, stride) })?;
            }
        }
        return Ok(());
    }
    norm_for(rec, n, r, norm.w, &mats, s, norm.p)?;
    r.add = None;
    mark(clock, rec.cmd, norm.label, norm.layer);
    for (slot, &(m, y, stride)) in ms.iter().enumerate() {
        mm(rec, n, m, &s.xn, (y, stride), s, slot)?;
    }
    Ok(())
}

/// The product's rows of part `part` of `m`, its output rows `y_stride` apart.
fn shape(m: &Mat, part: &Part, y_stride: usize) -> MvShape {
    MvShape { rows: part.rows as u32, cols: m.cols as u32, row_bytes: m.row_bytes as u32, x_stride: m.cols as u32, y_stride: y_stride as u32, y_off: part.r0 as u32 }
}

/// The FFN input of n rows: gate and up of norm(x) * ffn_norm, SwiGLU or GeGLU, packed or
/// rounded for `down`; then a barrier. Where gate and up share a buffer and every matrix takes
/// the canonical product, one product with the activation in its epilogue (its norm folded at
/// one row, `normpack` ahead of it for more), else `norm_mm` (marking `gate_up`) and
/// `swiglu_for`.
#[allow(clippy::too_many_arguments)]
pub(super) fn ffn_in<'a>(
    rec: &mut Recorder<'_>,
    n: usize,
    r: &mut Resid<'a>,
    norm: Norm<'a>,
    ly: &Layer,
    cfg: &ModelConfig,
    s: &'a PassScratch<'a>,
    clock: &mut Option<&mut StageClock<'_>>,
) -> Result<(), VkError> {
    let pair = ly.gate.pair_with(&ly.up);
    let how = canon_norm(rec, n, r, &[&ly.gate, &ly.up], s, true);
    if let (Some((w, up_off)), true, Some(how), true) =
        (pair, canon(&ly.down, n, s), how, mv_fits(&rec.gpu.info, n as u32, ly.gate.cols as u32, how == Some(CanonNorm::Fold), true))
    {
        let input = canon_input(rec, how, n, r, &norm, ly.gate.cols, s, clock)?;
        let out = MvOut::SwiGlu { act: cfg.ffn_act, up_off, out: (&s.xp32).into(), layout: packed(n, ly.down.cols)? };
        rec.mv(Mv { ty: ly.gate.ty, n: n as u32, w, input, out, shape: shape(&ly.gate, &ly.gate.parts[0], cfg.n_ff) })?;
        rec.barrier();
        mark(clock, rec.cmd, "gate_up", norm.layer);
        return Ok(());
    }
    let layer = norm.layer;
    let gate_up = [(&ly.gate, &s.gate, cfg.n_ff), (&ly.up, &s.up, cfg.n_ff)];
    norm_mm(rec, n, r, norm, &gate_up, s, clock)?;
    rec.barrier();
    mark(clock, rec.cmd, "gate_up", layer);
    swiglu_for(rec, cfg.ffn_act, n, &ly.down, s)?;
    mark(clock, rec.cmd, "swiglu", layer);
    Ok(())
}

/// r.x += M x for a matrix that ends a sub-block (attention output, down), x as `prep` (or a
/// fused stage) left it: the canonical product adds in its epilogue, and with `next` also packs
/// the input of the norm `next` reads the sum with (r.packed; whole 32-row blocks a part);
/// else (or with gemma3's post-norm `post`) the product goes to `y` and the next norm adds it
/// (r.add), with the post-norm pending (r.post: `normpack` folds it in, other norms write it
/// to `spare` first). The caller puts the barrier after it.
#[allow(clippy::too_many_arguments)]
pub(super) fn resid_mm<'a>(
    rec: &mut Recorder<'_>,
    n: usize,
    m: &Mat,
    x: &Buffer,
    r: &mut Resid<'a>,
    (y, post, spare): (&'a Buffer, Option<&'a Buffer>, &'a Buffer),
    next: Option<&'a Buffer>,
    s: &'a PassScratch<'a>,
) -> Result<(), VkError> {
    r.packed = None;
    if canon(m, n, s) && post.is_none() {
        let blocks = m.rows.is_multiple_of(32) && m.parts.iter().all(|p| p.r0 % 32 == 0 && p.rows % 32 == 0);
        // The next norm's packs come from the N-row form only (mv.comp).
        let next = next.filter(|_| blocks && n <= NROW_MAX);
        let input = MvIn::Packed { x: (&s.xp32).into(), layout: packed(n, m.cols)? };
        for part in &m.parts {
            let out = match next {
                Some(w) => MvOut::AddPack { y: r.x.into(), norm: w.into(), layout: packed(n, m.rows)?, out: (&s.xpn).into(), ss: (&s.xss).into(), done: (&s.xss_done).into() },
                None => MvOut::Add(r.x.into()),
            };
            rec.mv(Mv { ty: m.ty, n: n as u32, w: part.bind(), input, out, shape: shape(m, part, m.rows) })?;
        }
        r.packed = next;
        return Ok(());
    }
    mm(rec, n, m, x, (y, m.rows), s, 0)?;
    r.add = Some(y);
    r.post = post.map(|w| (w, spare));
    Ok(())
}

/// y[c][..] = M x[c] for the n rows, one dispatch per part; the canonical product reads the
/// packed activations `prep` (or a norm or swiglu fused with it) wrote, the other quantized
/// formats the rounded ones. Up to NROW_MAX rows take the canonical product or the GEMV
/// (one-row or N-row form); more (a prefill window) the GEMM.
/// `slot`: which of the split-K scratch slots a GEMM takes (matrices recorded with no barrier
/// between them, as q, k and v, take different ones).
pub(super) fn mm(rec: &mut Recorder<'_>, n: usize, m: &Mat, x: &Buffer, (y, y_stride): (&Buffer, usize), s: &PassScratch<'_>, slot: usize) -> Result<(), VkError> {
    let xin = if rounds(m, 32, s) {
        &s.xq32
    } else if rounds(m, 256, s) {
        &s.xq256
    } else {
        x
    };
    for (i, part) in m.parts.iter().enumerate() {
        let p = shape(m, part, y_stride);
        if canon(m, n, s) {
            let input = MvIn::Packed { x: (&s.xp32).into(), layout: packed(n, m.cols)? };
            rec.mv(Mv { ty: m.ty, n: n as u32, w: part.bind(), input, out: MvOut::Store(y.into()), shape: p })?;
        } else if n <= NROW_MAX {
            rec.gemv(m.ty, n as u32, part.bind(), xin.into(), y.into(), p)?;
        } else {
            let split = s.split_part > 0 && crate::gemm::gemm_split(p.rows, p.cols).1 > 1;
            if split && i > 0 {
                rec.barrier(); // the parts of one matrix share its split-K slot
            }
            rec.gemm(m.ty, n as u32, part.bind(), xin.into(), y.into(), p, split.then(|| s.split_slot(slot)).transpose()?)?;
        }
    }
    Ok(())
}

/// Copy rows `idx[i]` of `src` to rows i of `dst` (`width` f32 a row), then a barrier.
pub(super) fn gather(rec: &Recorder<'_>, src: &Buffer, dst: &Buffer, width: usize, idx: &[u32]) {
    let w = (width * 4) as u64;
    let regions: Vec<ash::vk::BufferCopy> = idx.iter().enumerate().map(|(i, &r)| ash::vk::BufferCopy { src_offset: r as u64 * w, dst_offset: i as u64 * w, size: w }).collect();
    // SAFETY: the command buffer is recording; both buffers hold the rows (sized for a window
    // and for out_rows rows) and are distinct.
    unsafe { rec.gpu.device.cmd_copy_buffer(rec.cmd, src.buffer, dst.buffer, &regions) };
    rec.tally_work();
}

/// What one pass computes: `n` rows (metadata rows 0..n) through every layer; `narrow` None
/// for a token command (every row lands logits), Some(rows) for a prefill window: the last
/// layer's attention output, FFN and the classifier run only for those rows (ascending; none:
/// the pass ends once the last layer's K/V are stored).
pub(super) struct PassShape<'a> {
    pub(super) n: usize,
    pub(super) narrow: Option<&'a [u32]>,
    /// Copy the logits rows to the host (false: a greedy step reads only the argmax ids).
    pub(super) to_host: bool,
    /// Select each row's TOP_CANDIDATES largest logits into `Scratch::top_host`.
    pub(super) top: bool,
    /// Copy the logits rows `Scratch::rows_list` names to the first rows of `logits_host`.
    pub(super) listed: bool,
    /// How the rows share regions: whether a token command's attention may rope and store
    /// its rows itself.
    pub(super) regions: Regions,
}

/// How a pass's rows share the regions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Regions {
    /// Every row has a region of its own (streams decoding).
    Own,
    /// Each region's rows are one run of consecutive positions in pass order, of at most
    /// NROW_MAX rows (a peel): a row reads the keys its run's earlier rows store.
    Runs,
    /// Otherwise: the rope dispatch stores every row's key before any attention reads.
    Mixed,
}

impl Regions {
    pub(super) fn of(rows: &[(u32, u32, u32)]) -> Regions {
        let mut seen = std::collections::HashSet::new();
        let (mut own, mut run) = (true, 0usize);
        for (i, r) in rows.iter().enumerate() {
            let continues = i > 0 && rows[i - 1].0 == r.0 && rows[i - 1].1.checked_add(1) == Some(r.1);
            if continues {
                own = false;
                run += 1;
            } else if seen.insert(r.0) {
                run = 1;
            } else {
                return Regions::Mixed;
            }
            if run > NROW_MAX {
                return Regions::Mixed;
            }
        }
        if own {
            Regions::Own
        } else {
            Regions::Runs
        }
    }

    /// The keys of the pass a row reads at most, its own included (`AttnRope::reads`); None:
    /// the rope dispatch. Runs take NROW_MAX whatever their length: one pipeline for every
    /// peel.
    fn reads(self) -> Option<u32> {
        match self {
            Regions::Own => Some(1),
            Regions::Runs => Some(NROW_MAX as u32),
            Regions::Mixed => None,
        }
    }
}

/// What a pass reads: the model, its weights, the mirror's codec, the lane's scratch, and the
/// counters it adds to.
pub(super) struct PassCtx<'a> {
    pub(super) cfg: &'a ModelConfig,
    pub(super) codec: KvCodec,
    pub(super) w: &'a Weights,
    pub(super) s: &'a Scratch,
    pub(super) counters: &'a Counters,
}

/// One pass: embed, every layer, final norm, classifier, argmax. Returns the key pieces a row
/// and head of its decode attention takes (what a token command adds to
/// `decode_attention_pieces` each time it runs).
pub(super) fn record_pass(rec: &mut Recorder<'_>, shape: PassShape<'_>, ctx: &PassCtx<'_>, mut clock: Option<&mut StageClock<'_>>) -> Result<u32, VkError> {
    let PassCtx { cfg, codec, w, s, counters } = *ctx;
    let s = &PassScratch { scratch: s, canon_upto: if shape.narrow.is_some() { NROW_MAX } else { s.canon_rows } };
    let Weights { layers, embd, output, output_norm, .. } = w;
    let output = output.as_ref();
    let cmd = rec.cmd;
    let n = shape.n;
    let (d, nr) = (cfg.n_embd, n as u32);
    let norm = NormPush { n: d as u32, eps: cfg.rms_eps };
    for part in &embd.parts {
        let p = EmbedPush { cols: d as u32, row_bytes: embd.row_bytes as u32, row_start: part.r0 as u32, part_rows: part.rows as u32, scale: cfg.embd_scale };
        rec.embed(embd.ty, nr, part.bind(), (&s.meta).into(), (&s.x).into(), p)?;
    }
    rec.barrier();
    mark(&mut clock, cmd, "embed", 0);
    let style = cfg.arch.rope_style();
    let flags = if cfg.qkv_bias { ROPE_BIAS } else { 0 } | if cfg.qk_norm { ROPE_QK_NORM } else { 0 };
    let rp = RopePush { n_head: cfg.n_head as u32, n_head_kv: cfg.n_head_kv as u32, head_dim: cfg.head_dim as u32, rope_dims: cfg.rope_dims as u32, flags, eps: cfg.rms_eps };
    let n_pieces = attn_pieces(n, &rec.gpu.info);
    let attn_push = |l: usize| AttnPush {
        n_head: cfg.n_head as u32,
        n_head_kv: cfg.n_head_kv as u32,
        head_dim: cfg.head_dim as u32,
        n_pieces,
        scale: cfg.attn_scale,
        key_window: cfg.layer_window(l).map_or(0, |w| w.min(u32::MAX as usize) as u32),
    };
    // A token command's attention ropes and stores its rows (the same bits as the rope_store
    // dispatch), also where a region's rows are a run (a peel: a row reads the keys of the
    // run's earlier rows from k and v, as they will be stored).
    let reads = shape.regions.reads().filter(|_| shape.narrow.is_none() && attn_rope_ok(codec, cfg.head_dim as u32));
    let rope_in = reads.is_some();
    // After the last layer's attention a window keeps only the rows that need logits.
    let (mut r, mut att, mut m) = (Resid { x: &s.x, add: None, post: None, packed: None }, &s.att, n);
    let out = output.unwrap_or(embd);
    for (l, ly) in layers.iter().enumerate() {
        let last = l + 1 == layers.len();
        let (ap, rope) = (attn_push(l), w.rope_for(cfg, l)?);
        // q, k, v of norm(x) * attn_norm (x += down of the previous layer first, where its
        // product did not add it)
        let qkv = [(&ly.q, &s.q, cfg.q_dim()), (&ly.k, &s.k, cfg.kv_dim()), (&ly.v, &s.v, cfg.kv_dim())];
        norm_mm(rec, n, &mut r, Norm { w: &ly.attn_norm, p: norm, label: "attn_norm", layer: l }, &qkv, s, &mut clock)?;
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
            Counters::add(&counters.prefill_rows_narrowed, n as u64);
            return Ok(n_pieces);
        }
        let mut rounded = false;
        if shape.narrow.is_some() && n >= WINDOW_ATTN_MIN_ROWS {
            // Flash-attention tiles: each K/V tile read once for a tile of query rows.
            let b = AttnBinds { q: (&s.q).into(), mk: (&ly.mk).into(), mv: (&ly.mv).into(), meta: (&s.meta).into(), part: (&s.part).into(), out: (&s.att).into() };
            rec.attention_window(codec, nr, b, (&s.done).into(), ap)?;
        } else {
            // The combine rounds its output for attn_out itself, unless rows are gathered after.
            let round = if last && shape.narrow.is_some() { None } else { attn_round(&ly.attn_out, n, cfg, s)? };
            rounded = round.is_some();
            let own_rope = rope_in.then(|| AttnRope {
                k: (&s.k).into(),
                v: (&s.v).into(),
                bias: (&ly.bias).into(),
                table: rope.into(),
                rope_dims: cfg.rope_dims as u32,
                style,
                bias_on: cfg.qkv_bias,
                qk_norm: cfg.qk_norm.then(|| ((&ly.qk_norm).into(), cfg.rms_eps)),
                reads: reads.unwrap_or(1),
            });
            rec.attention_round(
                codec,
                nr,
                AttnBinds { q: (&s.q).into(), mk: (&ly.mk).into(), mv: (&ly.mv).into(), meta: (&s.meta).into(), part: (&s.part).into(), out: (&s.att).into() },
                round,
                Some((&s.done).into()),
                own_rope,
                ap,
            )?;
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
            Counters::add(&counters.prefill_rows_narrowed, (n - keep.len()) as u64);
            gather(rec, r.x, &s.xg, d, keep);
            gather(rec, &s.att, &s.ag, cfg.q_dim(), keep);
            rec.transfer_barrier();
            (r.x, att, m) = (&s.xg, &s.ag, keep.len());
        }
        if !rounded {
            prep(rec, m, att, &[&ly.attn_out], s)?;
        }
        // x += o (gemma3: its norm, into `down`, which holds nothing until this layer's FFN)
        // (and, for N rows or a token command's experts, the FFN norm's input packed by the
        // product: the one-row dense FFN folds its norm)
        let moe_packs = ly.router.is_some() && m <= NROW_MAX && moe_canonical(rec, m, ly, cfg, s);
        let next = (m > 1 || moe_packs).then_some(&ly.ffn_norm);
        resid_mm(rec, m, &ly.attn_out, att, &mut r, (&s.o, ly.attn_post_norm.as_ref(), &s.down), next, s)?;
        rec.barrier();
        mark(&mut clock, cmd, "attn_out", l);
        let fnorm = Norm { w: &ly.ffn_norm, p: norm, label: "ffn_norm", layer: l };
        if let Some(router) = &ly.router {
            // x += the experts' sum (a token command's down adds it; else it is in `down`,
            // and with a post-norm its norm goes into `o` where not folded)
            // (and at N rows the next norm's input packed beside the sum, as the dense down's)
            let next = layers.get(l + 1).map_or(output_norm, |n| &n.attn_norm);
            if !moe_ffn(rec, m, &mut r, ly, router, cfg, s, fnorm, (m > 1).then_some(next), &mut clock)? {
                r.add = Some(&s.down);
                r.post = ly.ffn_post_norm.as_ref().map(|w| (w, &s.o));
            }
        } else {
            // then the FFN's input: gate and up of norm(x) * ffn_norm, its activation
            ffn_in(rec, m, &mut r, fnorm, ly, cfg, s, &mut clock)?;
            // x += down (gemma3: its norm, into `o`, which the FFN's norm has added already)
            // (and the next norm's input: the next layer's attention norm, or the output norm)
            let next = layers.get(l + 1).map_or(output_norm, |n| &n.attn_norm);
            resid_mm(rec, m, &ly.down, &s.gate, &mut r, (&s.down, ly.ffn_post_norm.as_ref(), &s.o), (m > 1).then_some(next), s)?;
            rec.barrier();
            mark(&mut clock, cmd, "down", l);
        }
    }
    let mr = m as u32;
    // the classifier of norm(x (+= down)) * output_norm (the sum is not read after)
    norm_mm(rec, m, &mut r, Norm { w: output_norm, p: norm, label: "output_norm", layer: 0 }, &[(out, &s.logits, cfg.vocab)], s, &mut clock)?;
    if let Some(cap) = cfg.logit_softcap {
        rec.barrier();
        rec.softcap((m * cfg.vocab) as u32, cap, (&s.logits).into())?;
    }
    rec.transfer_barrier(); // the logits are copied to the host below
    mark(&mut clock, cmd, "classifier", 0);
    // (the attention's counters, zero between its dispatches, count the argmax's workgroups)
    rec.argmax(mr, cfg.vocab as u32, (&s.logits).into(), (&s.part).into(), (&s.ids).into(), (&s.done).into())?;
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
        rec.tally_work();
    }
    mark(&mut clock, cmd, "argmax", 0);
    // Make the host-visible results available to the host.
    let mb = [ash::vk::MemoryBarrier::default()
        .src_access_mask(ash::vk::AccessFlags::SHADER_WRITE | ash::vk::AccessFlags::TRANSFER_WRITE)
        .dst_access_mask(ash::vk::AccessFlags::HOST_READ)];
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
    Ok(n_pieces)
}

/// The 8-bit activation rounding the GEMV of `m` reads (as `mm` picks it), or None for f32.
fn rounding(m: &Mat, s: &Scratch) -> Option<u32> {
    act_block(m.ty).filter(|&b| s.q8 && m.cols.is_multiple_of(b as usize))
}

/// A mixture-of-experts FFN of `n` rows, its output into `s.down` (what the next norm adds):
/// norm(x) * ffn_norm, each row's experts and weights from the router (`moe_route`, reading
/// the f32 normed rows), each slot's gate and up from its own expert's rows only, SwiGLU,
/// each slot's down, and the weighted sum of a row's slots in rank order. Where the experts'
/// formats take the canonical product (`moe_experts`), the norm is also `normpack`ed for it;
/// else the norm is rounded for the expert GEMV (`gemv_expert`, a slot at a time). Every
/// step computes a row (a slot) from that row alone, so rows stepped together equal each
/// alone. Then a barrier. Returns true where the sum was added to the residual itself
/// (`moe_experts`) instead.
#[allow(clippy::too_many_arguments)]
fn moe_ffn<'a>(
    rec: &mut Recorder<'_>,
    n: usize,
    r: &mut Resid<'a>,
    ly: &Layer,
    router: &Buffer,
    cfg: &ModelConfig,
    s: &'a PassScratch<'a>,
    norm: Norm<'_>,
    next: Option<&'a Buffer>,
    clock: &mut Option<&mut StageClock<'_>>,
) -> Result<bool, VkError> {
    let moe = cfg.moe.ok_or_else(|| VkError::Model("a router on a model without experts".into()))?;
    let (d, ff, k) = (cfg.n_embd, cfg.n_ff, moe.n_expert_used);
    let slots = n * k;
    let (gate, up, down) = (&ly.gate, &ly.up, &ly.down);
    let canonical = moe_canonical(rec, n, ly, cfg, s);
    let blocks = [gate, up].map(|m| rounding(m, s).filter(|_| !canonical));
    let q32 = blocks.contains(&Some(32)).then(|| Bind::from(&s.xq32));
    let q256 = blocks.contains(&Some(256)).then(|| Bind::from(&s.xq256));
    r.settle(rec, n, norm.p)?;
    let add = r.add.map(Bind::from);
    let ne = moe.n_expert;
    let grouped = n <= NROW_MAX;
    // A token command whose attention-out packed the norm's input (`resid_mm`): the products
    // read those packs, and the router makes its normed rows from the blocks' sums of squares.
    if r.take_packed(norm.w) && canonical && grouped {
        let ss = Bind::from(&s.xss);
        let input = MvIn::PackedSs { x: (&s.xpn).into(), layout: packed(n, d)?, ss, eps: norm.p.eps };
        let rin = RouterIn::Sums { x: r.x.into(), ss, w: norm.w.into(), eps: norm.p.eps };
        rec.moe_router(n as u32, ne as u32, k as u32, d as u32, router_binds(s, router, rin))?;
        rec.barrier();
        mark(clock, rec.cmd, "route", norm.layer);
        return moe_experts(rec, n, ly, moe, cfg.ffn_act, input, s, (norm.layer, r, next), clock);
    }
    // The canonical products' input: u = x * w packed and each row's r, with the router's f32
    // normed rows from the same dispatch; else the norm, rounded where the experts' GEMV reads it so.
    let packed_in = if canonical {
        let layout = packed(n, d)?;
        let add = add.map(|y| NormAdd { y, post: None });
        rec.normpack_xn(n as u32, d as u32, norm.p.eps, r.x.into(), add, norm.w.into(), layout, ((&s.xpn).into(), (&s.rs).into()), Some((&s.xn).into()))?;
        Some(MvIn::NormPacked { x: (&s.xpn).into(), layout, r: (&s.rs).into() })
    } else {
        if q32.is_some() || q256.is_some() {
            rec.rmsnorm_q(n as u32, r.x.into(), add, norm.w.into(), (&s.xn).into(), q32, q256, norm.p)?;
        } else {
            rec.rmsnorm(n as u32, r.x.into(), add, norm.w.into(), (&s.xn).into(), norm.p)?;
        }
        None
    };
    r.add = None;
    rec.barrier();
    mark(clock, rec.cmd, norm.label, norm.layer);
    // The router's logits, each row's top k and (for the grouped products) the slots' lists:
    // a token command's in one dispatch (per-row code, so a row's choice does not depend on
    // its step's other rows); a window's as a matrix product spread over the device, then
    // the route (and the group in `moe_experts`).
    if grouped {
        rec.moe_router(n as u32, ne as u32, k as u32, d as u32, router_binds(s, router, RouterIn::Normed((&s.xn).into())))?;
    } else {
        let lp = GemvPush { rows: ne as u32, cols: d as u32, row_bytes: (d * 4) as u32, x_stride: d as u32, y_stride: ne as u32, y_off: 0 };
        // K split as every window's matrix (a router's few row tiles would leave the device idle).
        let split = s.split_part > 0 && crate::gemm::gemm_split(lp.rows, lp.cols).1 > 1;
        rec.gemm(resin_gguf::GgmlType::F32, n as u32, router.into(), (&s.xn).into(), (&s.moe_logits).into(), lp, split.then(|| s.split_slot(0)).transpose()?)?;
        rec.barrier();
        mark(clock, rec.cmd, "router", norm.layer);
        rec.moe_route(n as u32, ne as u32, k as u32, (&s.moe_logits).into(), (&s.moe_sel).into(), (&s.moe_wt).into())?;
    }
    rec.barrier();
    mark(clock, rec.cmd, "route", norm.layer);
    if let Some(input) = packed_in {
        return moe_experts(rec, n, ly, moe, cfg.ffn_act, input, s, (norm.layer, r, next), clock);
    }
    let input = |m: &Mat| match rounding(m, s) {
        Some(32) => &s.xq32,
        Some(256) => &s.xq256,
        _ => &s.xn,
    };
    let expert_mm = |rec: &mut Recorder<'_>, m: &Mat, x: &Buffer, x_stride: usize, x_div: usize, y: &Buffer, y_stride: usize| -> Result<(), VkError> {
        let [part] = m.parts.as_slice() else {
            return Err(VkError::Model("a stack of experts in more than one part".into()));
        };
        let per = part.rows / moe.n_expert;
        let p = GemvPush { rows: per as u32, cols: m.cols as u32, row_bytes: m.row_bytes as u32, x_stride: x_stride as u32, y_stride: y_stride as u32, y_off: 0 };
        rec.gemv_expert(m.ty, slots as u32, part.bind(), x.into(), y.into(), (&s.moe_sel).into(), p, x_div as u32)
    };
    expert_mm(rec, gate, input(gate), d, k, &s.moe_gate, ff)?;
    expert_mm(rec, up, input(up), d, k, &s.moe_up, ff)?;
    rec.barrier();
    mark(clock, rec.cmd, "gate_up", norm.layer);
    let count = (slots * ff) as u32;
    let act_in = match rounding(down, s) {
        Some(block) => {
            rec.swiglu_q(cfg.ffn_act, block, count, (&s.moe_gate).into(), (&s.moe_up).into(), (&s.moe_act).into())?;
            &s.moe_act
        }
        None => {
            rec.swiglu(cfg.ffn_act, count, (&s.moe_gate).into(), (&s.moe_up).into())?;
            &s.moe_gate
        }
    };
    rec.barrier();
    mark(clock, rec.cmd, "swiglu", norm.layer);
    expert_mm(rec, down, act_in, ff, 1, &s.moe_down, d)?;
    rec.barrier();
    mark(clock, rec.cmd, "down", norm.layer);
    rec.moe_combine(n as u32, d as u32, k as u32, (&s.moe_wt).into(), (&s.moe_down).into(), (&s.down).into())?;
    rec.barrier();
    Ok(false)
}

/// The token command's router's buffers in the scratch, reading `input` (its counter the first
/// word of `moe_done`).
fn router_binds<'a>(s: &'a Scratch, router: &'a Buffer, input: RouterIn<'a>) -> RouterBinds<'a> {
    RouterBinds {
        router: router.into(),
        input,
        logits: (&s.moe_logits).into(),
        sel: (&s.moe_sel).into(),
        wt: (&s.moe_wt).into(),
        grp: (&s.moe_grp).into(),
        done: Bind { buf: &s.moe_done, offset: 0, range: 4 },
    }
}

/// Whether an MoE FFN of `n` rows takes the grouped canonical product: it reads the experts'
/// formats and its forms (gate and up with the SwiGLU epilogue, down) fit the device, whatever
/// the row count.
fn moe_canonical(rec: &Recorder<'_>, n: usize, ly: &Layer, cfg: &ModelConfig, s: &PassScratch<'_>) -> bool {
    let info = &rec.gpu.info;
    [&ly.gate, &ly.up, &ly.down].into_iter().all(|m| canon_reads(m, s))
        && mv_fits(info, n as u32, cfg.n_embd as u32, false, true)
        && mv_fits(info, n as u32, cfg.n_ff as u32, false, false)
}

/// The experts of `moe_ffn` in the canonical order, after the route: the slots grouped by
/// expert (`moe_group`; a token command's router wrote the lists), then gate and up (SwiGLU
/// in the product's epilogue where gate and up share a buffer and the activation is silu,
/// else stored and `swiglu_p` after), down and the weighted sum, each expert's rows read once
/// for the slots that chose it (mm.comp EXPERT). A slot's products are the bits its row's
/// product through its expert would be alone, so a row's result does not depend on which rows
/// share the step or chose its experts. A token command's down adds the sum to the residual
/// `r.x` itself (none with a post-norm between), and then this returns true; with `next` (the
/// next norm's weights) it also packs that norm's input of the sum (`r.packed`), as the dense
/// down does, where the residual's rows are whole 32-value blocks.
#[allow(clippy::too_many_arguments)]
fn moe_experts<'a>(
    rec: &mut Recorder<'_>,
    n: usize,
    ly: &Layer,
    moe: resin_model::Moe,
    act: FfnAct,
    input: MvIn<'_>,
    s: &'a PassScratch<'a>,
    (layer, r, next): (usize, &mut Resid<'a>, Option<&'a Buffer>),
    clock: &mut Option<&mut StageClock<'_>>,
) -> Result<bool, VkError> {
    let x = r.x;
    let (d, ne, k) = (ly.down.rows / moe.n_expert, moe.n_expert as u32, moe.n_expert_used as u32);
    let ff = ly.down.cols;
    let slots = n as u32 * k;
    let token_command = n <= NROW_MAX;
    if !token_command {
        rec.moe_group(slots, ne, (&s.moe_sel).into(), (&s.moe_grp).into())?;
        rec.barrier();
        mark(clock, rec.cmd, "group", layer);
    }
    let experts = |x_div| Experts { n_expert: ne, used: k, x_div, groups: (&s.moe_grp).into(), combine: None };
    let expert = |m, y_stride| expert_mat(m, moe.n_expert, y_stride);
    let act_layout = QPack::new(slots * ff as u32)?;
    let act_out = Bind::from(&s.moe_act);
    match ly.gate.pair_with(&ly.up) {
        Some((w, up_off)) => {
            let (_, shape) = expert(&ly.gate, ff)?;
            let out = MvOut::SwiGlu { act, up_off, out: act_out, layout: act_layout };
            rec.mv_experts(Mv { ty: ly.gate.ty, n: n as u32, w, input, out, shape }, experts(k))?;
            rec.barrier();
            mark(clock, rec.cmd, "gate_up", layer);
        }
        None => {
            for (m, y) in [(&ly.gate, &s.moe_gate), (&ly.up, &s.moe_up)] {
                let (w, shape) = expert(m, ff)?;
                rec.mv_experts(Mv { ty: m.ty, n: n as u32, w, input, out: MvOut::Store(y.into()), shape }, experts(k))?;
            }
            rec.barrier();
            mark(clock, rec.cmd, "gate_up", layer);
            rec.swiglu_p(act, act_layout, (&s.moe_gate).into(), (&s.moe_up).into(), act_out)?;
            rec.barrier();
            mark(clock, rec.cmd, "swiglu", layer);
        }
    }
    let (w, shape) = expert(&ly.down, d)?;
    let input = MvIn::Packed { x: act_out, layout: act_layout };
    // A token command's down also adds each row's sum of its slots to the residual (its last
    // workgroup a tile of rows); a window's sum is a dispatch of its own.
    let done = Bind { buf: &s.moe_done, offset: 4, range: s.moe_done.size - 4 };
    let resid = token_command && ly.ffn_post_norm.is_none();
    let next = next.filter(|_| resid && d.is_multiple_of(32));
    let pack = match next {
        Some(w) => Some(PackNext { norm: w.into(), layout: packed(n, d)?, out: (&s.xpn).into(), ss: (&s.xss).into() }),
        None => None,
    };
    let combine = resid.then(|| Combine { wt: (&s.moe_wt).into(), out: x.into(), done, add: true, pack });
    rec.mv_experts(Mv { ty: ly.down.ty, n: n as u32, w, input, out: MvOut::Store((&s.moe_down).into()), shape }, Experts { combine, ..experts(1) })?;
    rec.barrier();
    mark(clock, rec.cmd, "down", layer);
    if combine.is_none() {
        rec.moe_combine(n as u32, d as u32, k, (&s.moe_wt).into(), (&s.moe_down).into(), (&s.down).into())?;
        rec.barrier();
    }
    r.packed = next;
    Ok(combine.is_some())
}

/// The stack `m` of `n_expert` experts bound whole, and one expert's matrix as the product's
/// shape, its outputs `y_stride` apart a slot.
fn expert_mat(m: &Mat, n_expert: usize, y_stride: usize) -> Result<(Bind<'_>, MvShape), VkError> {
    let [part] = m.parts.as_slice() else {
        return Err(VkError::Model("a stack of experts in more than one part".into()));
    };
    let rows = part.rows / n_expert;
    Ok((part.bind(), MvShape { rows: rows as u32, cols: m.cols as u32, row_bytes: m.row_bytes as u32, x_stride: m.cols as u32, y_stride: y_stride as u32, y_off: 0 }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_classed_by_how_they_share_regions() {
        // (region, position, token)
        let r = |region: u32, pos: u32| (region, pos, 0u32);
        assert_eq!(Regions::of(&[r(0, 5)]), Regions::Own);
        assert_eq!(Regions::of(&[r(0, 5), r(1, 5), r(2, 9)]), Regions::Own);
        // Runs of consecutive positions in pass order, beside rows of their own regions.
        assert_eq!(Regions::of(&[r(0, 5), r(0, 6), r(1, 2), r(2, 7), r(2, 8), r(2, 9)]), Regions::Runs);
        // Out of order, a gap, a region's rows apart, a run past NROW_MAX: the rope dispatch.
        assert_eq!(Regions::of(&[r(0, 6), r(0, 5)]), Regions::Mixed);
        assert_eq!(Regions::of(&[r(0, 5), r(0, 7)]), Regions::Mixed);
        assert_eq!(Regions::of(&[r(0, 5), r(1, 5), r(0, 6)]), Regions::Mixed);
        let long: Vec<(u32, u32, u32)> = (0..NROW_MAX as u32 + 1).map(|p| r(3, p)).collect();
        assert_eq!(Regions::of(&long), Regions::Mixed);
        assert_eq!(Regions::of(&long[..NROW_MAX]), Regions::Runs);
        assert_eq!((Regions::Own.reads(), Regions::Runs.reads(), Regions::Mixed.reads()), (Some(1), Some(NROW_MAX as u32), None));
    }
}
