//! A model cut to its first transformer blocks: the same metadata, tokenizer and tensors, with
//! `blk.N.*` kept only for N below the cut. Tests whose subject is the engine rather than the
//! model (rows together equal rows alone, window chains, snapshots) run on such a cut of a
//! real model: real weights and vocabulary, a fraction of the compute.

use std::io::Write;

use crate::{GgufError, GgufFile, GgufWriter, Result, Value};

/// Write `src` with only its first `blocks` transformer blocks to `out`: `{arch}.block_count`
/// says `blocks`, every `blk.N.` tensor with N >= `blocks` is left out, everything else is
/// copied byte for byte in the source's order.
pub fn write_first_blocks<W: Write>(src: &GgufFile, blocks: usize, out: &mut W) -> Result<()> {
    let missing = |key: &str| GgufError::BadMetadata { key: key.to_string(), problem: "missing".into() };
    let arch = src.get_str("general.architecture")?.ok_or_else(|| missing("general.architecture"))?.to_string();
    let key = format!("{arch}.block_count");
    let have = src.get_u64(&key)?.ok_or_else(|| missing(&key))?;
    if blocks == 0 || blocks as u64 > have {
        return Err(GgufError::BadMetadata { key, problem: format!("cannot keep {blocks} of {have} blocks") });
    }
    let mut w = GgufWriter::new();
    for (k, v) in src.metadata() {
        w.set(k.clone(), v.clone());
    }
    w.set(key, Value::U32(blocks as u32));
    let kept: Vec<_> = src.tensors().iter().filter(|t| block_of(&t.name).is_none_or(|n| n < blocks)).collect();
    for t in &kept {
        w.add_tensor(t.name.clone(), &t.dims, t.ty)?;
    }
    w.write(out, |i, dst| dst.write_all(src.tensor_data(kept[i]))).map_err(|source| GgufError::Io { path: "the cut model".into(), source })
}

/// N of a `blk.N.` tensor name.
fn block_of(name: &str) -> Option<usize> {
    name.strip_prefix("blk.")?.split('.').next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::GgmlType;

    fn model(blocks: u32) -> GgufFile {
        let mut w = GgufWriter::new();
        w.set("general.architecture", Value::String("llama".into()));
        w.set("llama.block_count", Value::U32(blocks));
        w.set("tokenizer.ggml.model", Value::String("gpt2".into()));
        let mut data: Vec<Vec<u8>> = Vec::new();
        w.add_tensor("token_embd.weight", &[4, 2], GgmlType::F32).unwrap();
        data.push((0..8u8).flat_map(|i| (i as f32).to_le_bytes()).collect());
        for b in 0..blocks {
            w.add_tensor(format!("blk.{b}.attn_norm.weight"), &[4], GgmlType::F32).unwrap();
            data.push((0..4).flat_map(|i| (b as f32 * 10.0 + i as f32).to_le_bytes()).collect());
        }
        w.add_tensor("output_norm.weight", &[4], GgmlType::F32).unwrap();
        data.push([1.0f32; 4].iter().flat_map(|x| x.to_le_bytes()).collect());
        let refs: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
        GgufFile::from_bytes(w.write_all_to_vec(&refs).unwrap()).unwrap()
    }

    #[test]
    fn keeps_the_first_blocks_and_everything_else() {
        let src = model(12);
        let mut out = Vec::new();
        write_first_blocks(&src, 3, &mut out).unwrap();
        let cut = GgufFile::from_bytes(out).unwrap();
        assert_eq!(cut.get_u64("llama.block_count").unwrap(), Some(3));
        assert_eq!(cut.get_str("tokenizer.ggml.model").unwrap(), Some("gpt2"));
        let names: Vec<&str> = cut.tensors().iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["token_embd.weight", "blk.0.attn_norm.weight", "blk.1.attn_norm.weight", "blk.2.attn_norm.weight", "output_norm.weight"]);
        for t in cut.tensors() {
            assert_eq!(cut.tensor_data(t), src.tensor_data(src.tensor(&t.name).unwrap()), "{}", t.name);
        }
        // blk.10 and blk.11 are not blk.1: the block number is the whole field.
        assert!(cut.tensor("blk.10.attn_norm.weight").is_none());
    }

    #[test]
    fn refuses_a_cut_the_model_cannot_give() {
        let src = model(2);
        for blocks in [0, 3] {
            assert!(write_first_blocks(&src, blocks, &mut Vec::new()).is_err(), "{blocks} blocks of 2");
        }
    }
}
