//! ggml block formats: reference dequantization and quantization, one file per format.
//!
//! (Filled in by the formats work: see the module docs of each file.)

use crate::{GgmlType, GgufError, Result};

/// Dequantize `src` (whole blocks of `ty`) into `dst` (`dst.len()` values).
pub fn dequantize(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<()> {
    let bl = ty.block_len();
    if dst.len() % bl != 0 {
        return Err(GgufError::PartialBlock { ty, len: dst.len(), block: bl });
    }
    let expected = dst.len() / bl * ty.block_bytes();
    if src.len() != expected {
        return Err(GgufError::WrongByteLength { ty, got: src.len(), expected });
    }
    todo!("formats")
}
