//! Synthetic benchmark models: GGUF files with the exact shapes of real llama-family models,
//! a real vocabulary copied from a vocabulary-only GGUF, and random weights.
//!
//! Weights are N(0, 0.02) (norms 1.0, F32), generated and quantized in parallel in fixed row
//! chunks. Each chunk draws from its own generator seeded from (seed, tensor index, chunk
//! index), so the bytes depend on the seed only, never on the thread count. Tensors stream
//! through [`GgufWriter`] a batch of chunks at a time: memory stays at a few tens of MiB
//! whatever the model size. The file is written to `<out>.tmp` and renamed when complete.
//!
//! Formats: `Q8_0` (every matrix Q8_0) and `Q4_K_M` (llama.cpp's mix from
//! `llama_tensor_get_type`: Q4_K by default, the tied embedding/output Q6_K, `attn_v` and
//! `ffn_down` Q6_K on the layers where `use_more_bits` holds).

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use rayon::prelude::*;
use resin_gguf::{formats, GgmlType, GgufFile, GgufWriter, Value};

/// Standard deviation of the random weights.
pub const WEIGHT_STD: f32 = 0.02;
/// Values per generation chunk (rounded to whole rows): fixes the chunk grid, hence the bytes.
const CHUNK_VALUES: usize = 1 << 18;
/// Chunks generated in parallel before their bytes are written (bounds memory).
const BATCH_CHUNKS: usize = 64;

/// The model shapes `resin synth` knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SynthShape {
    /// Llama-3.2-1B: hidden 2048, 16 layers, 32/8 heads of 64, FFN 8192.
    Llama32_1B,
    /// Llama-3.2-3B: hidden 3072, 28 layers, 24/8 heads of 128, FFN 8192.
    Llama32_3B,
}

impl SynthShape {
    pub const NAMES: [&'static str; 2] = ["llama3.2-1b", "llama3.2-3b"];

    pub fn parse(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "llama3.2-1b" => Ok(SynthShape::Llama32_1B),
            "llama3.2-3b" => Ok(SynthShape::Llama32_3B),
            _ => bail!("unknown synthetic shape {s:?} (known: {})", Self::NAMES.join(", ")),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            SynthShape::Llama32_1B => "llama3.2-1b",
            SynthShape::Llama32_3B => "llama3.2-3b",
        }
    }

    /// The full spec of this shape, with its vocabulary taken from `vocab`.
    pub fn spec(self, vocab: &Path) -> SynthSpec {
        let (hidden, layers, heads, kv_heads, head_dim, ffn) = match self {
            SynthShape::Llama32_1B => (2048, 16, 32, 8, 64, 8192),
            SynthShape::Llama32_3B => (3072, 28, 24, 8, 128, 8192),
        };
        SynthSpec {
            name: format!("synthetic-{}", self.name()),
            hidden,
            layers,
            heads,
            kv_heads,
            head_dim,
            ffn,
            context_length: 131072,
            rope_base: 500000.0,
            rms_eps: 1e-5,
            tied_embeddings: true,
            vocab: vocab.to_path_buf(),
        }
    }
}

impl std::fmt::Display for SynthShape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The weight formats `resin synth` writes (llama.cpp file types).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(non_camel_case_types)]
pub enum SynthType {
    Q8_0,
    Q4_K_M,
}

impl SynthType {
    pub const NAMES: [&'static str; 2] = ["q8_0", "q4_k_m"];

    pub fn parse(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "q8_0" => Ok(SynthType::Q8_0),
            "q4_k_m" => Ok(SynthType::Q4_K_M),
            _ => bail!("unknown synthetic weight format {s:?} (known: {})", Self::NAMES.join(", ")),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            SynthType::Q8_0 => "q8_0",
            SynthType::Q4_K_M => "q4_k_m",
        }
    }

    /// `general.file_type` (llama_ftype): 7 = MOSTLY_Q8_0, 15 = MOSTLY_Q4_K_M.
    pub fn file_type(self) -> u32 {
        match self {
            SynthType::Q8_0 => 7,
            SynthType::Q4_K_M => 15,
        }
    }
}

impl std::fmt::Display for SynthType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Everything that defines a synthetic llama model (the public shapes and tests' tiny ones).
#[derive(Debug, Clone, PartialEq)]
pub struct SynthSpec {
    /// `general.name`.
    pub name: String,
    /// Embedding length.
    pub hidden: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Feed-forward length.
    pub ffn: usize,
    pub context_length: u64,
    pub rope_base: f32,
    pub rms_eps: f32,
    /// No `output.weight`: the classifier reuses `token_embd.weight`.
    pub tied_embeddings: bool,
    /// A GGUF whose `tokenizer.*` keys are copied (e.g. a vocabulary-only GGUF); the vocabulary
    /// size is its `tokenizer.ggml.tokens` count.
    pub vocab: PathBuf,
}

impl SynthSpec {
    fn check(&self, ty: SynthType) -> Result<()> {
        let block = match ty {
            SynthType::Q8_0 => 32,
            SynthType::Q4_K_M => 256,
        };
        if self.hidden == 0 || self.layers == 0 || self.heads == 0 || self.kv_heads == 0 || self.head_dim == 0 || self.ffn == 0 {
            bail!("synthetic spec {:?}: every dimension must be nonzero", self.name);
        }
        if self.heads < self.kv_heads || self.heads / self.kv_heads * self.kv_heads != self.heads {
            bail!("synthetic spec {:?}: {} heads is not a multiple of {} KV heads", self.name, self.heads, self.kv_heads);
        }
        for (what, n) in [("hidden", self.hidden), ("heads * head_dim", self.heads * self.head_dim), ("ffn", self.ffn)] {
            if n / block * block != n {
                bail!("synthetic spec {:?}: {what} = {n} is not a multiple of the {ty} block length {block}", self.name);
            }
        }
        Ok(())
    }
}

/// One tensor the synthetic file holds.
#[derive(Debug, Clone, PartialEq)]
pub struct PlannedTensor {
    pub name: String,
    /// ggml order: row length first.
    pub dims: Vec<u64>,
    pub ty: GgmlType,
    /// Norm weights (all 1.0) rather than random.
    pub ones: bool,
}

/// llama.cpp's `use_more_bits` (llama-quant.cpp): the layers Q4_K_M gives Q6_K attn_v / ffn_down.
pub fn use_more_bits(i_layer: usize, n_layers: usize) -> bool {
    let (i, n) = (i_layer as i64, n_layers as i64);
    i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2
}

/// The tensor table (names, shapes, formats, in file order) of `spec` quantized as `ty`, for a
/// vocabulary of `n_vocab` tokens. Same set and order as `device/mkmodel.py`.
pub fn tensor_plan(spec: &SynthSpec, ty: SynthType, n_vocab: usize) -> Vec<PlannedTensor> {
    let (h, q, kv, f, v) = (spec.hidden as u64, (spec.heads * spec.head_dim) as u64, (spec.kv_heads * spec.head_dim) as u64, spec.ffn as u64, n_vocab as u64);
    let n = spec.layers;
    use GgmlType::*;
    let (base, big) = match ty {
        SynthType::Q8_0 => (Q8_0, Q8_0),
        SynthType::Q4_K_M => (Q4_K, Q6_K),
    };
    let mat = |name: String, cols: u64, rows: u64, ty: GgmlType| PlannedTensor { name, dims: vec![cols, rows], ty, ones: false };
    let norm = |name: String| PlannedTensor { name, dims: vec![h], ty: F32, ones: true };
    let mut out = Vec::with_capacity(n * 9 + 3);
    // Tied: the embedding is also the classifier and takes the output tensor's format.
    out.push(mat("token_embd.weight".into(), h, v, if spec.tied_embeddings { big } else { base }));
    for i in 0..n {
        let p = format!("blk.{i}.");
        let more = if use_more_bits(i, n) { big } else { base };
        out.push(norm(format!("{p}attn_norm.weight")));
        out.push(mat(format!("{p}attn_q.weight"), h, q, base));
        out.push(mat(format!("{p}attn_k.weight"), h, kv, base));
        out.push(mat(format!("{p}attn_v.weight"), h, kv, more));
        out.push(mat(format!("{p}attn_output.weight"), q, h, base));
        out.push(norm(format!("{p}ffn_norm.weight")));
        out.push(mat(format!("{p}ffn_gate.weight"), h, f, base));
        out.push(mat(format!("{p}ffn_up.weight"), h, f, base));
        out.push(mat(format!("{p}ffn_down.weight"), f, h, more));
    }
    out.push(norm("output_norm.weight".into()));
    if !spec.tied_embeddings {
        out.push(mat("output.weight".into(), h, v, big));
    }
    out
}

/// Write a synthetic model of a known shape. See [`synth_with`].
pub fn synth(shape: SynthShape, ty: SynthType, vocab: &Path, out: &Path, seed: u64, progress: bool) -> Result<()> {
    synth_with(&shape.spec(vocab), ty, out, seed, progress)
}

/// Write the synthetic model `spec` quantized as `ty` to `out` (through `<out>.tmp`).
pub fn synth_with(spec: &SynthSpec, ty: SynthType, out: &Path, seed: u64, progress: bool) -> Result<()> {
    spec.check(ty)?;
    let vocab = GgufFile::open(&spec.vocab).with_context(|| format!("reading vocabulary {}", spec.vocab.display()))?;
    let n_vocab = vocab
        .get("tokenizer.ggml.tokens")
        .and_then(Value::as_array)
        .map(<[Value]>::len)
        .filter(|&n| n > 0)
        .ok_or_else(|| anyhow!("{}: no tokenizer.ggml.tokens array", spec.vocab.display()))?;
    let plan = tensor_plan(spec, ty, n_vocab);

    let mut w = GgufWriter::new();
    let u32v = |n: usize| Value::U32(n as u32);
    w.set("general.architecture", Value::String("llama".into()));
    w.set("general.name", Value::String(spec.name.clone()));
    w.set("llama.block_count", u32v(spec.layers));
    w.set("llama.context_length", Value::U32(spec.context_length.min(u32::MAX as u64) as u32));
    w.set("llama.embedding_length", u32v(spec.hidden));
    w.set("llama.feed_forward_length", u32v(spec.ffn));
    w.set("llama.attention.head_count", u32v(spec.heads));
    w.set("llama.attention.head_count_kv", u32v(spec.kv_heads));
    w.set("llama.attention.key_length", u32v(spec.head_dim));
    w.set("llama.attention.value_length", u32v(spec.head_dim));
    w.set("llama.rope.freq_base", Value::F32(spec.rope_base));
    w.set("llama.attention.layer_norm_rms_epsilon", Value::F32(spec.rms_eps));
    w.set("llama.rope.dimension_count", u32v(spec.head_dim));
    w.set("llama.vocab_size", u32v(n_vocab));
    w.set("general.file_type", Value::U32(ty.file_type()));
    w.set("general.quantization_version", Value::U32(2));
    for (k, v) in vocab.metadata() {
        if k.starts_with("tokenizer.") {
            w.set(k.clone(), v.clone());
        }
    }
    drop(vocab);
    for t in &plan {
        w.add_tensor(t.name.clone(), &t.dims, t.ty).with_context(|| format!("declaring {}", t.name))?;
    }
    let total: u64 = plan.iter().map(|t| t.ty.bytes_for(t.dims.iter().product()).unwrap_or(0)).sum();

    let pb = if progress {
        let pb = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
        pb.set_style(
            ProgressStyle::with_template("{msg} [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}").unwrap_or_else(|_| ProgressStyle::default_bar()).progress_chars("=> "),
        );
        pb.set_message(format!("synth {} {}", spec.name, ty));
        pb
    } else {
        ProgressBar::hidden()
    };

    let mut tmp = out.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let result = (|| -> Result<()> {
        let file = File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
        let mut bw = BufWriter::with_capacity(8 << 20, file);
        w.write(&mut bw, |i, dst| write_tensor(&plan[i], i as u64, seed, dst, &pb)).with_context(|| format!("writing {}", tmp.display()))?;
        let file = bw.into_inner().map_err(|e| e.into_error()).with_context(|| format!("writing {}", tmp.display()))?;
        file.sync_all().with_context(|| format!("syncing {}", tmp.display()))?;
        std::fs::rename(&tmp, out).with_context(|| format!("renaming {} to {}", tmp.display(), out.display()))?;
        Ok(())
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
        pb.abandon();
    } else {
        pb.finish();
    }
    result
}

/// Generate, quantize and write one tensor's bytes, a batch of row chunks at a time; the next
/// batch is computed while the previous one is written.
fn write_tensor(t: &PlannedTensor, index: u64, seed: u64, dst: &mut dyn Write, pb: &ProgressBar) -> std::io::Result<()> {
    let cols = t.dims[0] as usize;
    let rows = t.dims.iter().skip(1).product::<u64>() as usize;
    if t.ones {
        let mut bytes = Vec::with_capacity(cols * rows * 4);
        for _ in 0..cols * rows {
            bytes.extend_from_slice(&1.0f32.to_le_bytes());
        }
        dst.write_all(&bytes)?;
        pb.inc(bytes.len() as u64);
        return Ok(());
    }
    let chunk_rows = (CHUNK_VALUES / cols).max(1);
    let n_chunks = rows.div_ceil(chunk_rows);
    let gen = |c: usize| -> std::io::Result<Vec<u8>> {
        let r0 = c * chunk_rows;
        let nr = chunk_rows.min(rows - r0);
        let mut vals = vec![0f32; nr * cols];
        fill_normal(&mut vals, chunk_seed(seed, index, c as u64), WEIGHT_STD);
        formats::quantize(t.ty, &vals).map_err(std::io::Error::other)
    };
    let batch = |b: usize| -> std::io::Result<Vec<Vec<u8>>> {
        let lo = b * BATCH_CHUNKS;
        let hi = (lo + BATCH_CHUNKS).min(n_chunks);
        (lo..hi).into_par_iter().map(gen).collect()
    };
    let n_batches = n_chunks.div_ceil(BATCH_CHUNKS);
    let mut pending = batch(0)?;
    for b in 1..=n_batches {
        // Compute batch b on the pool while this thread writes batch b - 1.
        let mut next: std::io::Result<Vec<Vec<u8>>> = Ok(Vec::new());
        let written = rayon::in_place_scope(|s| -> std::io::Result<()> {
            if b < n_batches {
                let next = &mut next;
                let batch = &batch;
                s.spawn(move |_| *next = batch(b));
            }
            for bytes in &pending {
                dst.write_all(bytes)?;
                pb.inc(bytes.len() as u64);
            }
            Ok(())
        });
        written?;
        pending = next?;
    }
    Ok(())
}

/// Seed of one chunk's generator, from (seed, tensor index, chunk index).
fn chunk_seed(seed: u64, tensor: u64, chunk: u64) -> u64 {
    let mut s = splitmix64(seed ^ 0x7265_7369_6e5f_7379); // "resin_sy"
    s = splitmix64(s ^ tensor.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    splitmix64(s ^ chunk.wrapping_mul(0xC2B2_AE3D_27D4_EB4F))
}

fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// xoshiro256++ seeded through splitmix64.
struct Xoshiro256pp([u64; 4]);

impl Xoshiro256pp {
    fn new(seed: u64) -> Self {
        let mut s = [0u64; 4];
        let mut x = seed;
        for v in &mut s {
            x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
            *v = splitmix64(x);
        }
        Xoshiro256pp(s)
    }

    #[inline]
    fn next_u64(&mut self) -> u64 {
        let s = &mut self.0;
        let r = s[0].wrapping_add(s[3]).rotate_left(23).wrapping_add(s[0]);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        r
    }
}

/// Fill `out` with N(0, std) draws (Box-Muller, two values per 64 random bits).
fn fill_normal(out: &mut [f32], seed: u64, std: f32) {
    let mut rng = Xoshiro256pp::new(seed);
    const SCALE: f32 = 1.0 / (1u32 << 24) as f32;
    for pair in out.chunks_mut(2) {
        let r = rng.next_u64();
        // u1 in (0, 1] (never 0: ln is finite), u2 in [0, 1).
        let u1 = ((r >> 40) as u32 + 1) as f32 * SCALE;
        let u2 = ((r >> 8) as u32 & 0x00ff_ffff) as f32 * SCALE;
        let rad = (-2.0 * u1.ln()).sqrt() * std;
        let (s, c) = (std::f32::consts::TAU * u2).sin_cos();
        pair[0] = rad * c;
        if let Some(p) = pair.get_mut(1) {
            *p = rad * s;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn use_more_bits_matches_llama_cpp() {
        let v: Vec<usize> = (0..16).filter(|&i| use_more_bits(i, 16)).collect();
        assert_eq!(v, vec![0, 1, 4, 7, 10, 13, 14, 15]);
        let v: Vec<usize> = (0..28).filter(|&i| use_more_bits(i, 28)).collect();
        assert_eq!(v, vec![0, 1, 2, 5, 8, 11, 14, 17, 20, 23, 24, 25, 26, 27]);
    }

    #[test]
    fn normal_draws_have_the_right_moments() {
        let mut v = vec![0f32; 1 << 20];
        fill_normal(&mut v, 42, 1.0);
        let n = v.len() as f64;
        let mean = v.iter().map(|&x| x as f64).sum::<f64>() / n;
        let var = v.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / n;
        assert!(mean.abs() < 0.005, "mean {mean}");
        assert!((var.sqrt() - 1.0).abs() < 0.005, "std {}", var.sqrt());
        assert!(v.iter().all(|x| x.is_finite()));
    }

    #[test]
    fn parse_names() {
        assert_eq!(SynthShape::parse("llama3.2-1b").unwrap(), SynthShape::Llama32_1B);
        assert_eq!(SynthShape::parse("llama3.2-3b").unwrap(), SynthShape::Llama32_3B);
        assert!(SynthShape::parse("llama3.1-8b").is_err());
        assert_eq!(SynthType::parse("q8_0").unwrap(), SynthType::Q8_0);
        assert_eq!(SynthType::parse("Q4_K_M").unwrap(), SynthType::Q4_K_M);
        assert!(SynthType::parse("q4_0").is_err());
    }
}
