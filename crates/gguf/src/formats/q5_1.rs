//! Q5_1: 32 values as 5-bit quants with an f16 scale and an f16 minimum, x = d * q + m.
//! Bit layout as Q5_0.

use super::{f16_bytes, f16_le, Block};
use crate::GgmlType;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct BlockQ5_1 {
    /// Scale (f16).
    pub d: [u8; 2],
    /// Minimum (f16).
    pub m: [u8; 2],
    /// High bits, a little-endian u32.
    pub qh: [u8; 4],
    pub qs: [u8; 16],
}
const _: () = assert!(std::mem::size_of::<BlockQ5_1>() == 24);

// SAFETY: repr(C) byte arrays only: alignment 1, no padding, any bits valid; 24 bytes.
unsafe impl Block for BlockQ5_1 {
    const TY: GgmlType = GgmlType::Q5_1;
    const LEN: usize = 32;

    fn dequantize(&self, y: &mut [f32]) {
        let d = f16_le(self.d);
        let m = f16_le(self.m);
        let qh = u32::from_le_bytes(self.qh);
        let (lo, hi) = y.split_at_mut(16);
        for (j, ((q, a), b)) in self.qs.iter().zip(lo.iter_mut()).zip(hi.iter_mut()).enumerate() {
            let h0 = ((qh >> j) << 4) & 0x10;
            let h1 = (qh >> (j + 12)) & 0x10;
            *a = ((q & 0x0f) as u32 | h0) as f32 * d + m;
            *b = ((q >> 4) as u32 | h1) as f32 * d + m;
        }
    }

    /// quantize_row_q5_1_ref: [min, max] split into 31 steps.
    fn quantize(x: &[f32]) -> Self {
        let (mut min, mut max) = (f32::MAX, -f32::MAX);
        for &v in x {
            if v < min {
                min = v;
            }
            if v > max {
                max = v;
            }
        }
        let d = (max - min) / 31.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut qs = [0u8; 16];
        let mut qh = 0u32;
        for (j, q) in qs.iter_mut().enumerate() {
            let q0 = ((x[j] - min) * id + 0.5) as u8;
            let q1 = ((x[16 + j] - min) * id + 0.5) as u8;
            *q = (q0 & 0x0f) | ((q1 & 0x0f) << 4);
            qh |= (((q0 & 0x10) >> 4) as u32) << j;
            qh |= (((q1 & 0x10) >> 4) as u32) << (j + 16);
        }
        BlockQ5_1 { d: f16_bytes(d), m: f16_bytes(min), qh: qh.to_le_bytes(), qs }
    }
}
