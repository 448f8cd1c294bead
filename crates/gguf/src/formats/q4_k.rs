//! Q4_K: 256 values in 8 sub-blocks of 32; 4-bit quants, x = d * sc * q - dmin * m, with 6-bit
//! scales and mins packed in 12 bytes (see `kquant::scale_min_k4`). Each 32-byte run of `qs`
//! holds two sub-blocks: the low nibbles the first, the high nibbles the second.

use super::kquant::{make_qkx2_quants, pack_scale_min_k4, scale_min_k4};
use super::{f16_bytes, f16_le, nearest_int, Block};
use crate::GgmlType;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct BlockQ4K {
    /// Super-block scale for the scales (f16).
    pub d: [u8; 2],
    /// Super-block scale for the mins (f16).
    pub dmin: [u8; 2],
    /// Eight 6-bit scales and eight 6-bit mins, packed.
    pub scales: [u8; 12],
    pub qs: [u8; 128],
}
const _: () = assert!(std::mem::size_of::<BlockQ4K>() == 144);

/// The scale search shared by Q4_K and Q5_K (quantize_row_q{4,5}_K_ref): per sub-block of 32,
/// `make_qkx2_quants` with weights `rms + |x|`, then 6-bit scales and mins under f16 super
/// scales, then the quants recomputed against the rounded scales. Returns (d, dmin, packed
/// scales) and fills `l` with quants in 0..=nmax.
pub(super) fn quantize_scales_k(x: &[f32], nmax: i32, rmin: f32, nstep: i32, l: &mut [u8; 256]) -> ([u8; 2], [u8; 2], [u8; 12]) {
    let mut weights = [0f32; 32];
    let mut mins = [0f32; 8];
    let mut scales = [0f32; 8];
    let (mut max_scale, mut max_min) = (0.0f32, 0.0f32);
    for j in 0..8 {
        let xs = &x[32 * j..32 * j + 32];
        let mut sum_x2 = 0.0f32;
        for v in xs {
            sum_x2 += v * v;
        }
        let av_x = (sum_x2 / 32.0).sqrt();
        for (w, v) in weights.iter_mut().zip(xs) {
            *w = av_x + v.abs();
        }
        let ls = &mut l[32 * j..32 * j + 32];
        let (s, m) = make_qkx2_quants(nmax, xs, &weights, ls, rmin, 0.1, nstep, false);
        scales[j] = s;
        mins[j] = m;
        if s > max_scale {
            max_scale = s;
        }
        if m > max_min {
            max_min = m;
        }
    }
    let inv_scale = if max_scale > 0.0 { 63.0 / max_scale } else { 0.0 };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let (mut ls, mut lm) = ([0u8; 8], [0u8; 8]);
    for j in 0..8 {
        // uint8_t ls = nearest_int(..): truncated to 8 bits, then MIN(63, ..), as in ggml.
        ls[j] = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        lm[j] = (nearest_int(inv_min * mins[j]) as u8).min(63);
    }
    let packed = pack_scale_min_k4(&ls, &lm);
    let d = f16_bytes(max_scale / 63.0);
    let dmin = f16_bytes(max_min / 63.0);
    let (d_all, dmin_all) = (f16_le(d), f16_le(dmin));
    for j in 0..8 {
        let (sc, m) = scale_min_k4(j, &packed);
        let dj = d_all * sc as f32;
        if dj == 0.0 {
            continue;
        }
        let dm = dmin_all * m as f32;
        for ii in 0..32 {
            l[32 * j + ii] = nearest_int((x[32 * j + ii] + dm) / dj).clamp(0, nmax) as u8;
        }
    }
    (d, dmin, packed)
}

// SAFETY: repr(C) byte arrays only: alignment 1, no padding, any bits valid; 144 bytes.
unsafe impl Block for BlockQ4K {
    const TY: GgmlType = GgmlType::Q4_K;
    const LEN: usize = 256;

    fn dequantize(&self, y: &mut [f32]) {
        let d = f16_le(self.d);
        let min = f16_le(self.dmin);
        for (p, (q, y64)) in self.qs.chunks_exact(32).zip(y.chunks_exact_mut(64)).enumerate() {
            let (sc1, m1) = scale_min_k4(2 * p, &self.scales);
            let (sc2, m2) = scale_min_k4(2 * p + 1, &self.scales);
            let (d1, m1) = (d * sc1 as f32, min * m1 as f32);
            let (d2, m2) = (d * sc2 as f32, min * m2 as f32);
            let (lo, hi) = y64.split_at_mut(32);
            for ((qb, a), b) in q.iter().zip(lo.iter_mut()).zip(hi.iter_mut()) {
                *a = d1 * (qb & 0x0f) as f32 - m1;
                *b = d2 * (qb >> 4) as f32 - m2;
            }
        }
    }

    /// quantize_row_q4_K_ref.
    fn quantize(x: &[f32]) -> Self {
        let mut l = [0u8; 256];
        let (d, dmin, scales) = quantize_scales_k(x, 15, -1.0, 20, &mut l);
        let mut qs = [0u8; 128];
        for (p, q) in qs.chunks_exact_mut(32).enumerate() {
            let lp = &l[64 * p..64 * p + 64];
            for (i, qb) in q.iter_mut().enumerate() {
                *qb = lp[i] | (lp[i + 32] << 4);
            }
        }
        BlockQ4K { d, dmin, scales, qs }
    }
}
