//! How a weight matrix's rows lie on the device. Every format keeps its GGUF bytes (nothing is
//! dequantized), and most keep the GGUF order; Q8_0 does not: its 34-byte blocks (an f16
//! scale then 32 int8 quants) leave the quants 2-byte aligned, so a subgroup's lanes, one
//! block each, read them as 9 straddling words that touch every memory line of the span 9
//! times. On the device each Q8_0 row holds its quants first (32 a block, in block order),
//! then its blocks' f16 scales, padded to 16 bytes: a block's quants are two aligned 16-byte
//! loads and neighbouring lanes read neighbouring bytes (`shaders/common/formats.glsl`,
//! `dotfmt.glsl`). Q6_K likewise: its 210-byte blocks (128 bytes of low quant bits, 64 of
//! high bits, 16 scales, then the f16 d) leave every block after the first 2-byte aligned;
//! on the device a row holds each block's first 208 bytes (13 x 16) in block order, then the
//! blocks' d, padded to 16 bytes, so every quant load is an aligned 16-byte one. The same
//! bytes, rearranged once at upload.

use std::borrow::Cow;

use resin_gguf::GgmlType;

/// Bytes of one row of `cols` values of `ty` as the device holds it, given the GGUF row's
/// `gguf_row_bytes`.
pub fn device_row_bytes(ty: GgmlType, cols: usize, gguf_row_bytes: usize) -> usize {
    match ty {
        GgmlType::Q8_0 if whole_blocks(ty, cols) => (cols + cols / 32 * 2).next_multiple_of(16),
        GgmlType::Q6_K if whole_blocks(ty, cols) => (cols / 256 * 210).next_multiple_of(16),
        _ => gguf_row_bytes,
    }
}

/// The rows `data` (whole GGUF rows of `cols` values of `ty`) as the device holds them.
/// `data.len()` must be a multiple of the GGUF row size (the caller's rows).
pub fn device_rows(ty: GgmlType, cols: usize, data: &[u8]) -> Cow<'_, [u8]> {
    match ty {
        GgmlType::Q8_0 if whole_blocks(ty, cols) => Cow::Owned(split_rows(data, cols / 32, 34, 0..2, 2..34)),
        GgmlType::Q6_K if whole_blocks(ty, cols) => Cow::Owned(split_rows(data, cols / 256, 210, 208..210, 0..208)),
        _ => Cow::Borrowed(data),
    }
}

/// Whether rows of `cols` values of `ty` are whole blocks (every GGUF row is).
fn whole_blocks(ty: GgmlType, cols: usize) -> bool {
    cols > 0 && cols.is_multiple_of(ty.block_len())
}

/// Rows of `blocks` blocks of `block` bytes each rearranged as: every block's `body` bytes
/// in block order, then every block's `scale` bytes, then zeros up to a multiple of 16.
fn split_rows(data: &[u8], blocks: usize, block: usize, scale: std::ops::Range<usize>, body: std::ops::Range<usize>) -> Vec<u8> {
    let (src_row, sl, bl) = (blocks * block, scale.len(), body.len());
    let dst_row = (src_row).next_multiple_of(16);
    let rows = data.len() / src_row;
    let mut out = vec![0u8; rows * dst_row];
    for (src, dst) in data.chunks_exact(src_row).zip(out.chunks_exact_mut(dst_row)) {
        let (bodies, rest) = dst.split_at_mut(blocks * bl);
        for (b, blk) in src.chunks_exact(block).enumerate() {
            bodies[b * bl..(b + 1) * bl].copy_from_slice(&blk[body.clone()]);
            rest[b * sl..(b + 1) * sl].copy_from_slice(&blk[scale.clone()]);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q8_0_rows_put_quants_then_scales_padded_to_16() {
        // Two rows of 64 values: blocks (scale bytes s0 s1, quants 32 bytes) numbered apart.
        let block = |row: u8, b: u8| -> Vec<u8> {
            let mut v = vec![0xA0 + row, b];
            v.extend((0..32u8).map(|i| row * 100 + b * 40 + i));
            v
        };
        let data: Vec<u8> = [block(0, 0), block(0, 1), block(1, 0), block(1, 1)].concat();
        assert_eq!(device_row_bytes(GgmlType::Q8_0, 64, 68), 80);
        let dev = device_rows(GgmlType::Q8_0, 64, &data);
        assert_eq!(dev.len(), 160);
        for row in 0..2u8 {
            let r = &dev[row as usize * 80..(row as usize + 1) * 80];
            for b in 0..2u8 {
                for i in 0..32u8 {
                    assert_eq!(r[b as usize * 32 + i as usize], row * 100 + b * 40 + i, "row {row} block {b} quant {i}");
                }
                assert_eq!(&r[64 + 2 * b as usize..66 + 2 * b as usize], &[0xA0 + row, b]);
            }
            assert!(r[68..].iter().all(|&x| x == 0), "padding is zero");
        }
    }

    #[test]
    fn q6_k_rows_put_block_bodies_then_their_d_padded_to_16() {
        // Two rows of 512 values: two 210-byte blocks a row, each byte naming its row, block
        // and place.
        let block = |row: usize, b: usize| -> Vec<u8> { (0..210).map(|i| ((row * 7 + b * 3 + i) % 251) as u8).collect() };
        let data: Vec<u8> = [block(0, 0), block(0, 1), block(1, 0), block(1, 1)].concat();
        assert_eq!(device_row_bytes(GgmlType::Q6_K, 512, 420), 432);
        let dev = device_rows(GgmlType::Q6_K, 512, &data);
        assert_eq!(dev.len(), 864);
        for row in 0..2 {
            let r = &dev[row * 432..(row + 1) * 432];
            for b in 0..2 {
                let want = block(row, b);
                assert_eq!(&r[b * 208..(b + 1) * 208], &want[..208], "row {row} block {b} body");
                assert_eq!(&r[416 + 2 * b..418 + 2 * b], &want[208..], "row {row} block {b} d");
            }
            assert!(r[420..].iter().all(|&x| x == 0), "padding is zero");
        }
    }

    #[test]
    fn other_formats_keep_their_gguf_rows() {
        let data = vec![7u8; 144 * 3];
        assert_eq!(device_row_bytes(GgmlType::Q4_K, 256, 144), 144);
        assert!(matches!(device_rows(GgmlType::Q4_K, 256, &data), Cow::Borrowed(_)));
        assert_eq!(device_rows(GgmlType::Q4_K, 256, &data).as_ref(), &data[..]);
    }
}
