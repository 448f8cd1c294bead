//! Synthetic models: GGUF files with the exact shapes of real models (llama, Qwen3-30B-A3B's
//! mixture of experts, and Gemma 3's sliding-window layers), a real vocabulary copied from a vocabulary-only GGUF, and random
//! weights; and tiny mixture-of-experts files (qwen3moe, Mixtral-style llama) for the tests,
//! which may take a built-in byte-level vocabulary instead.
//!
//! Weights are N(0, std) (0.02 for the real shapes; norms 1.0, F32), generated and quantized in parallel in fixed row
//! chunks. Each chunk draws from its own generator seeded from (seed, tensor index, chunk
//! index), so the bytes depend on the seed only, never on the thread count. Tensors stream
//! through [`GgufWriter`] a batch of chunks at a time: memory stays at a few tens of MiB
//! whatever the model size. The file is written to `<out>.tmp` and renamed when complete.
//!
//! Formats: `F32` (every matrix F32, for the tests), `Q8_0` (every matrix Q8_0) and `Q4_K_M` (llama.cpp's mix from
//! `llama_tensor_get_type`: Q4_K by default, the output (or the tied embedding) Q6_K, `attn_v`
//! and `ffn_down` / `ffn_down_exps` Q6_K on the layers where `use_more_bits` holds; with exactly
//! 8 experts, as Mixtral, `attn_k` / `attn_v` Q8_0 and `attn_output` Q5_K). A matrix whose rows
//! are not a whole number of its format's blocks takes llama-quantize's fallback (Q4_K to Q5_0,
//! Q5_K to Q5_1, Q6_K to Q8_0; the output Q8_0): Gemma 3's hidden sizes are such rows. The router
//! (`ffn_gate_inp`) stays F32 in every format, as llama.cpp never quantizes it.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use rayon::prelude::*;
use resin_gguf::{formats, GgmlType, GgufFile, GgufWriter, Value};

/// Standard deviation of the random weights of the real shapes.
pub const WEIGHT_STD: f32 = 0.02;
/// Standard deviation of the tiny test shapes' weights (see [`SynthShape::spec`]).
pub const TINY_WEIGHT_STD: f32 = 0.125;
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
    /// Qwen3-30B-A3B: qwen3moe, hidden 2048, 48 layers, 32/4 heads of 128, 128 experts of FFN
    /// 768, 8 chosen a row, untied output.
    Qwen3Moe30B,
    /// A tiny qwen3moe for the tests: hidden 256, 3 layers, 4/2 heads of 64, 8 experts of FFN
    /// 256, 2 chosen a row.
    Qwen3MoeTiny,
    /// A tiny Mixtral-style llama for the tests: hidden 256, 3 layers, 4/2 heads of 64, 8
    /// experts of FFN 256, 2 chosen a row, tied output.
    MixtralTiny,
    /// Gemma-3-270M: gemma3, hidden 640, 18 layers, 4/1 heads of 256, FFN 2048, a 262,144-token
    /// vocabulary, sliding window 512 on five layers of every six.
    Gemma3_270M,
    /// Gemma-3-1B: gemma3, hidden 1152, 26 layers, 4/1 heads of 256, FFN 6912, otherwise as
    /// the 270M.
    Gemma3_1B,
}

impl SynthShape {
    pub const NAMES: [&'static str; 7] = ["llama3.2-1b", "llama3.2-3b", "qwen3-30b-a3b", "qwen3moe-tiny", "mixtral-tiny", "gemma3-270m", "gemma3-1b"];

    pub fn parse(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "llama3.2-1b" => Ok(SynthShape::Llama32_1B),
            "llama3.2-3b" => Ok(SynthShape::Llama32_3B),
            "qwen3-30b-a3b" => Ok(SynthShape::Qwen3Moe30B),
            "qwen3moe-tiny" => Ok(SynthShape::Qwen3MoeTiny),
            "mixtral-tiny" => Ok(SynthShape::MixtralTiny),
            "gemma3-270m" => Ok(SynthShape::Gemma3_270M),
            "gemma3-1b" => Ok(SynthShape::Gemma3_1B),
            _ => bail!("unknown synthetic shape {s:?} (known: {})", Self::NAMES.join(", ")),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            SynthShape::Llama32_1B => "llama3.2-1b",
            SynthShape::Llama32_3B => "llama3.2-3b",
            SynthShape::Qwen3Moe30B => "qwen3-30b-a3b",
            SynthShape::Qwen3MoeTiny => "qwen3moe-tiny",
            SynthShape::MixtralTiny => "mixtral-tiny",
            SynthShape::Gemma3_270M => "gemma3-270m",
            SynthShape::Gemma3_1B => "gemma3-1b",
        }
    }

    /// Whether the shape is a Gemma 3 one, whose 262,144-token vocabulary must come from a
    /// gemma3 GGUF (`--vocab`): the embedding's size is what the shape is for.
    pub fn is_gemma(self) -> bool {
        matches!(self, SynthShape::Gemma3_270M | SynthShape::Gemma3_1B)
    }

    /// Whether the shape is one of the tests' tiny ones (which may take the byte-level vocabulary).
    pub fn is_tiny(self) -> bool {
        matches!(self, SynthShape::Qwen3MoeTiny | SynthShape::MixtralTiny)
    }

    /// The full spec of this shape, with its vocabulary from `vocab`.
    pub fn spec(self, vocab: SynthVocab) -> SynthSpec {
        let name = format!("synthetic-{}", self.name());
        let llama = |hidden, layers, heads, head_dim| SynthSpec {
            name: name.clone(),
            arch: SynthArch::Llama,
            hidden,
            layers,
            heads,
            kv_heads: 8,
            head_dim,
            ffn: 8192,
            moe: None,
            context_length: 131072,
            rope_base: 500000.0,
            rms_eps: 1e-5,
            tied_embeddings: true,
            weight_std: WEIGHT_STD,
            vocab: vocab.clone(),
            min_vocab: 0,
            swa: None,
        };
        // The tiny shapes' weights are larger than a trained model's so that their logits and
        // router choices are well apart: a test that compares greedy ids and chosen experts
        // against a float reference then rarely meets a near-tie.
        let tiny = |arch, tied| SynthSpec {
            name: name.clone(),
            arch,
            hidden: 256,
            layers: 3,
            heads: 4,
            kv_heads: 2,
            head_dim: 64,
            ffn: 256,
            moe: Some(SynthMoe { experts: 8, used: 2, ffn: 256 }),
            context_length: 4096,
            rope_base: 10000.0,
            rms_eps: 1e-6,
            tied_embeddings: tied,
            weight_std: TINY_WEIGHT_STD,
            vocab: vocab.clone(),
            min_vocab: 0,
            swa: None,
        };
        // Both Gemma 3 sizes share everything but the widths and depth (their GGUFs' keys: the
        // 270M's read from Google's file, the 1B's from its config).
        let gemma = |hidden, layers, ffn| SynthSpec {
            name: name.clone(),
            arch: SynthArch::Gemma3,
            hidden,
            layers,
            heads: 4,
            kv_heads: 1,
            head_dim: 256,
            ffn,
            moe: None,
            context_length: 32768,
            rope_base: 1_000_000.0,
            rms_eps: 1e-6,
            tied_embeddings: true,
            weight_std: WEIGHT_STD,
            vocab: vocab.clone(),
            min_vocab: 262144,
            swa: Some(SynthSwa { window: 512, every: 6, rope_base: 10000.0 }),
        };
        match self {
            SynthShape::Llama32_1B => llama(2048, 16, 32, 64),
            SynthShape::Llama32_3B => llama(3072, 28, 24, 128),
            SynthShape::Qwen3Moe30B => SynthSpec {
                name: name.clone(),
                arch: SynthArch::Qwen3Moe,
                hidden: 2048,
                layers: 48,
                heads: 32,
                kv_heads: 4,
                head_dim: 128,
                ffn: 6144,
                moe: Some(SynthMoe { experts: 128, used: 8, ffn: 768 }),
                context_length: 40960,
                rope_base: 1_000_000.0,
                rms_eps: 1e-6,
                tied_embeddings: false,
                weight_std: WEIGHT_STD,
                vocab: vocab.clone(),
                min_vocab: 151936,
                swa: None,
            },
            SynthShape::Qwen3MoeTiny => tiny(SynthArch::Qwen3Moe, false),
            SynthShape::MixtralTiny => tiny(SynthArch::Llama, true),
            SynthShape::Gemma3_270M => gemma(640, 18, 2048),
            SynthShape::Gemma3_1B => gemma(1152, 26, 6912),
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
    /// Every matrix F32: the tests' exact oracle comparisons (a home keeps f32 activations for
    /// float weights).
    F32,
    Q8_0,
    Q4_K_M,
}

impl SynthType {
    pub const NAMES: [&'static str; 3] = ["f32", "q8_0", "q4_k_m"];

    pub fn parse(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "f32" => Ok(SynthType::F32),
            "q8_0" => Ok(SynthType::Q8_0),
            "q4_k_m" => Ok(SynthType::Q4_K_M),
            _ => bail!("unknown synthetic weight format {s:?} (known: {})", Self::NAMES.join(", ")),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            SynthType::F32 => "f32",
            SynthType::Q8_0 => "q8_0",
            SynthType::Q4_K_M => "q4_k_m",
        }
    }

    /// `general.file_type` (llama_ftype): 0 = ALL_F32, 7 = MOSTLY_Q8_0, 15 = MOSTLY_Q4_K_M.
    pub fn file_type(self) -> u32 {
        match self {
            SynthType::F32 => 0,
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

/// The architecture a synthetic file declares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SynthArch {
    /// llama, dense or (with [`SynthSpec::moe`]) with experts as Mixtral stores them.
    Llama,
    /// qwen3moe: qwen3's q/k norms, routed experts.
    Qwen3Moe,
    /// gemma3: q/k norms, norms after attention and after the FFN, sliding-window layers.
    Gemma3,
}

impl SynthArch {
    pub fn name(self) -> &'static str {
        match self {
            SynthArch::Llama => "llama",
            SynthArch::Qwen3Moe => "qwen3moe",
            SynthArch::Gemma3 => "gemma3",
        }
    }

    /// Whether layers carry `attn_q_norm` / `attn_k_norm`.
    fn qk_norm(self) -> bool {
        matches!(self, SynthArch::Qwen3Moe | SynthArch::Gemma3)
    }
}

/// Sliding-window attention as gemma3 declares it: every `every`-th layer is global, the others
/// see the last `window` keys and rotate with their own rope base.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SynthSwa {
    /// `attention.sliding_window`.
    pub window: usize,
    /// The period of global layers; written only when it differs from gemma3's default (6),
    /// since a converted gemma3 file does not carry it.
    pub every: usize,
    /// `rope.freq_base_swa`.
    pub rope_base: f32,
}

/// The experts of a synthetic MoE model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SynthMoe {
    pub experts: usize,
    /// Experts chosen a row.
    pub used: usize,
    /// Each expert's FFN length.
    pub ffn: usize,
}

/// Where a synthetic model's vocabulary comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum SynthVocab {
    /// A GGUF whose `tokenizer.*` keys are copied (e.g. a vocabulary-only GGUF); the vocabulary
    /// size is its `tokenizer.ggml.tokens` count.
    File(PathBuf),
    /// A built-in byte-level BPE vocabulary ([`byte_vocab`]): 256 byte tokens, no merges, and
    /// ChatML's special tokens, so any text encodes (a byte a token) and chat works.
    ByteLevel,
}

/// Everything that defines a synthetic model (the public shapes and tests' tiny ones).
#[derive(Debug, Clone, PartialEq)]
pub struct SynthSpec {
    /// `general.name`.
    pub name: String,
    pub arch: SynthArch,
    /// Embedding length.
    pub hidden: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Feed-forward length (`feed_forward_length`; a llama MoE's experts are this long).
    pub ffn: usize,
    /// Routed experts in place of the dense FFN.
    pub moe: Option<SynthMoe>,
    pub context_length: u64,
    pub rope_base: f32,
    pub rms_eps: f32,
    /// No `output.weight`: the classifier reuses `token_embd.weight`.
    pub tied_embeddings: bool,
    /// Standard deviation of the random matrices.
    pub weight_std: f32,
    pub vocab: SynthVocab,
    /// A vocabulary shorter than this is padded with unused `[PADn]` tokens up to it (as Qwen's
    /// converter pads to the model's embedding rows); 0: no padding.
    pub min_vocab: usize,
    /// Sliding-window layers (gemma3 only); None: every layer global.
    pub swa: Option<SynthSwa>,
}

impl SynthSpec {
    fn check(&self) -> Result<()> {
        if self.hidden == 0 || self.layers == 0 || self.heads == 0 || self.kv_heads == 0 || self.head_dim == 0 || self.ffn == 0 {
            bail!("synthetic spec {:?}: every dimension must be nonzero", self.name);
        }
        if self.heads < self.kv_heads || self.heads / self.kv_heads * self.kv_heads != self.heads {
            bail!("synthetic spec {:?}: {} heads is not a multiple of {} KV heads", self.name, self.heads, self.kv_heads);
        }
        if let Some(m) = self.moe {
            if m.experts == 0 || m.used == 0 || m.used > m.experts || m.ffn == 0 {
                bail!("synthetic spec {:?}: {} of {} experts of FFN {} (need 1 <= used <= experts)", self.name, m.used, m.experts, m.ffn);
            }
            if self.arch == SynthArch::Llama && m.ffn != self.ffn {
                bail!("synthetic spec {:?}: a llama MoE's experts are feed_forward_length ({}) long, not {}", self.name, self.ffn, m.ffn);
            }
        } else if self.arch == SynthArch::Qwen3Moe {
            bail!("synthetic spec {:?}: a qwen3moe model needs experts", self.name);
        }
        if self.arch == SynthArch::Gemma3 && (self.moe.is_some() || !self.tied_embeddings) {
            bail!("synthetic spec {:?}: a gemma3 model is dense with a tied output", self.name);
        }
        match self.swa {
            Some(_) if self.arch != SynthArch::Gemma3 => bail!("synthetic spec {:?}: only gemma3 has sliding-window layers", self.name),
            Some(s) if s.window == 0 || s.every == 0 || !(s.rope_base > 0.0 && s.rope_base.is_finite()) => {
                bail!("synthetic spec {:?}: sliding window {} every {} with rope base {} (need nonzero, positive)", self.name, s.window, s.every, s.rope_base)
            }
            _ => {}
        }
        if !(self.weight_std > 0.0 && self.weight_std.is_finite()) {
            bail!("synthetic spec {:?}: weight std {} must be positive", self.name, self.weight_std);
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

/// llama-quantize's `tensor_type_fallback`: the format a matrix of rows `cols` long takes when
/// they are not a whole number of `ty`'s blocks. A format with no fallback is kept (and refused
/// by [`synth_with`]'s check).
pub fn type_fallback(ty: GgmlType, cols: u64) -> GgmlType {
    use GgmlType::*;
    if cols.is_multiple_of(ty.block_len() as u64) {
        return ty;
    }
    match ty {
        Q4_K => Q5_0,
        Q5_K => Q5_1,
        Q6_K => Q8_0,
        other => other,
    }
}

/// The tensor table (names, shapes, formats, in file order) of `spec` quantized as `ty`, for a
/// vocabulary of `n_vocab` tokens. Same set and order as `device/mkmodel.py` for llama shapes.
pub fn tensor_plan(spec: &SynthSpec, ty: SynthType, n_vocab: usize) -> Vec<PlannedTensor> {
    let (h, q, kv, f, v) = (spec.hidden as u64, (spec.heads * spec.head_dim) as u64, (spec.kv_heads * spec.head_dim) as u64, spec.ffn as u64, n_vocab as u64);
    let n = spec.layers;
    use GgmlType::*;
    let (base, big) = match ty {
        SynthType::F32 => (F32, F32),
        SynthType::Q8_0 => (Q8_0, Q8_0),
        SynthType::Q4_K_M => (Q4_K, Q6_K),
    };
    // llama.cpp's rules for a model of exactly 8 experts (Mixtral) under Q4_K_M.
    let eight = ty == SynthType::Q4_K_M && spec.moe.is_some_and(|m| m.experts == 8);
    let mat = |name: String, cols: u64, rows: u64, ty: GgmlType| PlannedTensor { name, dims: vec![cols, rows], ty: type_fallback(ty, cols), ones: false };
    let experts = |name: String, cols: u64, rows: u64, e: u64, ty: GgmlType| PlannedTensor { name, dims: vec![cols, rows, e], ty: type_fallback(ty, cols), ones: false };
    let norm_of = |name: String, n: u64| PlannedTensor { name, dims: vec![n], ty: F32, ones: true };
    let norm = |name: String| norm_of(name, h);
    let mut out = Vec::with_capacity(n * 13 + 3);
    // llama-quantize gives the output (or the tied embedding) Q8_0 rather than Q6_K when its rows
    // are not whole blocks of the file's default format.
    let output = if h.is_multiple_of(base.block_len() as u64) { big } else { Q8_0 };
    // Tied: the embedding is also the classifier and takes the output tensor's format.
    out.push(mat("token_embd.weight".into(), h, v, if spec.tied_embeddings { output } else { base }));
    for i in 0..n {
        let p = format!("blk.{i}.");
        let more = if use_more_bits(i, n) { big } else { base };
        out.push(norm(format!("{p}attn_norm.weight")));
        out.push(mat(format!("{p}attn_q.weight"), h, q, base));
        out.push(mat(format!("{p}attn_k.weight"), h, kv, if eight { Q8_0 } else { base }));
        out.push(mat(format!("{p}attn_v.weight"), h, kv, if eight { Q8_0 } else { more }));
        out.push(mat(format!("{p}attn_output.weight"), q, h, if eight { Q5_K } else { base }));
        if spec.arch.qk_norm() {
            out.push(norm_of(format!("{p}attn_q_norm.weight"), spec.head_dim as u64));
            out.push(norm_of(format!("{p}attn_k_norm.weight"), spec.head_dim as u64));
        }
        if spec.arch == SynthArch::Gemma3 {
            out.push(norm(format!("{p}post_attention_norm.weight")));
        }
        out.push(norm(format!("{p}ffn_norm.weight")));
        match spec.moe {
            None => {
                out.push(mat(format!("{p}ffn_gate.weight"), h, f, base));
                out.push(mat(format!("{p}ffn_up.weight"), h, f, base));
                out.push(mat(format!("{p}ffn_down.weight"), f, h, more));
            }
            Some(m) => {
                let (e, fe) = (m.experts as u64, m.ffn as u64);
                out.push(mat(format!("{p}ffn_gate_inp.weight"), h, e, F32));
                out.push(experts(format!("{p}ffn_gate_exps.weight"), h, fe, e, base));
                out.push(experts(format!("{p}ffn_up_exps.weight"), h, fe, e, base));
                out.push(experts(format!("{p}ffn_down_exps.weight"), fe, h, e, more));
            }
        }
        if spec.arch == SynthArch::Gemma3 {
            out.push(norm(format!("{p}post_ffw_norm.weight")));
        }
    }
    out.push(norm("output_norm.weight".into()));
    if !spec.tied_embeddings {
        out.push(mat("output.weight".into(), h, v, output));
    }
    out
}

/// Write a synthetic model of a known shape. See [`synth_with`].
pub fn synth(shape: SynthShape, ty: SynthType, vocab: SynthVocab, out: &Path, seed: u64, progress: bool) -> Result<()> {
    synth_with(&shape_spec(shape, vocab)?, ty, out, seed, progress)
}

/// [`synth`] with `layers` layers in place of the shape's own: a layer's cost (`resin bench
/// --profile`) from a file a fraction of the size.
pub fn synth_layers(shape: SynthShape, ty: SynthType, vocab: SynthVocab, out: &Path, seed: u64, layers: usize, progress: bool) -> Result<()> {
    if layers == 0 {
        bail!("a model needs at least one layer");
    }
    let mut spec = shape_spec(shape, vocab)?;
    spec.layers = layers;
    synth_with(&spec, ty, out, seed, progress)
}

fn shape_spec(shape: SynthShape, vocab: SynthVocab) -> Result<SynthSpec> {
    if shape.is_gemma() && vocab == SynthVocab::ByteLevel {
        bail!("the {shape} shape needs a gemma3 vocabulary (--vocab GEMMA3.gguf, e.g. the file `resin pull gemma3-270m` fetches): its 262,144-token embedding is what the shape is for");
    }
    Ok(shape.spec(vocab))
}

/// The built-in byte-level vocabulary ([`SynthVocab::ByteLevel`]) as `tokenizer.*` metadata:
/// GPT-2's 256 byte tokens (ids 0..256), then `<|endoftext|>` (256, BOS), `<|im_start|>` (257)
/// and `<|im_end|>` (258, EOS), no merges, a ChatML template.
pub fn byte_vocab() -> Vec<(String, Value)> {
    use resin_gguf::ValueType;
    // GPT-2's byte-to-unicode map: printable Latin-1 bytes stand for themselves, the others
    // take the code points from 256 up, in byte order.
    let printable = |b: u32| (0x21..=0x7e).contains(&b) || (0xa1..=0xac).contains(&b) || (0xae..=0xff).contains(&b);
    let mut next = 256u32;
    let mut tokens: Vec<Value> = Vec::with_capacity(259);
    for b in 0..256u32 {
        let c = if printable(b) {
            b
        } else {
            next += 1;
            next - 1
        };
        tokens.push(Value::String(char::from_u32(c).map(String::from).unwrap_or_default()));
    }
    let specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];
    tokens.extend(specials.iter().map(|s| Value::String(s.to_string())));
    let types: Vec<Value> = (0..tokens.len()).map(|i| Value::I32(if i < 256 { 1 } else { 3 })).collect();
    let template = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
    vec![
        ("tokenizer.ggml.model".into(), Value::String("gpt2".into())),
        ("tokenizer.ggml.pre".into(), Value::String("qwen2".into())),
        ("tokenizer.ggml.tokens".into(), Value::Array(ValueType::String, tokens)),
        ("tokenizer.ggml.token_type".into(), Value::Array(ValueType::I32, types)),
        ("tokenizer.ggml.merges".into(), Value::Array(ValueType::String, Vec::new())),
        ("tokenizer.ggml.bos_token_id".into(), Value::U32(256)),
        ("tokenizer.ggml.eos_token_id".into(), Value::U32(258)),
        ("tokenizer.ggml.add_bos_token".into(), Value::Bool(false)),
        ("tokenizer.chat_template".into(), Value::String(template.into())),
    ]
}

/// Write the synthetic model `spec` quantized as `ty` to `out` (through `<out>.tmp`).
pub fn synth_with(spec: &SynthSpec, ty: SynthType, out: &Path, seed: u64, progress: bool) -> Result<()> {
    spec.check()?;
    let tokenizer: Vec<(String, Value)> = match &spec.vocab {
        SynthVocab::ByteLevel => byte_vocab(),
        SynthVocab::File(path) => {
            let vocab = GgufFile::open(path).with_context(|| format!("reading vocabulary {}", path.display()))?;
            vocab.metadata().iter().filter(|(k, _)| k.starts_with("tokenizer.")).map(|(k, v)| (k.clone(), v.clone())).collect()
        }
    };
    let mut tokenizer = tokenizer;
    pad_vocab(&mut tokenizer, spec.min_vocab);
    let n_vocab = tokenizer
        .iter()
        .find(|(k, _)| k == "tokenizer.ggml.tokens")
        .and_then(|(_, v)| v.as_array())
        .map(<[Value]>::len)
        .filter(|&n| n > 0)
        .ok_or_else(|| anyhow!("{:?}: no tokenizer.ggml.tokens array", spec.vocab))?;
    let plan = tensor_plan(spec, ty, n_vocab);
    if let Some(t) = plan.iter().find(|t| !t.dims[0].is_multiple_of(t.ty.block_len() as u64)) {
        bail!("synthetic spec {:?}: {} has rows of {}, not a multiple of the {:?} block length {}", spec.name, t.name, t.dims[0], t.ty, t.ty.block_len());
    }

    let mut w = GgufWriter::new();
    let u32v = |n: usize| Value::U32(n as u32);
    let a = spec.arch.name();
    w.set("general.architecture", Value::String(a.into()));
    w.set("general.name", Value::String(spec.name.clone()));
    w.set(format!("{a}.block_count"), u32v(spec.layers));
    w.set(format!("{a}.context_length"), Value::U32(spec.context_length.min(u32::MAX as u64) as u32));
    w.set(format!("{a}.embedding_length"), u32v(spec.hidden));
    w.set(format!("{a}.feed_forward_length"), u32v(spec.ffn));
    w.set(format!("{a}.attention.head_count"), u32v(spec.heads));
    w.set(format!("{a}.attention.head_count_kv"), u32v(spec.kv_heads));
    w.set(format!("{a}.attention.key_length"), u32v(spec.head_dim));
    w.set(format!("{a}.attention.value_length"), u32v(spec.head_dim));
    w.set(format!("{a}.rope.freq_base"), Value::F32(spec.rope_base));
    w.set(format!("{a}.attention.layer_norm_rms_epsilon"), Value::F32(spec.rms_eps));
    w.set(format!("{a}.rope.dimension_count"), u32v(spec.head_dim));
    w.set(format!("{a}.vocab_size"), u32v(n_vocab));
    if let Some(s) = spec.swa {
        w.set(format!("{a}.attention.sliding_window"), u32v(s.window));
        w.set(format!("{a}.rope.freq_base_swa"), Value::F32(s.rope_base));
        if s.every != 6 {
            w.set(format!("{a}.attention.sliding_window_pattern"), u32v(s.every));
        }
    }
    if let Some(m) = spec.moe {
        w.set(format!("{a}.expert_count"), u32v(m.experts));
        w.set(format!("{a}.expert_used_count"), u32v(m.used));
        if spec.arch == SynthArch::Qwen3Moe {
            w.set(format!("{a}.expert_feed_forward_length"), u32v(m.ffn));
        }
    }
    w.set("general.file_type", Value::U32(ty.file_type()));
    w.set("general.quantization_version", Value::U32(2));
    for (k, v) in tokenizer {
        w.set(k, v);
    }
    for t in &plan {
        w.add_tensor(t.name.clone(), &t.dims, t.ty).with_context(|| format!("declaring {}", t.name))?;
    }
    let total: u64 = plan.iter().map(|t| t.ty.bytes_for(t.dims.iter().product()).unwrap_or(0)).sum();

    let bar = if progress {
        let pb = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
        pb.set_style(
            ProgressStyle::with_template("{msg} [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}").unwrap_or_else(|_| ProgressStyle::default_bar()).progress_chars("=> "),
        );
        pb.set_message(format!("synth {} {}", spec.name, ty));
        pb
    } else {
        ProgressBar::hidden()
    };
    // Where stderr is no terminal (a script's log), a line every tenth instead of the bar.
    let lines = progress && !std::io::IsTerminal::is_terminal(&std::io::stderr());
    let pb = Progress { bar, lines, what: format!("{} {}", spec.name, ty), total, done: std::cell::Cell::new(0), started: std::time::Instant::now() };

    let mut tmp = out.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let result = (|| -> Result<()> {
        let file = File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
        let mut bw = BufWriter::with_capacity(8 << 20, file);
        w.write(&mut bw, |i, dst| write_tensor(&plan[i], i as u64, seed, spec.weight_std, dst, &pb)).with_context(|| format!("writing {}", tmp.display()))?;
        let file = bw.into_inner().map_err(|e| e.into_error()).with_context(|| format!("writing {}", tmp.display()))?;
        file.sync_all().with_context(|| format!("syncing {}", tmp.display()))?;
        std::fs::rename(&tmp, out).with_context(|| format!("renaming {} to {}", tmp.display(), out.display()))?;
        Ok(())
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
        pb.bar.abandon();
    } else {
        pb.bar.finish();
    }
    result
}

/// Pad `tokenizer.ggml.tokens` (and the per-token arrays beside it) with unused `[PADn]` tokens
/// up to `min` entries.
fn pad_vocab(tokenizer: &mut [(String, Value)], min: usize) {
    let n = tokenizer.iter().find(|(k, _)| k == "tokenizer.ggml.tokens").and_then(|(_, v)| v.as_array()).map_or(0, <[Value]>::len);
    if n == 0 || n >= min {
        return;
    }
    for (k, v) in tokenizer.iter_mut() {
        let Value::Array(_, items) = v else { continue };
        match k.as_str() {
            "tokenizer.ggml.tokens" => items.extend((n..min).map(|i| Value::String(format!("[PAD{i}]")))),
            // 5: UNUSED.
            "tokenizer.ggml.token_type" => items.extend((n..min).map(|_| Value::I32(5))),
            "tokenizer.ggml.scores" => items.extend((n..min).map(|_| Value::F32(0.0))),
            _ => {}
        }
    }
}

/// The bytes written so far: a bar on a terminal, else (`lines`) a log line every tenth.
struct Progress {
    bar: ProgressBar,
    lines: bool,
    what: String,
    total: u64,
    done: std::cell::Cell<u64>,
    started: std::time::Instant,
}

impl Progress {
    fn inc(&self, n: u64) {
        self.bar.inc(n);
        let (before, after) = (self.done.get(), self.done.get() + n);
        self.done.set(after);
        let tenth = |b: u64| b * 10 / self.total.max(1);
        if self.lines && tenth(after) > tenth(before) {
            let secs = self.started.elapsed().as_secs_f64();
            tracing::info!("synth {}: {}% ({} of {} MB, {:.0} MB/s)", self.what, tenth(after) * 10, after >> 20, self.total >> 20, after as f64 / 1048576.0 / secs.max(1e-3));
        }
    }
}

/// Generate, quantize and write one tensor's bytes, a batch of row chunks at a time; the next
/// batch is computed while the previous one is written.
fn write_tensor(t: &PlannedTensor, index: u64, seed: u64, std: f32, dst: &mut dyn Write, pb: &Progress) -> std::io::Result<()> {
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
        fill_normal(&mut vals, chunk_seed(seed, index, c as u64), std);
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
        assert_eq!(SynthShape::parse("qwen3-30b-a3b").unwrap(), SynthShape::Qwen3Moe30B);
        assert_eq!(SynthShape::parse("qwen3moe-tiny").unwrap(), SynthShape::Qwen3MoeTiny);
        assert_eq!(SynthShape::parse("mixtral-tiny").unwrap(), SynthShape::MixtralTiny);
        assert_eq!(SynthShape::parse("gemma3-270m").unwrap(), SynthShape::Gemma3_270M);
        assert_eq!(SynthShape::parse("Gemma3-1B").unwrap(), SynthShape::Gemma3_1B);
        for name in SynthShape::NAMES {
            assert_eq!(SynthShape::parse(name).unwrap().name(), name);
        }
        assert_eq!(SynthType::parse("q8_0").unwrap(), SynthType::Q8_0);
        assert_eq!(SynthType::parse("Q4_K_M").unwrap(), SynthType::Q4_K_M);
        assert!(SynthType::parse("q4_0").is_err());
    }
}
