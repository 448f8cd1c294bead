//! Q2_K: 256 values in 16 sub-blocks of 16; 2-bit quants, x = d * sc * q - dmin * m, with a
//! 4-bit scale `sc` and 4-bit min `m` per sub-block (low / high nibble of `scales`).
//! `qs` byte l of each 32-byte half holds values l, l+32, l+64, l+96 of that 128 (2 bits each).

use super::kquant::make_qkx2_quants;
use super::{f16_bytes, f16_le, nearest_int, Block};
use crate::GgmlType;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct BlockQ2K {
    /// Per sub-block scale (low nibble) and min (high nibble).
    pub scales: [u8; 16],
    pub qs: [u8; 64],
    /// Super-block scale for the scales (f16).
    pub d: [u8; 2],
    /// Super-block scale for the mins (f16).
    pub dmin: [u8; 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ2K>() == 84);

// SAFETY: repr(C) byte arrays only: alignment 1, no padding, any bits valid; 84 bytes.
unsafe impl Block for BlockQ2K {
    const TY: GgmlType = GgmlType::Q2_K;
    const LEN: usize = 256;

    fn dequantize(&self, y: &mut [f32]) {
        let d = f16_le(self.d);
        let min = f16_le(self.dmin);
        let mut is = 0;
        for (q, yh) in self.qs.chunks_exact(32).zip(y.chunks_exact_mut(128)) {
            for (j, y32) in yh.chunks_exact_mut(32).enumerate() {
                let shift = 2 * j;
                for (k, y16) in y32.chunks_exact_mut(16).enumerate() {
                    let sc = self.scales[is];
                    is += 1;
                    let dl = d * (sc & 0x0f) as f32;
                    let ml = min * (sc >> 4) as f32;
                    for (v, qb) in y16.iter_mut().zip(&q[16 * k..16 * k + 16]) {
                        *v = dl * ((qb >> shift) & 3) as f32 - ml;
                    }
                }
            }
        }
    }

    /// quantize_row_q2_K_ref.
    fn quantize(x: &[f32]) -> Self {
        const Q4SCALE: f32 = 15.0;
        let mut l = [0u8; 256];
        let mut weights = [0f32; 16];
        let mut mins = [0f32; 16];
        let mut scales = [0f32; 16];
        let (mut max_scale, mut max_min) = (0.0f32, 0.0f32);
        for j in 0..16 {
            let xs = &x[16 * j..16 * j + 16];
            for (w, v) in weights.iter_mut().zip(xs) {
                *w = v.abs();
            }
            let (s, m) = make_qkx2_quants(3, xs, &weights, &mut l[16 * j..16 * j + 16], -0.5, 0.1, 15, true);
            scales[j] = s;
            mins[j] = m;
            if s > max_scale {
                max_scale = s;
            }
            if m > max_min {
                max_min = m;
            }
        }
        let mut b = BlockQ2K { scales: [0; 16], qs: [0; 64], d: [0; 2], dmin: [0; 2] };
        if max_scale > 0.0 {
            let iscale = Q4SCALE / max_scale;
            for (sc, s) in b.scales.iter_mut().zip(&scales) {
                *sc = nearest_int(iscale * s) as u8;
            }
            b.d = f16_bytes(max_scale / Q4SCALE);
        } else {
            b.d = f16_bytes(0.0);
        }
        if max_min > 0.0 {
            let iscale = Q4SCALE / max_min;
            for (sc, m) in b.scales.iter_mut().zip(&mins) {
                *sc |= (nearest_int(iscale * m) << 4) as u8;
            }
            b.dmin = f16_bytes(max_min / Q4SCALE);
        } else {
            b.dmin = f16_bytes(0.0);
        }
        let (d_all, dmin_all) = (f16_le(b.d), f16_le(b.dmin));
        for j in 0..16 {
            let d = d_all * (b.scales[j] & 0x0f) as f32;
            if d == 0.0 {
                continue;
            }
            let dm = dmin_all * (b.scales[j] >> 4) as f32;
            for ii in 0..16 {
                l[16 * j + ii] = nearest_int((x[16 * j + ii] + dm) / d).clamp(0, 3) as u8;
            }
        }
        for h in 0..2 {
            let (lh, qh) = (&l[128 * h..128 * h + 128], &mut b.qs[32 * h..32 * h + 32]);
            for (i, q) in qh.iter_mut().enumerate() {
                *q = lh[i] | (lh[i + 32] << 2) | (lh[i + 64] << 4) | (lh[i + 96] << 6);
            }
        }
        b
    }
}
