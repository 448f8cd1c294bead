//! F32, F16 and BF16: one value per "block", stored little-endian.
//!
//! F16 and BF16 quantize by rounding to nearest even (ggml's `GGML_FP32_TO_FP16` and
//! `ggml_compute_fp32_to_bf16`; a NaN stays a quiet NaN).

use half::f16;

pub(super) fn f32_to_f32(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(4).zip(dst.iter_mut()) {
        *y = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    }
}

pub(super) fn f16_to_f32(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(2).zip(dst.iter_mut()) {
        *y = f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32();
    }
}

pub(super) fn bf16_to_f32(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(2).zip(dst.iter_mut()) {
        *y = f32::from_bits((u16::from_le_bytes([b[0], b[1]]) as u32) << 16);
    }
}

pub(super) fn f32_from_f32(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.iter().zip(dst.chunks_exact_mut(4)) {
        b.copy_from_slice(&x.to_le_bytes());
    }
}

pub(super) fn f16_from_f32(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.iter().zip(dst.chunks_exact_mut(2)) {
        b.copy_from_slice(&f16::from_f32(*x).to_bits().to_le_bytes());
    }
}

pub(super) fn bf16_from_f32(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.iter().zip(dst.chunks_exact_mut(2)) {
        b.copy_from_slice(&bf16_round(*x).to_le_bytes());
    }
}

/// ggml_compute_fp32_to_bf16: quiet NaNs, otherwise round to nearest even.
fn bf16_round(x: f32) -> u16 {
    let u = x.to_bits();
    if u & 0x7fff_ffff > 0x7f80_0000 {
        return ((u >> 16) | 64) as u16;
    }
    ((u as u64 + (0x7fff + ((u >> 16) & 1)) as u64) >> 16) as u16
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::bf16;

    #[test]
    fn bf16_matches_half_crate() {
        for &x in &[
            0.0f32,
            -0.0,
            1.0,
            f32::from_bits(0x3f80_8000), // halfway, rounds down to even
            f32::from_bits(0x3f81_8000), // halfway, rounds up to even
            3.4e38,
            -7.25e-20,
            f32::INFINITY,
        ] {
            assert_eq!(bf16_round(x), bf16::from_f32(x).to_bits(), "{x}");
        }
        assert!(f32::from_bits((bf16_round(f32::NAN) as u32) << 16).is_nan());
    }
}
