//! Q5_K: as Q4_K with a fifth bit per quant: bit 2p of `qh[i]` is the high bit of value i of
//! the 64-value pair p's first sub-block, bit 2p+1 that of its second (x = d * sc * q - dmin * m).

use super::kquant::scale_min_k4;
use super::q4_k::quantize_scales_k;
use super::{f16_le, Block};
use crate::GgmlType;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct BlockQ5K {
    /// Super-block scale for the scales (f16).
    pub d: [u8; 2],
    /// Super-block scale for the mins (f16).
    pub dmin: [u8; 2],
    /// Eight 6-bit scales and eight 6-bit mins, packed.
    pub scales: [u8; 12],
    /// High bits of the quants.
    pub qh: [u8; 32],
    /// Low 4 bits of the quants.
    pub qs: [u8; 128],
}
const _: () = assert!(std::mem::size_of::<BlockQ5K>() == 176);

// SAFETY: repr(C) byte arrays only: alignment 1, no padding, any bits valid; 176 bytes.
unsafe impl Block for BlockQ5K {
    const TY: GgmlType = GgmlType::Q5_K;
    const LEN: usize = 256;

    fn dequantize(&self, y: &mut [f32]) {
        let d = f16_le(self.d);
        let min = f16_le(self.dmin);
        for (p, (ql, y64)) in self.qs.chunks_exact(32).zip(y.chunks_exact_mut(64)).enumerate() {
            let (sc1, m1) = scale_min_k4(2 * p, &self.scales);
            let (sc2, m2) = scale_min_k4(2 * p + 1, &self.scales);
            let (d1, m1) = (d * sc1 as f32, min * m1 as f32);
            let (d2, m2) = (d * sc2 as f32, min * m2 as f32);
            let (u1, u2) = (1u8 << (2 * p), 2u8 << (2 * p));
            let (lo, hi) = y64.split_at_mut(32);
            for (((qb, hb), a), b) in ql.iter().zip(&self.qh).zip(lo.iter_mut()).zip(hi.iter_mut()) {
                let h1 = if hb & u1 != 0 { 16 } else { 0 };
                let h2 = if hb & u2 != 0 { 16 } else { 0 };
                *a = d1 * ((qb & 0x0f) + h1) as f32 - m1;
                *b = d2 * ((qb >> 4) + h2) as f32 - m2;
            }
        }
    }

    /// quantize_row_q5_K_ref.
    fn quantize(x: &[f32]) -> Self {
        let mut l = [0u8; 256];
        let (d, dmin, scales) = quantize_scales_k(x, 31, -0.5, 15, &mut l);
        let mut b = BlockQ5K { d, dmin, scales, qh: [0; 32], qs: [0; 128] };
        for (p, ql) in b.qs.chunks_exact_mut(32).enumerate() {
            let (m1, m2) = (1u8 << (2 * p), 2u8 << (2 * p));
            let lp = &l[64 * p..64 * p + 64];
            for j in 0..32 {
                let (mut l1, mut l2) = (lp[j], lp[j + 32]);
                if l1 > 15 {
                    l1 -= 16;
                    b.qh[j] |= m1;
                }
                if l2 > 15 {
                    l2 -= 16;
                    b.qh[j] |= m2;
                }
                ql[j] = l1 | (l2 << 4);
            }
        }
        b
    }
}
