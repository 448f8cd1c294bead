//! Q3_K: 256 values in 16 sub-blocks of 16; 3-bit signed quants, x = d * (sc - 32) * (q - 4),
//! with a 6-bit scale per sub-block. The low 2 bits of q are packed like Q2_K; the high bit of
//! value i is bit i/32 of `hmask[i % 32]`. Scale j: low 4 bits in `scales[j % 8]` (low nibble
//! for j < 8, high nibble after), high 2 bits in `scales[8 + j % 4]` at bit 2 * (j / 4).

use super::kquant::make_q3_quants;
use super::{f16_bytes, f16_le, nearest_int, Block};
use crate::GgmlType;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct BlockQ3K {
    /// High bit of each quant.
    pub hmask: [u8; 32],
    /// Low 2 bits of each quant.
    pub qs: [u8; 64],
    /// Sixteen 6-bit scales, packed.
    pub scales: [u8; 12],
    /// Super-block scale (f16).
    pub d: [u8; 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ3K>() == 110);

/// The 6-bit scale of sub-block `j` (0..16), still offset by 32.
#[inline]
fn scale(s: &[u8; 12], j: usize) -> i32 {
    let lo = if j < 8 { s[j] & 0x0f } else { s[j - 8] >> 4 };
    (lo | (((s[8 + j % 4] >> (2 * (j / 4))) & 3) << 4)) as i32
}

// SAFETY: repr(C) byte arrays only: alignment 1, no padding, any bits valid; 110 bytes.
unsafe impl Block for BlockQ3K {
    const TY: GgmlType = GgmlType::Q3_K;
    const LEN: usize = 256;

    fn dequantize(&self, y: &mut [f32]) {
        let d_all = f16_le(self.d);
        let mut is = 0;
        let mut m = 1u8;
        for (q, yh) in self.qs.chunks_exact(32).zip(y.chunks_exact_mut(128)) {
            for (j, y32) in yh.chunks_exact_mut(32).enumerate() {
                let shift = 2 * j;
                for (k, y16) in y32.chunks_exact_mut(16).enumerate() {
                    let dl = d_all * (scale(&self.scales, is) - 32) as f32;
                    is += 1;
                    let (qk, hk) = (&q[16 * k..16 * k + 16], &self.hmask[16 * k..16 * k + 16]);
                    for ((v, qb), hb) in y16.iter_mut().zip(qk).zip(hk) {
                        let lo = ((qb >> shift) & 3) as i32;
                        let hi = if hb & m != 0 { 0 } else { 4 };
                        *v = dl * (lo - hi) as f32;
                    }
                }
                m <<= 1;
            }
        }
    }

    /// quantize_row_q3_K_ref.
    fn quantize(x: &[f32]) -> Self {
        let mut l = [0i8; 256];
        let mut scales = [0f32; 16];
        let (mut max_scale, mut amax) = (0.0f32, 0.0f32);
        for j in 0..16 {
            scales[j] = make_q3_quants(4, &x[16 * j..16 * j + 16], &mut l[16 * j..16 * j + 16]);
            let s = scales[j].abs();
            if s > amax {
                amax = s;
                max_scale = scales[j];
            }
        }
        let mut b = BlockQ3K { hmask: [0; 32], qs: [0; 64], scales: [0; 12], d: [0; 2] };
        if max_scale != 0.0 {
            let iscale = -32.0 / max_scale;
            for (j, s) in scales.iter().enumerate() {
                // int8_t l = nearest_int(..): truncated to 8 bits before the clamp, as in ggml.
                let q = ((nearest_int(iscale * s) as i8).clamp(-32, 31) + 32) as u8;
                if j < 8 {
                    b.scales[j] = q & 0x0f;
                } else {
                    b.scales[j - 8] |= (q & 0x0f) << 4;
                }
                b.scales[j % 4 + 8] |= (q >> 4) << (2 * (j / 4));
            }
            b.d = f16_bytes(1.0 / iscale);
        } else {
            b.d = f16_bytes(0.0);
        }
        let d_all = f16_le(b.d);
        for j in 0..16 {
            let d = d_all * (scale(&b.scales, j) - 32) as f32;
            if d == 0.0 {
                continue;
            }
            for ii in 0..16 {
                l[16 * j + ii] = (nearest_int(x[16 * j + ii] / d).clamp(-4, 3) + 4) as i8;
            }
        }
        for (j, lj) in l.iter_mut().enumerate() {
            if *lj > 3 {
                b.hmask[j % 32] |= 1 << (j / 32);
                *lj -= 4;
            }
        }
        for h in 0..2 {
            let (lh, qh) = (&l[128 * h..128 * h + 128], &mut b.qs[32 * h..32 * h + 32]);
            for (i, q) in qh.iter_mut().enumerate() {
                let v = |k: usize| lh[i + 32 * k] as u8;
                *q = v(0) | (v(1) << 2) | (v(2) << 4) | (v(3) << 6);
            }
        }
        b
    }
}
