//! How a weight matrix's rows lie on the device. Every format keeps its GGUF bytes (nothing is
//! dequantized), and most keep the GGUF order; Q8_0 does not: its 34-byte blocks (an f16
//! scale then 32 int8 quants) leave the quants 2-byte aligned, so a subgroup's lanes, one
//! block each, read them as 9 straddling words that touch every memory line of the span 9
//! times. On the device each Q8_0 row holds its quants first (32 a block, in block order),
//! then its blocks' f16 scales, padded to 16 bytes: a block's quants are two aligned 16-byte
//! loads and neighbouring lanes read neighbouring bytes (`shaders/common/formats.glsl`,
//! `dotfmt.glsl`). The same bytes, rearranged once at upload.

use std::borrow::Cow;

use resin_gguf::GgmlType;

/// Bytes of one row of `cols` values of `ty` as the device holds it, given the GGUF row's
/// `gguf_row_bytes`.
pub fn device_row_bytes(ty: GgmlType, cols: usize, gguf_row_bytes: usize) -> usize {
    match ty {
        GgmlType::Q8_0 if q8_0_split(cols) => (cols + cols / 32 * 2).next_multiple_of(16),
        _ => gguf_row_bytes,
    }
}

/// The rows `data` (whole GGUF rows of `cols` values of `ty`) as the device holds them.
/// `data.len()` must be a multiple of the GGUF row size (the caller's rows).
pub fn device_rows(ty: GgmlType, cols: usize, data: &[u8]) -> Cow<'_, [u8]> {
    match ty {
        GgmlType::Q8_0 if q8_0_split(cols) => {
            let blocks = cols / 32;
            let src_row = blocks * 34;
            let dst_row = device_row_bytes(ty, cols, src_row);
            let rows = data.len() / src_row;
            let mut out = vec![0u8; rows * dst_row];
            for (src, dst) in data.chunks_exact(src_row).zip(out.chunks_exact_mut(dst_row)) {
                let (quants, rest) = dst.split_at_mut(cols);
                let scales = &mut rest[..blocks * 2];
                for (b, block) in src.chunks_exact(34).enumerate() {
                    scales[2 * b..2 * b + 2].copy_from_slice(&block[..2]);
                    quants[32 * b..32 * b + 32].copy_from_slice(&block[2..]);
                }
            }
            Cow::Owned(out)
        }
        _ => Cow::Borrowed(data),
    }
}

/// Whether Q8_0 rows of `cols` values take the split layout (whole blocks: every GGUF Q8_0 row).
fn q8_0_split(cols: usize) -> bool {
    cols > 0 && cols.is_multiple_of(32)
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
    fn other_formats_keep_their_gguf_rows() {
        let data = vec![7u8; 144 * 3];
        assert_eq!(device_row_bytes(GgmlType::Q4_K, 256, 144), 144);
        assert!(matches!(device_rows(GgmlType::Q4_K, 256, &data), Cow::Borrowed(_)));
        assert_eq!(device_rows(GgmlType::Q4_K, 256, &data).as_ref(), &data[..]);
    }
}
