//! The scratch of one lane: every activation buffer a pass of up to its rows writes, and the
//! host-visible buffers a step reads back.

use std::sync::Arc;

use resin_core::{HomeSpec, NROW_MAX, PF_WINDOW};
use resin_model::ModelConfig;

use crate::buffers::{Buffer, Location};
use crate::device::Gpu;
use crate::kernels::*;
use crate::mv::QPack;
use crate::pipelines::Bind;
use crate::VkError;

use super::*;

/// Scratch for a pass of up to `rows` rows: a window of PF_WINDOW (the token command uses its
/// first rows) on the home's first lane, NROW_MAX on the others; `meta`, `logits_host` and
/// `ids` are host-visible; the logits hold `out_rows` rows.
pub(super) struct Scratch {
    pub(super) meta: Buffer,
    /// The residual and attention rows that need logits, gathered for the narrowed last layer.
    pub(super) xg: Buffer,
    pub(super) ag: Buffer,
    /// Logits rows one pass can land: max(NROW_MAX, regions).
    pub(super) out_rows: usize,
    pub(super) x: Buffer,
    pub(super) xn: Buffer,
    pub(super) q: Buffer,
    pub(super) k: Buffer,
    pub(super) v: Buffer,
    pub(super) att: Buffer,
    pub(super) o: Buffer,
    pub(super) gate: Buffer,
    pub(super) up: Buffer,
    pub(super) down: Buffer,
    pub(super) part: Buffer,
    /// The classifier's output (device-local: the argmax reads it there), and its copy the
    /// host reads.
    pub(super) logits: Buffer,
    pub(super) logits_host: Buffer,
    pub(super) ids: Buffer,
    /// The top-k's candidates (`top_sel`) and sorted lists between its stages, and each
    /// row's best read back (`ReadBack::Top`; key pairs, `kernels::topk_decode`).
    pub(super) top_a: Buffer,
    pub(super) top_b: Buffer,
    pub(super) top_sel: Buffer,
    pub(super) top_host: Buffer,
    /// The logits rows a `ReadBack::TopRows` pass copies to `logits_host` (its first rows):
    /// a count, then the indices (`kernels::rows_copy_words`), written before each submit.
    pub(super) rows_list: Buffer,
    /// Activations rounded through 8-bit blocks of 32 and 256 values (see `act_block`).
    pub(super) xq32: Buffer,
    pub(super) xq256: Buffer,
    /// Token passes' activations packed in 32-value int8 blocks for the canonical product
    /// (see mv.rs).
    pub(super) xp32: Buffer,
    /// A token command's canonical norm (`normpack`): u = x * w packed (apart from `xp32`,
    /// which a SwiGLU epilogue writes while its product reads these), and each row's r.
    pub(super) xpn: Buffer,
    pub(super) rs: Buffer,
    /// Beside the packs a token command's residual product writes into `xpn`
    /// (`mv::MvOut::AddPack`): each 32-value block's sum of squares, and a word a block of a
    /// row its workgroups count themselves in (zero between dispatches).
    pub(super) xss: Buffer,
    pub(super) xss_done: Buffer,
    /// Rows up to which a pass takes the canonical product (`plan::canon_rows`): `xp32`, `xpn`
    /// and `rs` hold that many.
    pub(super) canon_rows: usize,
    /// A mixture-of-experts FFN's router logits, [rows][n_expert].
    pub(super) moe_logits: Buffer,
    /// The mixture-of-experts FFN's slots (row r's j-th expert is slot r * k + j): gate and up
    /// rows, the activation rows `down` reads, down rows, expert ids, weights (a word each for
    /// a dense model).
    pub(super) moe_gate: Buffer,
    pub(super) moe_up: Buffer,
    pub(super) moe_act: Buffer,
    pub(super) moe_down: Buffer,
    pub(super) moe_sel: Buffer,
    pub(super) moe_wt: Buffer,
    /// The slots that chose each expert (`Recorder::moe_group`), the canonical expert
    /// product's columns.
    pub(super) moe_grp: Buffer,
    /// The words a token command's MoE stages count their workgroups in (zero between
    /// dispatches): the router's (`Recorder::moe_router`), then a word a tile of the experts'
    /// down with the slots' sum (`mv::Combine`).
    pub(super) moe_done: Buffer,
    /// Whether `prep` rounds activations (VulkanOptions::q8_activations).
    pub(super) q8: bool,
    /// Whether token passes take the canonical product (q8 activations on a device that runs it).
    pub(super) dot: bool,
    /// The words the decode attention's workgroups of a head group count themselves in, so
    /// that the last to finish merges the pieces, and the argmax's of a row (zero between
    /// dispatches).
    pub(super) done: Buffer,
    /// Split-K GEMM scratch: SPLIT_SLOTS slots of partial sums and of per-tile counters (zero
    /// between dispatches), each `split_part` / `split_done` bytes.
    pub(super) split_part: u64,
    pub(super) split_done: u64,
    pub(super) gpart: Buffer,
    pub(super) gdone: Buffer,
}

/// GEMMs recorded with no barrier between them at most (q, k and v).
pub(super) const SPLIT_SLOTS: usize = 3;

impl Scratch {
    pub(super) fn split_slot(&self, slot: usize) -> Result<crate::gemm::GemmSplit<'_>, VkError> {
        if slot >= SPLIT_SLOTS || self.split_part == 0 {
            return Err(VkError::Model(format!("no split-K scratch slot {slot}")));
        }
        let part = Bind { buf: &self.gpart, offset: slot as u64 * self.split_part, range: self.split_part };
        let done = Bind { buf: &self.gdone, offset: slot as u64 * self.split_done, range: self.split_done };
        Ok(crate::gemm::GemmSplit { part, done })
    }
}

impl Scratch {
    /// Scratch for passes of up to `rows` rows (PF_WINDOW or NROW_MAX: only windows and GEMM
    /// passes split K) landing up to `out_rows` logits rows; `scratch_bytes` counts it.
    pub(super) fn new(gpu: &Arc<Gpu>, cfg: &ModelConfig, q8: bool, out_rows: usize, rows: usize, canon_rows: usize) -> Result<Scratch, VkError> {
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
            xp32: Buffer::new(gpu, packed_bytes(cfg, canon_rows), Location::Device)?,
            xpn: Buffer::new(gpu, packed_bytes(cfg, canon_rows).max(moe_packed_bytes(cfg, r)), Location::Device)?,
            rs: dev(canon_rows.max(if cfg.moe.is_some() { r } else { 0 }))?,
            xss: dev(NROW_MAX * cfg.n_embd.div_ceil(32))?,
            xss_done: {
                let mut b = dev(cfg.n_embd.div_ceil(32))?;
                b.fill_u32(0)?;
                b
            },
            moe_logits: dev((r * moe_experts(cfg)).max(1))?,
            moe_gate: dev((r * moe_used(cfg) * cfg.n_ff).max(1))?,
            moe_up: dev((r * moe_used(cfg) * cfg.n_ff).max(1))?,
            moe_act: dev((r * moe_used(cfg) * cfg.n_ff).max(1))?,
            moe_down: dev((r * moe_used(cfg) * cfg.n_embd).max(1))?,
            moe_sel: dev((r * moe_used(cfg)).max(1))?,
            moe_wt: dev((r * moe_used(cfg)).max(1))?,
            moe_grp: dev(cfg.moe.map_or(1, |m| moe_group_words(m.n_expert as u32, (r * m.n_expert_used) as u32) as usize))?,
            moe_done: {
                // The router's word, then the experts' sum's: a word a tile of at least a row,
                // and one a 32-row block of the next norm's packs.
                let mut b = dev(1 + if cfg.moe.is_some() { cfg.n_embd + cfg.n_embd.div_ceil(32) } else { 0 })?;
                b.fill_u32(0)?;
                b
            },
            q8,
            dot: q8 && crate::mv::mv_ok(&gpu.info),
            canon_rows: canon_rows.max(NROW_MAX),
            done: {
                // A word a row and head (decode attention) or tile of rows and head (a window's).
                let mut b = dev(PF_WINDOW.max(WINDOW_ATTN_MIN_ROWS).max(HomeSpec::wide_rows(out_rows)) * cfg.n_head)?;
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

/// Bytes of a mixture-of-experts model's packed normed input for `rows` rows (its FFN's grouped
/// canonical product takes windows too); none for a dense model.
fn moe_packed_bytes(cfg: &ModelConfig, rows: usize) -> u64 {
    match cfg.moe {
        Some(_) => QPack::new((rows * cfg.n_embd.next_multiple_of(32)) as u32).map(|q| q.bytes()).unwrap_or(4),
        None => 0,
    }
}

/// Bytes of the packed activations of `rows` rows (at least NROW_MAX) of the widest input.
pub(super) fn packed_bytes(cfg: &ModelConfig, rows: usize) -> u64 {
    let widest = cfg.n_embd.max(cfg.q_dim()).max(cfg.n_ff);
    let count = (rows.max(NROW_MAX) * widest.next_multiple_of(32)) as u32;
    QPack::new(count).map(|q| q.bytes()).unwrap_or(4)
}
