//! A weight matrix laid out for the canonical product (docs/canonical-order.md): tiles of
//! [`TILE`] weight rows whose quants are interleaved so that one SIMD lane is one weight row.
//!
//! In the GGUF layout a block's 32 quants are contiguous, so an integer dot leaves each block's
//! sum spread over several lanes and every block needs a horizontal fold before its float
//! term. Here a 64-byte record holds 4 quants of each of the tile's 16 rows (row `r` at bytes
//! `4r..4r + 4`): a dot of the record with 4 activation bytes broadcast to every lane adds to
//! each row's own i32 lane, so a block's sums come out one row a lane, its float term is one
//! vector expression, and a chunk's running sum is a lane-wise add, exactly the order the spec
//! fixes. The same bytes serve every activation row count.
//!
//! Per tile, for each unit (a block; a K-quant super-block of 8 blocks):
//! - a head (K-quants): `D` f16 x 16, then `Dmin` f16 x 16 (Q4_K, Q5_K);
//! - per block: its scales, its high-bit planes, its quants.
//!
//! Quants are stored as unsigned values `u = q + off` (`off`: Q4_0 8, Q5_0 16, Q6_K 32, else 0)
//! so that the integer dot is `sum u * a = s + off * sum a` and `s` follows from the block's
//! activation sum; Q8_0 keeps its signed bytes. Record `j` of a 4-bit block holds group `j`
//! (values `4j..4j + 4`) in the low nibbles and group `j + 4` in the high ones; Q8_0 has 8
//! records of whole bytes. Q5_0 and Q5_K add one plane whose byte `4r + e` has, at bit `g`,
//! bit 4 of value `4g + e`; Q6_K adds two planes, plane `h` holding bits 4-5 of group `4h + k`
//! at bits `2k..2k + 2`. Block scales: Q8_0, Q4_0, Q5_0: `dw` f16 x 16; Q4_1: `dw`, then
//! `mw`; Q4_K, Q5_K: the 6-bit scale u8 x 16, then the min; Q6_K: the two 16-value scales,
//! i8 x 16 each. Rows past the matrix's last in its last tile are zero.

use std::sync::Arc;

use resin_core::canon::BLOCK;
use resin_gguf::GgmlType;

use super::portable::{decode32, decode_k};
use super::{KernelError, QMatrix};

/// Weight rows a tile: one a lane of a 512-bit vector of i32.
pub const TILE: usize = 16;
/// Bytes of one record: 4 quants of each of the tile's rows.
pub(super) const RECORD: usize = 4 * TILE;

/// How a format's blocks are laid out in a tile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Layout {
    /// Blocks a unit (8 for the K-quants' super-blocks).
    pub unit_blocks: usize,
    /// Bytes of a unit's head.
    pub head: usize,
    /// Bytes of a block's scales.
    pub scales: usize,
    /// High-bit planes a block (records).
    pub planes: usize,
    /// Quant records a block (8 whole bytes, or 4 of nibbles).
    pub records: usize,
    /// What is added to a decoded quant to store it unsigned.
    pub off: i32,
}

impl Layout {
    pub fn of(ty: GgmlType) -> Option<Layout> {
        use GgmlType::*;
        let (unit_blocks, head, scales, planes, records, off) = match ty {
            Q8_0 => (1, 0, 32, 0, 8, 0),
            Q4_0 => (1, 0, 32, 0, 4, 8),
            Q4_1 => (1, 0, 64, 0, 4, 0),
            Q5_0 => (1, 0, 32, 1, 4, 16),
            Q4_K => (8, 64, 32, 0, 4, 0),
            Q5_K => (8, 64, 32, 1, 4, 0),
            Q6_K => (8, 32, 32, 2, 4, 32),
            _ => return None,
        };
        Some(Layout { unit_blocks, head, scales, planes, records, off })
    }

    /// Bytes of one block's scales, planes and quants.
    pub fn block_bytes(&self) -> usize {
        self.scales + (self.planes + self.records) * RECORD
    }

    pub fn unit_bytes(&self) -> usize {
        self.head + self.unit_blocks * self.block_bytes()
    }

    /// Offset of block `b`'s scales inside a tile (its planes and quants follow).
    pub fn block_at(&self, b: usize) -> usize {
        let (u, j) = (b / self.unit_blocks, b % self.unit_blocks);
        u * self.unit_bytes() + self.head + j * self.block_bytes()
    }

    /// Offset of the head of the unit holding block `b`.
    pub fn head_at(&self, b: usize) -> usize {
        b / self.unit_blocks * self.unit_bytes()
    }
}

/// A matrix in the canonical tile layout (see the module docs): its tiles in memory it
/// shares with the other matrices of its stack (a mixture-of-experts layer's experts).
pub struct CanonMatrix {
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub(super) layout: Layout,
    pub(super) tile_bytes: usize,
    /// Where its tiles start in `mem`.
    at: usize,
    /// The stack's tiles, in pages of their own (huge pages where the OS gives them: a pass
    /// streams every byte, so fewer translation misses, and fewer faults to fill them).
    mem: Arc<memmap2::Mmap>,
}

impl std::fmt::Debug for CanonMatrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CanonMatrix({} {} x {})", self.ty, self.rows, self.cols)
    }
}

impl CanonMatrix {
    /// Lay `w` out in tiles. Errors where its format has no canonical expression or its rows
    /// are not whole blocks of 32.
    pub fn pack(w: &QMatrix) -> Result<CanonMatrix, KernelError> {
        Ok(Self::pack_stack(w, 1)?.remove(0))
    }

    /// Lay out `w` as `parts` matrices of its rows in turn (a stack of experts, each its own
    /// tiles so that an expert's rows start a tile), side by side over the threads.
    pub fn pack_stack(w: &QMatrix, parts: usize) -> Result<Vec<CanonMatrix>, KernelError> {
        let layout = Layout::of(w.ty).ok_or(KernelError::Unsupported(w.ty))?;
        if w.cols == 0 || !w.cols.is_multiple_of(BLOCK) || !w.cols.is_multiple_of(w.ty.block_len()) {
            return Err(KernelError::PartialBlock { ty: w.ty, cols: w.cols });
        }
        if parts == 0 || !w.rows.is_multiple_of(parts) {
            return Err(KernelError::Shape(format!("{} rows are not {parts} matrices", w.rows)));
        }
        let rows = w.rows / parts;
        let tile_bytes = w.cols / BLOCK / layout.unit_blocks * layout.unit_bytes();
        let tiles = rows.div_ceil(TILE);
        let part_bytes = tiles * tile_bytes;
        let bytes = (parts * part_bytes).max(1);
        let mut mem = memmap2::MmapMut::map_anon(bytes).map_err(|e| KernelError::Shape(format!("{bytes} bytes for {} tiles: {e}", w.ty)))?;
        #[cfg(target_os = "linux")]
        let _ = mem.advise(memmap2::Advice::HugePage);
        let pack_tile = |i: usize, dst: &mut [u8]| {
            let (e, t) = (i / tiles, i % tiles);
            for r in 0..TILE.min(rows - t * TILE) {
                pack_row(w, &layout, e * rows + t * TILE + r, r, dst);
            }
        };
        let dst = &mut mem[..parts * part_bytes];
        if dst.len() >= 1 << 20 {
            use rayon::prelude::*;
            dst.par_chunks_mut(tile_bytes).enumerate().for_each(|(i, d)| pack_tile(i, d));
        } else {
            dst.chunks_mut(tile_bytes).enumerate().for_each(|(i, d)| pack_tile(i, d));
        }
        let mem = Arc::new(mem.make_read_only().map_err(|e| KernelError::Shape(format!("sealing {} tiles: {e}", w.ty)))?);
        Ok((0..parts).map(|e| CanonMatrix { ty: w.ty, rows, cols: w.cols, layout, tile_bytes, at: e * part_bytes, mem: mem.clone() }).collect())
    }

    pub fn tiles(&self) -> usize {
        self.rows.div_ceil(TILE)
    }

    /// Bytes in memory.
    pub fn size(&self) -> usize {
        self.tiles() * self.tile_bytes
    }

    /// Tile `t`'s bytes.
    pub(super) fn tile(&self, t: usize) -> &[u8] {
        let at = self.at + t * self.tile_bytes;
        &self.mem[at..at + self.tile_bytes]
    }
}

fn put16(dst: &mut [u8], at: usize, lane: usize, v: f32) {
    let h = half::f16::from_f32(v).to_bits().to_le_bytes();
    dst[at + 2 * lane..at + 2 * lane + 2].copy_from_slice(&h);
}

/// Row `m` of `w` into lane `r` of its tile `dst`.
fn pack_row(w: &QMatrix, l: &Layout, m: usize, r: usize, dst: &mut [u8]) {
    let row = w.row(m);
    let nb = w.cols / BLOCK;
    let bb = w.ty.block_bytes();
    let mut u = [0i32; BLOCK];
    let mut b = 0;
    while b < nb {
        if l.unit_blocks == 1 {
            let (dw, mw, q) = decode32(w.ty, &row[b * bb..(b + 1) * bb]);
            let at = l.block_at(b);
            put16(dst, at, r, dw);
            if w.ty == GgmlType::Q4_1 {
                put16(dst, at + 32, r, mw);
            }
            for (o, v) in u.iter_mut().zip(q) {
                *o = v as i32 + l.off;
            }
            put_quants(w.ty, l, &u, at + l.scales, r, dst);
            b += 1;
        } else {
            let (q, sc, mn, dd, dmin) = decode_k(w.ty, &row[b / 8 * bb..(b / 8 + 1) * bb]);
            let head = l.head_at(b);
            put16(dst, head, r, dd);
            if w.ty != GgmlType::Q6_K {
                put16(dst, head + 32, r, dmin);
            }
            for j in 0..8 {
                let at = l.block_at(b + j);
                // Both 16-value scales of a block (the K4 formats repeat theirs).
                let (s0, s1) = if w.ty == GgmlType::Q6_K { (sc[2 * j], sc[2 * j + 1]) } else { (sc[2 * j], mn[2 * j]) };
                dst[at + r] = s0 as u8;
                dst[at + TILE + r] = s1 as u8;
                for (e, o) in u.iter_mut().enumerate() {
                    *o = q[32 * j + e] as i32 + l.off;
                }
                put_quants(w.ty, l, &u, at + l.scales, r, dst);
            }
            b += 8;
        }
    }
}

/// A block's unsigned quants `u` into lane `r` of its planes and records at `at`.
fn put_quants(ty: GgmlType, l: &Layout, u: &[i32; BLOCK], at: usize, r: usize, dst: &mut [u8]) {
    let quants = at + l.planes * RECORD + 4 * r;
    if ty == GgmlType::Q8_0 {
        for (v, &q) in u.iter().enumerate() {
            dst[quants + (v / 4) * RECORD + v % 4] = q as u8;
        }
        return;
    }
    // Value t of group t / 4 (t < 16) beside value t + 16 of group t / 4 + 4.
    for t in 0..16 {
        dst[quants + (t / 4) * RECORD + t % 4] = (u[t] & 15) as u8 | ((u[t + 16] & 15) << 4) as u8;
    }
    let planes = at + 4 * r;
    match l.planes {
        1 => {
            let mut b = [0u8; 4];
            for (v, &q) in u.iter().enumerate() {
                b[v % 4] |= (((q >> 4) & 1) << (v / 4)) as u8;
            }
            dst[planes..planes + 4].copy_from_slice(&b);
        }
        2 => {
            let mut b = [[0u8; 4]; 2];
            for (v, &q) in u.iter().enumerate() {
                let g = v / 4;
                b[g / 4][v % 4] |= (((q >> 4) & 3) << (2 * (g % 4))) as u8;
            }
            dst[planes..planes + 4].copy_from_slice(&b[0]);
            dst[planes + RECORD..planes + RECORD + 4].copy_from_slice(&b[1]);
        }
        _ => {}
    }
}

/// The unsigned quants of block `b`, lane `r` of tile bytes `t` (what `put_quants` stored).
pub(super) fn quants(ty: GgmlType, l: &Layout, t: &[u8], b: usize, r: usize) -> [i32; BLOCK] {
    let at = l.block_at(b) + l.scales;
    let quants = at + l.planes * RECORD;
    let mut u = [0i32; BLOCK];
    for e in 0..4 {
        for g in 0..8 {
            u[4 * g + e] = if ty == GgmlType::Q8_0 {
                t[quants + g * RECORD + 4 * r + e] as i8 as i32
            } else {
                let byte = t[quants + (g % 4) * RECORD + 4 * r + e];
                let lo = if g < 4 { byte & 15 } else { byte >> 4 } as i32;
                let hi = match l.planes {
                    1 => (t[at + 4 * r + e] >> g) & 1,
                    2 => (t[at + (g / 4) * RECORD + 4 * r + e] >> (2 * (g % 4))) & 3,
                    _ => 0,
                } as i32;
                lo | hi << 4
            };
        }
    }
    u
}

/// f16 lane `r` of the 16 at `at`.
pub(super) fn get16(t: &[u8], at: usize, r: usize) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([t[at + 2 * r], t[at + 2 * r + 1]])).to_f32()
}
