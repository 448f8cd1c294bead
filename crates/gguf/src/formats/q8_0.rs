//! Q8_0 and Q8_1: 32 values as signed 8-bit quants with one f16 scale, x = d * q.
//! Q8_1 also stores `s = d * sum(q)` (f16), used by dot products; dequantization ignores it.

use super::{f16_bytes, f16_le, Block};
use crate::GgmlType;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct BlockQ8_0 {
    /// Scale (f16).
    pub d: [u8; 2],
    pub qs: [i8; 32],
}
const _: () = assert!(std::mem::size_of::<BlockQ8_0>() == 34);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct BlockQ8_1 {
    /// Scale (f16).
    pub d: [u8; 2],
    /// d * sum(qs) (f16).
    pub s: [u8; 2],
    pub qs: [i8; 32],
}
const _: () = assert!(std::mem::size_of::<BlockQ8_1>() == 36);

/// The shared part of quantize_row_q8_0_ref / q8_1_ref: scale and rounded quants.
#[inline]
fn q8(x: &[f32]) -> (f32, [i8; 32]) {
    // MAX(amax, fabsf(v)) as ggml writes it.
    let amax = x.iter().fold(0.0f32, |a, v| if a > v.abs() { a } else { v.abs() });
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut qs = [0i8; 32];
    for (q, v) in qs.iter_mut().zip(x) {
        // roundf: half away from zero, as f32::round.
        *q = (v * id).round() as i8;
    }
    (d, qs)
}

#[inline]
fn dequant(d: f32, qs: &[i8; 32], y: &mut [f32]) {
    for (v, q) in y.iter_mut().zip(qs) {
        *v = *q as f32 * d;
    }
}

// SAFETY: repr(C) byte arrays only: alignment 1, no padding, any bits valid; 34 bytes.
unsafe impl Block for BlockQ8_0 {
    const TY: GgmlType = GgmlType::Q8_0;
    const LEN: usize = 32;

    fn dequantize(&self, y: &mut [f32]) {
        dequant(f16_le(self.d), &self.qs, y);
    }

    fn quantize(x: &[f32]) -> Self {
        let (d, qs) = q8(x);
        BlockQ8_0 { d: f16_bytes(d), qs }
    }
}

// SAFETY: repr(C) byte arrays only: alignment 1, no padding, any bits valid; 36 bytes.
unsafe impl Block for BlockQ8_1 {
    const TY: GgmlType = GgmlType::Q8_1;
    const LEN: usize = 32;

    fn dequantize(&self, y: &mut [f32]) {
        dequant(f16_le(self.d), &self.qs, y);
    }

    fn quantize(x: &[f32]) -> Self {
        let (d, qs) = q8(x);
        let sum: i32 = qs.iter().map(|&q| q as i32).sum();
        BlockQ8_1 { d: f16_bytes(d), s: f16_bytes(sum as f32 * d), qs }
    }
}
