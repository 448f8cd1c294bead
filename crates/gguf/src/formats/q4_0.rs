//! Q4_0: 32 values as 4-bit quants around 8 with one f16 scale, x = d * (q - 8).
//! Quants: low nibbles hold values 0..16, high nibbles values 16..32.

use super::{f16_bytes, f16_le, Block};
use crate::GgmlType;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct BlockQ4_0 {
    /// Scale (f16).
    pub d: [u8; 2],
    pub qs: [u8; 16],
}
const _: () = assert!(std::mem::size_of::<BlockQ4_0>() == 18);

// SAFETY: repr(C) byte arrays only: alignment 1, no padding, any bits valid; 18 bytes.
unsafe impl Block for BlockQ4_0 {
    const TY: GgmlType = GgmlType::Q4_0;
    const LEN: usize = 32;

    fn dequantize(&self, y: &mut [f32]) {
        let d = f16_le(self.d);
        let (lo, hi) = y.split_at_mut(16);
        for ((q, a), b) in self.qs.iter().zip(lo.iter_mut()).zip(hi.iter_mut()) {
            *a = ((q & 0x0f) as i32 - 8) as f32 * d;
            *b = ((q >> 4) as i32 - 8) as f32 * d;
        }
    }

    /// quantize_row_q4_0_ref: the value of largest magnitude maps to -8.
    fn quantize(x: &[f32]) -> Self {
        let (mut amax, mut max) = (0.0f32, 0.0f32);
        for &v in x {
            if amax < v.abs() {
                amax = v.abs();
                max = v;
            }
        }
        let d = max / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut qs = [0u8; 16];
        for (j, q) in qs.iter_mut().enumerate() {
            let q0 = ((x[j] * id + 8.5) as i8).min(15) as u8;
            let q1 = ((x[16 + j] * id + 8.5) as i8).min(15) as u8;
            *q = q0 | (q1 << 4);
        }
        BlockQ4_0 { d: f16_bytes(d), qs }
    }
}
