//! Q4_1: 32 values as 4-bit quants with an f16 scale and an f16 minimum, x = d * q + m.

use super::{f16_bytes, f16_le, Block};
use crate::GgmlType;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct BlockQ4_1 {
    /// Scale (f16).
    pub d: [u8; 2],
    /// Minimum (f16).
    pub m: [u8; 2],
    pub qs: [u8; 16],
}
const _: () = assert!(std::mem::size_of::<BlockQ4_1>() == 20);

// SAFETY: repr(C) byte arrays only: alignment 1, no padding, any bits valid; 20 bytes.
unsafe impl Block for BlockQ4_1 {
    const TY: GgmlType = GgmlType::Q4_1;
    const LEN: usize = 32;

    fn dequantize(&self, y: &mut [f32]) {
        let d = f16_le(self.d);
        let m = f16_le(self.m);
        let (lo, hi) = y.split_at_mut(16);
        for ((q, a), b) in self.qs.iter().zip(lo.iter_mut()).zip(hi.iter_mut()) {
            *a = (q & 0x0f) as f32 * d + m;
            *b = (q >> 4) as f32 * d + m;
        }
    }

    /// quantize_row_q4_1_ref: [min, max] split into 15 steps.
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
        let d = (max - min) / 15.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut qs = [0u8; 16];
        for (j, q) in qs.iter_mut().enumerate() {
            let q0 = (((x[j] - min) * id + 0.5) as i8).min(15) as u8;
            let q1 = (((x[16 + j] - min) * id + 0.5) as i8).min(15) as u8;
            *q = q0 | (q1 << 4);
        }
        BlockQ4_1 { d: f16_bytes(d), m: f16_bytes(min), qs }
    }
}
