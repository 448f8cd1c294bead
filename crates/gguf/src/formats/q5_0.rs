//! Q5_0: 32 values as 5-bit quants around 16 with one f16 scale, x = d * (q - 16).
//! Low 4 bits as in Q4_0; bit 4 of value j is bit j of the little-endian u32 `qh`.

use super::{f16_bytes, f16_le, Block};
use crate::GgmlType;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct BlockQ5_0 {
    /// Scale (f16).
    pub d: [u8; 2],
    /// High bits, a little-endian u32.
    pub qh: [u8; 4],
    pub qs: [u8; 16],
}
const _: () = assert!(std::mem::size_of::<BlockQ5_0>() == 22);

// SAFETY: repr(C) byte arrays only: alignment 1, no padding, any bits valid; 22 bytes.
unsafe impl Block for BlockQ5_0 {
    const TY: GgmlType = GgmlType::Q5_0;
    const LEN: usize = 32;

    fn dequantize(&self, y: &mut [f32]) {
        let d = f16_le(self.d);
        let qh = u32::from_le_bytes(self.qh);
        let (lo, hi) = y.split_at_mut(16);
        for (j, ((q, a), b)) in self.qs.iter().zip(lo.iter_mut()).zip(hi.iter_mut()).enumerate() {
            let h0 = ((qh >> j) << 4) & 0x10;
            let h1 = (qh >> (j + 12)) & 0x10;
            *a = (((q & 0x0f) as u32 | h0) as i32 - 16) as f32 * d;
            *b = (((q >> 4) as u32 | h1) as i32 - 16) as f32 * d;
        }
    }

    /// quantize_row_q5_0_ref: the value of largest magnitude maps to -16.
    fn quantize(x: &[f32]) -> Self {
        let (mut amax, mut max) = (0.0f32, 0.0f32);
        for &v in x {
            if amax < v.abs() {
                amax = v.abs();
                max = v;
            }
        }
        let d = max / -16.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut qs = [0u8; 16];
        let mut qh = 0u32;
        for (j, q) in qs.iter_mut().enumerate() {
            let q0 = ((x[j] * id + 16.5) as i8).min(31) as u8;
            let q1 = ((x[16 + j] * id + 16.5) as i8).min(31) as u8;
            *q = (q0 & 0x0f) | ((q1 & 0x0f) << 4);
            qh |= (((q0 & 0x10) >> 4) as u32) << j;
            qh |= (((q1 & 0x10) >> 4) as u32) << (j + 16);
        }
        BlockQ5_0 { d: f16_bytes(d), qh: qh.to_le_bytes(), qs }
    }
}
