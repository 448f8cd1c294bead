//! Helpers shared by the mixture-of-experts tests (moe.rs on the CPU home, moe_vulkan.rs on the
//! Vulkan home): `resin synth`'s tiny files, deterministic tokens, and the check that a row
//! reads only the experts it chose.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use resin::synth::{synth, SynthShape, SynthType, SynthVocab};
use resin_core::{Logits, RegionId, Segment};
use resin_gguf::{GgmlType, GgufFile};

/// The seed the fixtures were written from.
pub const SEED: u64 = 1;

/// A fresh folder under the system's temporary one, named for this test binary, the process
/// and `tag`.
pub fn tmp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("resin-{}-test-{}-{tag}", env!("CARGO_CRATE_NAME"), std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// `shape` in `ty` with the byte-level vocabulary from [`SEED`], written in `dir` once.
pub fn synth_file(dir: &Path, shape: SynthShape, ty: SynthType) -> PathBuf {
    let out = dir.join(format!("{shape}-{ty}.gguf"));
    if !out.exists() {
        synth(shape, ty, SynthVocab::ByteLevel, &out, SEED, false).unwrap();
    }
    out
}

/// Index of the largest logit (the first on ties), as greedy sampling picks it.
pub fn argmax(v: &[f32]) -> u32 {
    (0..v.len()).fold(0, |b, i| if v[i] > v[b] { i } else { b }) as u32
}

pub fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Deterministic byte tokens.
pub fn tokens(n: usize, salt: u32) -> Vec<u32> {
    (0..n as u32).map(|i| (i * 97 + salt * 31 + 5) % 256).collect()
}

/// One expert of layer 0 made NaN (its gate rows) in each tiny shape's F32 file, and `n` byte
/// tokens (`i * stride + 1`) prefilled alone at position 0, all in one pass (one region each),
/// by `prefill` (a home of `n` regions on the file it is given) on the clean and the poisoned
/// file: a row that chose the expert turns NaN, every other row keeps its bits. A home that
/// ran every expert (and weighted the unchosen by 0) would turn every row NaN.
pub fn check_rows_read_only_their_experts(tag: &str, n: usize, stride: u32, prefill: impl Fn(Arc<GgufFile>, &[Segment]) -> Logits) {
    let dir = tmp_dir(tag);
    for shape in [SynthShape::Qwen3MoeTiny, SynthShape::MixtralTiny] {
        let path = synth_file(&dir, shape, SynthType::F32);
        let file = Arc::new(GgufFile::open(&path).unwrap());
        let t = file.tensor("blk.0.ffn_gate_exps.weight").unwrap();
        assert_eq!(t.ty, GgmlType::F32);
        let (expert, per_expert) = (5usize, (t.dims[0] * t.dims[1]) as usize * 4);
        let mut bytes = file.bytes().to_vec();
        let start = (file.data_offset + t.offset) as usize + expert * per_expert;
        for w in bytes[start..start + per_expert].chunks_exact_mut(4) {
            w.copy_from_slice(&f32::NAN.to_le_bytes());
        }
        let poisoned = Arc::new(GgufFile::from_bytes(bytes).unwrap());

        let toks: Vec<[u32; 1]> = (0..n as u32).map(|i| [i * stride + 1]).collect();
        let segs: Vec<Segment> = toks.iter().enumerate().map(|(r, t)| Segment { region: RegionId(r as u32), start: 0, tokens: t }).collect();
        let clean = prefill(file, &segs);
        let bad = prefill(poisoned, &segs);
        let (mut kept, mut nan) = (0, 0);
        for (r, tok) in toks.iter().enumerate() {
            if bad.row(r).iter().all(|v| v.is_nan()) {
                nan += 1;
            } else {
                assert_eq!(bits(bad.row(r)), bits(clean.row(r)), "{shape}: token {} did not choose the NaN expert yet changed", tok[0]);
                kept += 1;
            }
        }
        eprintln!("{shape}: {kept} rows kept their bits, {nan} chose the poisoned expert");
        // Top-2 of 8: about a quarter of the rows choose any one expert.
        assert!(kept > 0 && nan > 0, "{shape}: {kept} rows kept, {nan} turned NaN: the test shows nothing");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
