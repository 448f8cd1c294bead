//! Prefill-window attention (`shaders/ops/attn_window.comp`): flash-style tiles. Workgroup
//! (q head, tile of `br` consecutive query rows, key piece) walks the piece's keys in tiles of
//! `bc`; each K and V tile is loaded into shared memory once for all the tile's rows (the
//! decode kernel re-reads every key for every row), online softmax per row in f32, the causal
//! mask by each row's key count. A row of many keys splits them into up to [`WINDOW_PIECES`]
//! pieces ([`window_piece_keys`]), a workgroup each, so a window after a long history keeps
//! the device's units busy; the workgroup that finishes a tile's pieces last merges them in
//! piece order. A tile whose rows lie in several regions (a segment boundary), or straddle a
//! piece size, takes its groups one after another. The output is what
//! [`Recorder::attention`] writes: `out[(r * n_head + h) * head_dim + d]`, one dispatch.
//!
//! Two tiers from the one shader body: the scalar tier (f32 throughout, every device, every
//! mirror codec) and, on devices with 16x16x16 f16 x f16 -> f32 cooperative matrices and the
//! f16 mirror, the cooperative-matrix tier ([`coopmat_ok`]): scores and P V on tensor tiles,
//! q and the weights rounded to f16, each subgroup a strip of 16 query rows whose q and
//! outputs stay in its registers for the whole key walk ([`coopmat_tile`]).

use resin_core::KvCodec;

use crate::device::DeviceInfo;
use crate::gemm::{has_f16_16x16x16, GemmCaps};
use crate::kernels::{attn_part_len, codec_name, AttnBinds, AttnPush, Push, Recorder, MAX_HEAD_DIM};
use crate::pipelines::Bind;
use crate::VkError;

/// Threads a workgroup (specialization constant 0): at least this many ...
pub const WINDOW_WG_MIN: u32 = 128;
/// ... and at most this many (enough for `WINDOW_MAXACC` accumulators a thread).
pub const WINDOW_WG_MAX: u32 = 256;
/// Accumulators a thread (`MAXACC` in the shader): `br * head_dim <= WINDOW_MAXACC * wg`. (At 32
/// lavapipe computed wrong values past ~1000 keys; 16 is what the tests pass with.)
pub const WINDOW_MAXACC: u32 = 16;
/// Shared memory the kernel asks for at most, below the device's limit.
pub const WINDOW_SHARED_CAP: u32 = 48 * 1024;

/// Pieces a window's row splits its keys into at most (shaders/common/meta.glsl): a workgroup
/// a piece, so a window after a long history still spreads over the device's units.
pub const WINDOW_PIECES: u32 = 4;
/// Keys a piece holds at least: rows of up to this many keys are never split.
pub const WINDOW_PIECE_MIN: u32 = 1024;

/// The keys of a piece of a window row of `keys` keys (mirrors `win_piece_keys` in
/// meta.glsl): the smallest power-of-two multiple of [`WINDOW_PIECE_MIN`] that cuts them into
/// at most [`WINDOW_PIECES`] pieces, from the row's key count alone, so a row's result does not
/// depend on the rows beside it. Pieces start at multiples of it, so key tiles never cross one.
pub fn window_piece_keys(keys: u32) -> u32 {
    let mut per = WINDOW_PIECE_MIN;
    while per * WINDOW_PIECES < keys {
        per *= 2;
    }
    per
}

/// The push block of `attn_window_*`: [`AttnPush`] with the window's row count in place of the
/// piece count.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct AttnWindowPush {
    pub n_head: u32,
    pub n_head_kv: u32,
    pub head_dim: u32,
    pub rows: u32,
    pub scale: f32,
    pub key_window: u32,
}
const _: () = assert!(std::mem::size_of::<AttnWindowPush>() == 24);
impl Push for AttnWindowPush {}

/// A tile shape: `br` query rows a workgroup, `bc` keys a shared-memory tile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowTile {
    pub br: u32,
    pub bc: u32,
}

impl WindowTile {
    /// Shared memory the kernel declares for this tile and head dim (bytes; mirrors the shader).
    pub fn shared_bytes(self, head_dim: u32) -> u32 {
        let qs = head_dim + 1;
        // q and k/v tiles, scores, eight words a row, seven a tile, and the parallel
        // softmax's partial maxima and sums (a float a thread each).
        4 * (self.br * qs + self.bc * qs + self.br * self.bc + 8 * self.br + 7 + 2 * self.wg(head_dim))
    }

    /// Threads a workgroup for this tile: enough for `br * head_dim` accumulators, 128..=256.
    pub fn wg(self, head_dim: u32) -> u32 {
        (self.br * head_dim).div_ceil(WINDOW_MAXACC).next_multiple_of(64).clamp(WINDOW_WG_MIN, WINDOW_WG_MAX)
    }

    /// Whether the kernel can run this tile for `head_dim` within `shared` bytes and `max_wg`
    /// threads a workgroup (and its key tiles never cross a key piece).
    pub fn fits(self, head_dim: u32, shared: u32, max_wg: u32) -> bool {
        self.br >= 1
            && self.bc >= 1
            && WINDOW_PIECE_MIN.is_multiple_of(self.bc)
            && self.br * head_dim <= WINDOW_MAXACC * self.wg(head_dim)
            && self.wg(head_dim) <= max_wg
            && self.shared_bytes(head_dim) <= shared
    }

    /// The largest tile (most query rows first: they set how often a key is read) that fits
    /// the device's shared memory (capped at [`WINDOW_SHARED_CAP`]). Pure: tests call it with
    /// lavapipe's and an H200's limits.
    pub fn pick(head_dim: u32, device_shared: u32, max_wg: u32) -> Option<WindowTile> {
        let shared = device_shared.min(WINDOW_SHARED_CAP);
        [(32, 32), (32, 16), (16, 32), (16, 16), (16, 8), (8, 8), (8, 4), (4, 4), (2, 2), (1, 1)]
            .into_iter()
            .map(|(br, bc)| WindowTile { br, bc })
            .find(|t| t.fits(head_dim, shared, max_wg))
    }
}

/// The cooperative-matrix tile for `head_dim` on a device of `shared` bytes of shared memory a
/// workgroup: a subgroup a strip of 16 query rows (`br` = 16 x subgroups),
/// `bc` keys a tile. The first of 4 x 64, 4 x 32, 2 x 64, 2 x 32 (strips x keys) whose shared
/// memory fits min(`shared`, [`WINDOW_SHARED_CAP`]): most rows first (they set how often a key
/// tile is read), then fewer barriers a key (every size divides [`WINDOW_PIECE_MIN`]). None
/// where none fits (head dim 256 at 48 KiB: the scalar tier serves it, as it did before this
/// tier's strips were timed there).
pub fn coopmat_tile(head_dim: u32, shared: u32) -> Option<WindowTile> {
    [(4, 64), (4, 32), (2, 64), (2, 32)]
        .into_iter()
        .map(|(strips, bc)| WindowTile { br: 16 * strips, bc })
        .find(|&t| coopmat_shared_bytes(t, head_dim) <= shared.min(WINDOW_SHARED_CAP))
}

/// Threads a cooperative-matrix workgroup of `tile` has: a subgroup a strip of 16 rows.
pub fn coopmat_wg(tile: WindowTile, subgroup: u32) -> u32 {
    tile.br / 16 * subgroup
}

/// Shared memory of the cooperative-matrix tier (bytes; mirrors the shader) for `tile`: the f16
/// K and V tiles (rows padded by 8 values), each strip's f32 scratch (scores or outputs, padded
/// by 4) and f16 scratch (weights or q, padded by 8), and the rows' and the tile's state.
pub fn coopmat_shared_bytes(tile: WindowTile, head_dim: u32) -> u32 {
    let (br, bc) = (tile.br, tile.bc);
    let xw = bc.max(head_dim);
    2 * (2 * bc * (head_dim + 8) + br * (xw + 8)) + 4 * (br * (xw + 4) + 8 * br + 7)
}

/// Whether the cooperative-matrix tier serves a window of this mirror codec and head dim on
/// this device (else the scalar tier does).
pub fn coopmat_ok(info: &DeviceInfo, codec: KvCodec, head_dim: u32) -> bool {
    let c = GemmCaps::of(info);
    let Some(t) = coopmat_tile(head_dim, c.shared_memory) else { return false };
    let ops = ["basic", "arithmetic", "shuffle", "vote"];
    codec == KvCodec::F16
        && head_dim > 0
        && head_dim.is_multiple_of(16)
        && c.coopmat
        && has_f16_16x16x16(&c.coopmat_shapes)
        && c.f16_arith
        && c.api >= (1, 3, 0)
        && ops.iter().all(|op| info.subgroup_ops.contains(op))
        && c.vulkan_memory_model
        // A row's softmax takes subgroup / 16 lanes, each a run of the tile's keys.
        && c.subgroup_size.is_power_of_two()
        && (16..=t.bc * 16).contains(&c.subgroup_size)
        && coopmat_wg(t, c.subgroup_size) <= c.max_workgroup_invocations
}

impl Recorder<'_> {
    /// Attention of a prefill window of `rows` rows in one dispatch: for each row r and head h,
    /// softmax(q.k * scale) . v over keys 0..meta[r].keys of the row's region (meta[r].kv_base;
    /// only the last `p.key_window` of them when that is not 0),
    /// written to `out` exactly where [`Recorder::attention`] writes it. `p` is the decode
    /// attention's push block (`n_pieces` is not used) and `b` its binds: `b.part` takes the
    /// split rows' pieces ([`attn_part_len`]`(rows, n_head, head_dim, WINDOW_PIECES)` floats),
    /// `done` the tiles' counters (a zeroed word a row and head, left zeroed). The tile comes
    /// from [`WindowTile::pick`] for this device.
    pub fn attention_window(&mut self, codec: KvCodec, rows: u32, b: AttnBinds<'_>, done: Bind<'_>, p: AttnPush) -> Result<(), VkError> {
        let info = &self.gpu.info;
        if coopmat_ok(info, codec, p.head_dim) {
            return self.attention_window_coopmat(rows, b, done, p);
        }
        let tile = WindowTile::pick(p.head_dim, info.shared_memory, info.max_workgroup_invocations)
            .ok_or_else(|| VkError::Unsupported(format!("window attention at head dim {} in {} bytes of shared memory", p.head_dim, info.shared_memory)))?;
        self.attention_window_tile(tile, codec, rows, b, done, p)
    }

    /// [`Recorder::attention_window`] in the cooperative-matrix tier (f16 mirror), refused
    /// where [`coopmat_ok`] is false.
    pub fn attention_window_coopmat(&mut self, rows: u32, b: AttnBinds<'_>, done: Bind<'_>, p: AttnPush) -> Result<(), VkError> {
        let hd = p.head_dim;
        if !coopmat_ok(&self.gpu.info, KvCodec::F16, hd) || p.n_head_kv == 0 || !p.n_head.is_multiple_of(p.n_head_kv) {
            return Err(VkError::Unsupported(format!("cooperative-matrix window attention at head dim {hd}, {} heads over {} kv heads on this device", p.n_head, p.n_head_kv)));
        }
        let t = coopmat_tile(hd, self.gpu.info.shared_memory).ok_or_else(|| VkError::Unsupported(format!("cooperative-matrix window attention at head dim {hd}")))?;
        let wg = coopmat_wg(t, self.gpu.info.subgroup_size);
        self.window_dispatch("attn_window_cm_f16", [wg, t.br, t.bc, hd], rows, b, done, p)
    }

    /// [`Recorder::attention_window`] in the scalar tier with a chosen tile (tests run
    /// several).
    pub fn attention_window_tile(&mut self, tile: WindowTile, codec: KvCodec, rows: u32, b: AttnBinds<'_>, done: Bind<'_>, p: AttnPush) -> Result<(), VkError> {
        let c = codec_name(codec, p.head_dim)?;
        let hd = p.head_dim;
        if hd == 0 || !hd.is_multiple_of(2) || hd as usize > MAX_HEAD_DIM || p.n_head_kv == 0 || !p.n_head.is_multiple_of(p.n_head_kv) {
            return Err(VkError::Unsupported(format!("window attention with head dim {hd}, {} heads over {} kv heads", p.n_head, p.n_head_kv)));
        }
        if !tile.fits(hd, self.gpu.info.shared_memory, self.gpu.info.max_workgroup_invocations) {
            return Err(VkError::Unsupported(format!("window attention tile {tile:?} at head dim {hd} ({} bytes of shared memory)", tile.shared_bytes(hd))));
        }
        self.window_dispatch(&format!("attn_window_{c}"), [tile.wg(hd), tile.br, tile.bc, hd], rows, b, done, p)
    }

    /// One window dispatch of either tier (specialization: threads, BR, BC, head dim): a
    /// workgroup a head, tile of BR rows and key piece.
    fn window_dispatch(&mut self, name: &str, spec: [u32; 4], rows: u32, b: AttnBinds<'_>, done: Bind<'_>, p: AttnPush) -> Result<(), VkError> {
        let hd = p.head_dim;
        let need = attn_part_len(rows as usize, p.n_head as usize, hd as usize, WINDOW_PIECES as usize) as u64 * 4;
        if b.part.range < need {
            return Err(VkError::OutOfRange(format!("{} bytes of window attention partials for {rows} rows (need {need})", b.part.range)));
        }
        let tiles = rows.div_ceil(spec[1]);
        if done.range < (tiles * p.n_head) as u64 * 4 {
            return Err(VkError::OutOfRange(format!("{} bytes of window attention counters for {tiles} tiles of {} heads", done.range, p.n_head)));
        }
        if rows == 0 {
            return Ok(());
        }
        let wp = AttnWindowPush { n_head: p.n_head, n_head_kv: p.n_head_kv, head_dim: hd, rows, scale: p.scale, key_window: p.key_window };
        self.run(name, &spec, &[b.q, b.mk, b.mv, b.meta, b.out, b.part, done], &wp.bytes(), [p.n_head, tiles, WINDOW_PIECES])
    }
}
