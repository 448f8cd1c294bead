//! Prefill-window attention (`shaders/ops/attn_window.comp`): flash-style tiles. Workgroup
//! (q head, tile of `br` consecutive query rows) walks the keys in tiles of `bc`; each K and V
//! tile is loaded into shared memory once for all the tile's rows (the decode kernel re-reads
//! every key for every row), online softmax per row in f32, the causal mask by each row's key
//! count. A tile whose rows lie in several regions (a segment boundary) takes its distinct
//! `kv_base` values one after another. The output is what [`Recorder::attention`] writes:
//! `out[(r * n_head + h) * head_dim + d]`, no partials buffer, one dispatch.
//!
//! Two tiers from the one shader body: the scalar tier (f32 throughout, every device, every
//! mirror codec) and, on devices with 16x16x16 f16 x f16 -> f32 cooperative matrices and the
//! f16 mirror, the cooperative-matrix tier ([`coopmat_ok`]): scores and P V on tensor tiles,
//! q and the weights rounded to f16.

use resin_core::KvCodec;

use crate::device::DeviceInfo;
use crate::gemm::{has_f16_16x16x16, GemmCaps};
use crate::kernels::{codec_name, AttnPush, Push, Recorder, MAX_HEAD_DIM};
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
        // q and k/v tiles, scores, six words a row, three a group, and the parallel
        // softmax's partial maxima and sums (a float a thread each).
        4 * (self.br * qs + self.bc * qs + self.br * self.bc + 6 * self.br + 3 + 2 * self.wg(head_dim))
    }

    /// Threads a workgroup for this tile: enough for `br * head_dim` accumulators, 128..=256.
    pub fn wg(self, head_dim: u32) -> u32 {
        (self.br * head_dim).div_ceil(WINDOW_MAXACC).next_multiple_of(64).clamp(WINDOW_WG_MIN, WINDOW_WG_MAX)
    }

    /// Whether the kernel can run this tile for `head_dim` within `shared` bytes and `max_wg`
    /// threads a workgroup.
    pub fn fits(self, head_dim: u32, shared: u32, max_wg: u32) -> bool {
        self.br >= 1 && self.bc >= 1 && self.br * head_dim <= WINDOW_MAXACC * self.wg(head_dim) && self.wg(head_dim) <= max_wg && self.shared_bytes(head_dim) <= shared
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

/// Subgroups a cooperative-matrix workgroup has.
pub const COOPMAT_SUBGROUPS: u32 = 4;

/// Query rows and keys a cooperative-matrix workgroup tile covers (BR, BC) at `head_dim` on a
/// device of `shared` bytes of shared memory a workgroup: 32 rows, and 64 keys where that
/// tile fits min(`shared`, [`WINDOW_SHARED_CAP`]) with a workgroup of `wg` threads, else 32
/// (half the barriers a key of the 32-key tile; each row's sums run in key order either way).
pub fn coopmat_tile(head_dim: u32, wg: u32, shared: u32) -> WindowTile {
    let wide = WindowTile { br: 32, bc: 64 };
    if coopmat_shared_bytes(wide, head_dim, wg) <= shared.min(WINDOW_SHARED_CAP) {
        wide
    } else {
        WindowTile { br: 32, bc: 32 }
    }
}

/// Shared memory of the cooperative-matrix tier (bytes; mirrors the shader) for `tile`: f16 q,
/// k/v and weight tiles (rows padded by 8 values), f32 scores and outputs, the rows' state and
/// the softmax's partials.
pub fn coopmat_shared_bytes(tile: WindowTile, head_dim: u32, wg: u32) -> u32 {
    let (br, bc) = (tile.br, tile.bc);
    2 * (br * (head_dim + 8) + bc * (head_dim + 8) + br * (bc + 8)) + 4 * (br * bc + br * head_dim + 6 * br + 3 + 2 * wg)
}

/// Whether the cooperative-matrix tier serves a window of this mirror codec and head dim on
/// this device (else the scalar tier does).
pub fn coopmat_ok(info: &DeviceInfo, codec: KvCodec, head_dim: u32) -> bool {
    let c = GemmCaps::of(info);
    let wg = COOPMAT_SUBGROUPS * c.subgroup_size;
    let t = coopmat_tile(head_dim, wg, c.shared_memory);
    codec == KvCodec::F16
        && head_dim > 0
        && head_dim.is_multiple_of(16)
        && c.coopmat
        && has_f16_16x16x16(&c.coopmat_shapes)
        && c.f16_arith
        && c.api >= (1, 3, 0)
        && c.subgroup_basic
        && c.vulkan_memory_model
        && c.subgroup_size.is_power_of_two()
        // The softmax takes wg / BR threads a row, each over BC / (wg / BR) keys.
        && (t.br..=t.br * t.bc).contains(&wg)
        && wg <= c.max_workgroup_invocations
        && coopmat_shared_bytes(t, head_dim, wg) <= c.shared_memory.min(WINDOW_SHARED_CAP)
}

impl Recorder<'_> {
    /// Attention of a prefill window of `rows` rows in one dispatch: for each row r and head h,
    /// softmax(q.k * scale) . v over keys 0..meta[r].keys of the row's region (meta[r].kv_base;
    /// only the last `p.key_window` of them when that is not 0),
    /// written to `out` exactly where [`Recorder::attention`] writes it. `p` is the decode
    /// attention's push block (`n_pieces` is not used). The tile comes from
    /// [`WindowTile::pick`] for this device.
    #[allow(clippy::too_many_arguments)]
    pub fn attention_window(&mut self, codec: KvCodec, rows: u32, q: Bind<'_>, mk: Bind<'_>, mv: Bind<'_>, meta: Bind<'_>, out: Bind<'_>, p: AttnPush) -> Result<(), VkError> {
        let info = &self.gpu.info;
        if coopmat_ok(info, codec, p.head_dim) {
            return self.attention_window_coopmat(rows, q, mk, mv, meta, out, p);
        }
        let tile = WindowTile::pick(p.head_dim, info.shared_memory, info.max_workgroup_invocations)
            .ok_or_else(|| VkError::Unsupported(format!("window attention at head dim {} in {} bytes of shared memory", p.head_dim, info.shared_memory)))?;
        self.attention_window_tile(tile, codec, rows, q, mk, mv, meta, out, p)
    }

    /// [`Recorder::attention_window`] in the cooperative-matrix tier (f16 mirror), refused
    /// where [`coopmat_ok`] is false.
    #[allow(clippy::too_many_arguments)]
    pub fn attention_window_coopmat(&mut self, rows: u32, q: Bind<'_>, mk: Bind<'_>, mv: Bind<'_>, meta: Bind<'_>, out: Bind<'_>, p: AttnPush) -> Result<(), VkError> {
        let hd = p.head_dim;
        if !coopmat_ok(&self.gpu.info, KvCodec::F16, hd) || p.n_head_kv == 0 || !p.n_head.is_multiple_of(p.n_head_kv) {
            return Err(VkError::Unsupported(format!("cooperative-matrix window attention at head dim {hd}, {} heads over {} kv heads on this device", p.n_head, p.n_head_kv)));
        }
        if rows == 0 {
            return Ok(());
        }
        let wg = COOPMAT_SUBGROUPS * self.gpu.info.subgroup_size;
        let wp = AttnWindowPush { n_head: p.n_head, n_head_kv: p.n_head_kv, head_dim: hd, rows, scale: p.scale, key_window: p.key_window };
        let t = coopmat_tile(hd, wg, self.gpu.info.shared_memory);
        self.run("attn_window_cm_f16", &[wg, t.br, t.bc, hd], &[q, mk, mv, meta, out], &wp.bytes(), [p.n_head, rows.div_ceil(t.br), 1])
    }

    /// [`Recorder::attention_window`] in the scalar tier with a chosen tile (tests run
    /// several).
    #[allow(clippy::too_many_arguments)]
    pub fn attention_window_tile(
        &mut self,
        tile: WindowTile,
        codec: KvCodec,
        rows: u32,
        q: Bind<'_>,
        mk: Bind<'_>,
        mv: Bind<'_>,
        meta: Bind<'_>,
        out: Bind<'_>,
        p: AttnPush,
    ) -> Result<(), VkError> {
        let c = codec_name(codec, p.head_dim)?;
        let hd = p.head_dim;
        if hd == 0 || !hd.is_multiple_of(2) || hd as usize > MAX_HEAD_DIM || p.n_head_kv == 0 || !p.n_head.is_multiple_of(p.n_head_kv) {
            return Err(VkError::Unsupported(format!("window attention with head dim {hd}, {} heads over {} kv heads", p.n_head, p.n_head_kv)));
        }
        if !tile.fits(hd, self.gpu.info.shared_memory, self.gpu.info.max_workgroup_invocations) {
            return Err(VkError::Unsupported(format!("window attention tile {tile:?} at head dim {hd} ({} bytes of shared memory)", tile.shared_bytes(hd))));
        }
        if rows == 0 {
            return Ok(());
        }
        let wp = AttnWindowPush { n_head: p.n_head, n_head_kv: p.n_head_kv, head_dim: hd, rows, scale: p.scale, key_window: p.key_window };
        self.run(&format!("attn_window_{c}"), &[tile.wg(hd), tile.br, tile.bc, hd], &[q, mk, mv, meta, out], &wp.bytes(), [p.n_head, rows.div_ceil(tile.br), 1])
    }
}
