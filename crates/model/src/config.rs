use resin_gguf::{GgufFile, TensorInfo};

use crate::{ModelError, Result};

/// The architectures resin runs. Differences between them live here, not in forward passes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    Llama,
    Qwen2,
    Qwen3,
}

/// How rope pairs dimensions: adjacent pairs (llama, GGUF layout) or halves (qwen).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    Norm,
    Neox,
}

impl Arch {
    pub fn parse(name: &str) -> Result<Self> {
        match name {
            "llama" => Ok(Arch::Llama),
            "qwen2" => Ok(Arch::Qwen2),
            "qwen3" => Ok(Arch::Qwen3),
            other => Err(ModelError::UnsupportedArch(other.into())),
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
        }
    }
    pub fn rope_style(self) -> RopeStyle {
        match self {
            Arch::Llama => RopeStyle::Norm,
            Arch::Qwen2 | Arch::Qwen3 => RopeStyle::Neox,
        }
    }
}

/// Hyperparameters, checked for consistency with each other and the tensor table.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub arch: Arch,
    pub name: String,
    pub n_layer: usize,
    /// Hidden size.
    pub n_embd: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub n_ff: usize,
    pub vocab: usize,
    pub ctx_train: usize,
    pub rope_base: f32,
    /// Rotated dims per head (the rest pass through).
    pub rope_dims: usize,
    pub rms_eps: f32,
    /// Output projection shares the token embedding.
    pub tied_output: bool,
    /// q/k/v projections have biases (qwen2).
    pub qkv_bias: bool,
    /// q and k are RMS-normed per head before rope (qwen3).
    pub qk_norm: bool,
}

/// Tensor names of one layer.
#[derive(Debug, Clone)]
pub struct LayerNames {
    pub attn_norm: String,
    pub q: String,
    pub k: String,
    pub v: String,
    pub q_bias: String,
    pub k_bias: String,
    pub v_bias: String,
    pub q_norm: String,
    pub k_norm: String,
    pub attn_out: String,
    pub ffn_norm: String,
    pub gate: String,
    pub up: String,
    pub down: String,
}

impl LayerNames {
    pub fn new(l: usize) -> Self {
        let n = |s: &str| format!("blk.{l}.{s}");
        LayerNames {
            attn_norm: n("attn_norm.weight"),
            q: n("attn_q.weight"),
            k: n("attn_k.weight"),
            v: n("attn_v.weight"),
            q_bias: n("attn_q.bias"),
            k_bias: n("attn_k.bias"),
            v_bias: n("attn_v.bias"),
            q_norm: n("attn_q_norm.weight"),
            k_norm: n("attn_k_norm.weight"),
            attn_out: n("attn_output.weight"),
            ffn_norm: n("ffn_norm.weight"),
            gate: n("ffn_gate.weight"),
            up: n("ffn_up.weight"),
            down: n("ffn_down.weight"),
        }
    }
}

pub const TOKEN_EMBD: &str = "token_embd.weight";
pub const OUTPUT_NORM: &str = "output_norm.weight";
pub const OUTPUT: &str = "output.weight";

impl ModelConfig {
    pub fn from_gguf(f: &GgufFile) -> Result<Self> {
        let arch_name = f.get_str("general.architecture")?.ok_or_else(|| inv("general.architecture is missing"))?;
        let arch = Arch::parse(arch_name)?;
        let a = arch.name();
        let req = |k: &str| -> Result<usize> {
            let key = format!("{a}.{k}");
            let v = f.get_u64(&key)?.ok_or_else(|| inv(&format!("{key} is missing")))?;
            usize::try_from(v).ok().filter(|&v| v > 0 && v <= 1 << 24).ok_or_else(|| inv(&format!("{key} = {v} is out of range")))
        };
        let n_layer = req("block_count")?;
        let n_embd = req("embedding_length")?;
        let n_head = req("attention.head_count")?;
        let n_head_kv = match f.get_u64(&format!("{a}.attention.head_count_kv"))? {
            Some(v) => v as usize,
            None => n_head,
        };
        let n_ff = req("feed_forward_length")?;
        let ctx_train = req("context_length")?;
        let head_dim = match f.get_u64(&format!("{a}.attention.key_length"))? {
            Some(v) => v as usize,
            None => n_embd / n_head,
        };
        if n_head_kv == 0 || n_head % n_head_kv != 0 {
            return Err(inv(&format!("head_count {n_head} is not a multiple of head_count_kv {n_head_kv}")));
        }
        if head_dim == 0 || head_dim % 2 != 0 || head_dim > 1024 {
            return Err(inv(&format!("head dimension {head_dim} must be even and at most 1024")));
        }
        if let Some(vl) = f.get_u64(&format!("{a}.attention.value_length"))? {
            if vl as usize != head_dim {
                return Err(inv("key_length != value_length is not supported"));
            }
        }
        let rope_dims = match f.get_u64(&format!("{a}.rope.dimension_count"))? {
            Some(v) => v as usize,
            None => head_dim,
        };
        if rope_dims > head_dim || rope_dims % 2 != 0 {
            return Err(inv(&format!("rope.dimension_count {rope_dims} must be even and at most {head_dim}")));
        }
        let rope_base = f.get_f64(&format!("{a}.rope.freq_base"))?.unwrap_or(10_000.0) as f32;
        let rms_eps = f.get_f64(&format!("{a}.attention.layer_norm_rms_epsilon"))?.unwrap_or(1e-5) as f32;
        if !(rope_base > 0.0 && rope_base.is_finite() && rms_eps > 0.0 && rms_eps < 1.0) {
            return Err(inv("rope.freq_base must be positive and layer_norm_rms_epsilon in (0, 1)"));
        }
        let emb = tensor(f, TOKEN_EMBD)?;
        if emb.dims.len() != 2 || emb.dims[0] as usize != n_embd {
            return Err(inv(&format!("{TOKEN_EMBD} has shape {:?}, expected [{n_embd}, vocab]", emb.dims)));
        }
        let vocab = emb.dims[1] as usize;
        let tied_output = f.tensor(OUTPUT).is_none();
        let l0 = LayerNames::new(0);
        let qkv_bias = f.tensor(&l0.q_bias).is_some();
        let qk_norm = f.tensor(&l0.q_norm).is_some();
        let name = f.get_str("general.name")?.unwrap_or(arch_name).to_string();
        let cfg = ModelConfig { arch, name, n_layer, n_embd, n_head, n_head_kv, head_dim, n_ff, vocab, ctx_train, rope_base, rope_dims, rms_eps, tied_output, qkv_bias, qk_norm };
        cfg.check_tensors(f)?;
        Ok(cfg)
    }

    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }
    pub fn kv_dim(&self) -> usize {
        self.n_head_kv * self.head_dim
    }

    /// Every tensor the forward pass reads exists with the shape it expects.
    fn check_tensors(&self, f: &GgufFile) -> Result<()> {
        let (d, q, kv, ff) = (self.n_embd, self.q_dim(), self.kv_dim(), self.n_ff);
        let want = |name: &str, dims: &[usize]| -> Result<()> {
            let t = tensor(f, name)?;
            let got: Vec<usize> = t.dims.iter().map(|&x| x as usize).collect();
            if got != dims {
                return Err(inv(&format!("{name} has shape {got:?}, expected {dims:?}")));
            }
            Ok(())
        };
        want(OUTPUT_NORM, &[d])?;
        if !self.tied_output {
            want(OUTPUT, &[d, self.vocab])?;
        }
        for l in 0..self.n_layer {
            let n = LayerNames::new(l);
            want(&n.attn_norm, &[d])?;
            want(&n.q, &[d, q])?;
            want(&n.k, &[d, kv])?;
            want(&n.v, &[d, kv])?;
            want(&n.attn_out, &[q, d])?;
            want(&n.ffn_norm, &[d])?;
            want(&n.gate, &[d, ff])?;
            want(&n.up, &[d, ff])?;
            want(&n.down, &[ff, d])?;
            if self.qkv_bias {
                want(&n.q_bias, &[q])?;
                want(&n.k_bias, &[kv])?;
                want(&n.v_bias, &[kv])?;
            }
            if self.qk_norm {
                want(&n.q_norm, &[self.head_dim])?;
                want(&n.k_norm, &[self.head_dim])?;
            }
        }
        Ok(())
    }
}

fn tensor<'a>(f: &'a GgufFile, name: &str) -> Result<&'a TensorInfo> {
    f.tensor(name).ok_or_else(|| inv(&format!("tensor {name} is missing")))
}

fn inv(msg: &str) -> ModelError {
    ModelError::Invalid(msg.to_string())
}
