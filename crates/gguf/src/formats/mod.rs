//! ggml block formats: reference dequantization and quantization, one file per format family.
//!
//! Each quantized format is a `#[repr(C)]` block struct whose fields are all byte arrays
//! (alignment 1, every bit pattern valid), so a byte buffer is viewed as a slice of blocks
//! without copying. The quantizers are the ggml reference ones (`quantize_row_*_ref` in
//! ggml-quants.c, no importance matrix) and reproduce their bytes exactly; the dequantizers
//! follow `dequantize_row_*` operation for operation, so results are bit-identical to ggml's.
//!
//! `float.rs`: F32, F16, BF16. `q4_0.rs` .. `q8_0.rs`: the 32-value formats (Q8_1 with Q8_0).
//! `q2_k.rs` .. `q6_k.rs`: the 256-value K-quants (Q8_K with Q6_K); `kquant.rs`: their shared
//! scale searches (`make_qkx2_quants`, `make_q3_quants`, `make_qx_quants`).

mod float;
mod kquant;
mod q2_k;
mod q3_k;
mod q4_0;
mod q4_1;
mod q4_k;
mod q5_0;
mod q5_1;
mod q5_k;
mod q6_k;
mod q8_0;

pub use q2_k::BlockQ2K;
pub use q3_k::BlockQ3K;
pub use q4_0::BlockQ4_0;
pub use q4_1::BlockQ4_1;
pub use q4_k::BlockQ4K;
pub use q5_0::BlockQ5_0;
pub use q5_1::BlockQ5_1;
pub use q5_k::BlockQ5K;
pub use q6_k::{BlockQ6K, BlockQ8K};
pub use q8_0::{BlockQ8_0, BlockQ8_1};

use crate::{GgmlType, GgufError, Result};

/// A quantized block: the bytes of one block of `TY` and its reference codec.
///
/// # Safety
/// Implementors are `#[repr(C)]`, have alignment 1, no padding, every bit pattern valid, and
/// `size_of::<Self>() == TY.block_bytes()` (checked by a test), so `&[u8]` of whole blocks can
/// be viewed as `&[Self]`.
pub unsafe trait Block: Copy + 'static {
    const TY: GgmlType;
    /// Values per block.
    const LEN: usize;
    /// Writes the block's `LEN` values into `y` (`y.len() == LEN`).
    fn dequantize(&self, y: &mut [f32]);
    /// Quantizes `x` (`x.len() == LEN`) with the ggml reference quantizer.
    fn quantize(x: &[f32]) -> Self;
}

/// Views bytes as blocks without copying; None unless `bytes` is whole blocks.
pub fn as_blocks<B: Block>(bytes: &[u8]) -> Option<&[B]> {
    let size = std::mem::size_of::<B>();
    if !bytes.len().is_multiple_of(size) {
        return None;
    }
    // SAFETY: B has alignment 1, no padding and every bit pattern is valid (trait contract);
    // the length covers exactly len / size blocks.
    Some(unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast::<B>(), bytes.len() / size) })
}

/// Mutable form of [`as_blocks`].
pub fn as_blocks_mut<B: Block>(bytes: &mut [u8]) -> Option<&mut [B]> {
    let size = std::mem::size_of::<B>();
    if !bytes.len().is_multiple_of(size) {
        return None;
    }
    // SAFETY: as in as_blocks; the borrow is unique.
    Some(unsafe { std::slice::from_raw_parts_mut(bytes.as_mut_ptr().cast::<B>(), bytes.len() / size) })
}

/// Checks that `n` values are whole blocks of `ty` stored in `bytes` bytes.
fn check(ty: GgmlType, n: usize, bytes: usize) -> Result<()> {
    let bl = ty.block_len();
    if !n.is_multiple_of(bl) {
        return Err(GgufError::PartialBlock { ty, len: n, block: bl });
    }
    let expected = n / bl * ty.block_bytes();
    if bytes != expected {
        return Err(GgufError::WrongByteLength { ty, got: bytes, expected });
    }
    Ok(())
}

/// `src` holds exactly `dst.len() / B::LEN` blocks (checked by the caller).
fn dequantize_blocks<B: Block>(src: &[u8], dst: &mut [f32]) {
    let blocks = as_blocks::<B>(src).unwrap_or_default();
    for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(B::LEN)) {
        b.dequantize(y);
    }
}

/// `dst` holds exactly `src.len() / B::LEN` blocks (checked by the caller).
fn quantize_blocks<B: Block>(src: &[f32], dst: &mut [u8]) {
    let blocks = as_blocks_mut::<B>(dst).unwrap_or_default();
    for (b, x) in blocks.iter_mut().zip(src.chunks_exact(B::LEN)) {
        *b = B::quantize(x);
    }
}

/// Dequantize `src` (whole blocks of `ty`) into `dst` (`dst.len()` values).
pub fn dequantize(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<()> {
    check(ty, dst.len(), src.len())?;
    use GgmlType::*;
    match ty {
        F32 => float::f32_to_f32(src, dst),
        F16 => float::f16_to_f32(src, dst),
        BF16 => float::bf16_to_f32(src, dst),
        Q4_0 => dequantize_blocks::<BlockQ4_0>(src, dst),
        Q4_1 => dequantize_blocks::<BlockQ4_1>(src, dst),
        Q5_0 => dequantize_blocks::<BlockQ5_0>(src, dst),
        Q5_1 => dequantize_blocks::<BlockQ5_1>(src, dst),
        Q8_0 => dequantize_blocks::<BlockQ8_0>(src, dst),
        Q8_1 => dequantize_blocks::<BlockQ8_1>(src, dst),
        Q2_K => dequantize_blocks::<BlockQ2K>(src, dst),
        Q3_K => dequantize_blocks::<BlockQ3K>(src, dst),
        Q4_K => dequantize_blocks::<BlockQ4K>(src, dst),
        Q5_K => dequantize_blocks::<BlockQ5K>(src, dst),
        Q6_K => dequantize_blocks::<BlockQ6K>(src, dst),
        Q8_K => dequantize_blocks::<BlockQ8K>(src, dst),
    }
    Ok(())
}

/// Quantize `src` (length a multiple of the block length) into a new byte vector.
pub fn quantize(ty: GgmlType, src: &[f32]) -> Result<Vec<u8>> {
    let bl = ty.block_len();
    if !src.len().is_multiple_of(bl) {
        return Err(GgufError::PartialBlock { ty, len: src.len(), block: bl });
    }
    let mut out = vec![0u8; src.len() / bl * ty.block_bytes()];
    quantize_into(ty, src, &mut out)?;
    Ok(out)
}

/// Quantize `src` into `dst`, which must be exactly the quantized size.
pub fn quantize_into(ty: GgmlType, src: &[f32], dst: &mut [u8]) -> Result<()> {
    check(ty, src.len(), dst.len())?;
    use GgmlType::*;
    match ty {
        F32 => float::f32_from_f32(src, dst),
        F16 => float::f16_from_f32(src, dst),
        BF16 => float::bf16_from_f32(src, dst),
        Q4_0 => quantize_blocks::<BlockQ4_0>(src, dst),
        Q4_1 => quantize_blocks::<BlockQ4_1>(src, dst),
        Q5_0 => quantize_blocks::<BlockQ5_0>(src, dst),
        Q5_1 => quantize_blocks::<BlockQ5_1>(src, dst),
        Q8_0 => quantize_blocks::<BlockQ8_0>(src, dst),
        Q8_1 => quantize_blocks::<BlockQ8_1>(src, dst),
        Q2_K => quantize_blocks::<BlockQ2K>(src, dst),
        Q3_K => quantize_blocks::<BlockQ3K>(src, dst),
        Q4_K => quantize_blocks::<BlockQ4K>(src, dst),
        Q5_K => quantize_blocks::<BlockQ5K>(src, dst),
        Q6_K => quantize_blocks::<BlockQ6K>(src, dst),
        Q8_K => quantize_blocks::<BlockQ8K>(src, dst),
    }
    Ok(())
}

/// Whether [`quantize`] supports `ty` (every format resin knows today).
pub fn can_quantize(ty: GgmlType) -> bool {
    GgmlType::ALL.contains(&ty)
}

/// An f16 stored as two little-endian bytes.
#[inline]
pub(crate) fn f16_le(b: [u8; 2]) -> f32 {
    half::f16::from_bits(u16::from_le_bytes(b)).to_f32()
}

/// f32 -> f16 (round to nearest even, as GGML_FP32_TO_FP16) as two little-endian bytes.
#[inline]
pub(crate) fn f16_bytes(v: f32) -> [u8; 2] {
    half::f16::from_f32(v).to_bits().to_le_bytes()
}

/// ggml's `nearest_int`: round half to even through the 1.5 * 2^23 trick (valid for
/// |v| <= 4194303; outside that it returns garbage like ggml does, never panics).
#[inline]
pub(crate) fn nearest_int(v: f32) -> i32 {
    let val = v + 12_582_912.0f32;
    (val.to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}

#[cfg(test)]
mod tests {
    use super::*;

    fn size_ok<B: Block>() {
        assert_eq!(std::mem::size_of::<B>(), B::TY.block_bytes(), "{:?}", B::TY);
        assert_eq!(std::mem::align_of::<B>(), 1, "{:?}", B::TY);
        assert_eq!(B::LEN, B::TY.block_len(), "{:?}", B::TY);
    }

    #[test]
    fn block_sizes_match_types() {
        size_ok::<BlockQ4_0>();
        size_ok::<BlockQ4_1>();
        size_ok::<BlockQ5_0>();
        size_ok::<BlockQ5_1>();
        size_ok::<BlockQ8_0>();
        size_ok::<BlockQ8_1>();
        size_ok::<BlockQ2K>();
        size_ok::<BlockQ3K>();
        size_ok::<BlockQ4K>();
        size_ok::<BlockQ5K>();
        size_ok::<BlockQ6K>();
        size_ok::<BlockQ8K>();
    }

    #[test]
    fn nearest_int_rounds_half_even() {
        assert_eq!(nearest_int(0.5), 0);
        assert_eq!(nearest_int(1.5), 2);
        assert_eq!(nearest_int(-2.5), -2);
        assert_eq!(nearest_int(-3.7), -4);
        assert_eq!(nearest_int(7.49), 7);
    }
}
