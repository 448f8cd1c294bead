use resin_gguf::{GgufFile, TensorInfo};

use crate::{ModelError, Result};

/// The architectures resin runs. Differences between them live here, not in forward passes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    Llama,
    Qwen2,
    Qwen3,
    /// Qwen3's mixture of experts (Qwen3-30B-A3B): qwen3 attention, routed expert FFNs.
    Qwen3Moe,
    Gemma3,
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
            "qwen3moe" => Ok(Arch::Qwen3Moe),
            "gemma3" => Ok(Arch::Gemma3),
            other => Err(ModelError::UnsupportedArch(other.into())),
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
            Arch::Qwen3Moe => "qwen3moe",
            Arch::Gemma3 => "gemma3",
        }
    }
    pub fn rope_style(self) -> RopeStyle {
        match self {
            Arch::Llama => RopeStyle::Norm,
            Arch::Qwen2 | Arch::Qwen3 | Arch::Qwen3Moe | Arch::Gemma3 => RopeStyle::Neox,
        }
    }
}

/// The activation of the FFN's gate branch (its product with the up branch is the FFN's inner row).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FfnAct {
    /// silu(gate) * up (llama, qwen).
    Silu,
    /// gelu(gate) * up with GELU's tanh approximation (gemma).
    GeluTanh,
}

/// Sliding-window attention (gemma3): the layers marked in `layers` attend only to the last
/// `window` keys (the row's own included) and rope with their own base; the others attend to
/// every key and rope with the model's base.
#[derive(Debug, Clone, PartialEq)]
pub struct SlidingWindow {
    pub window: usize,
    /// One flag a layer: true for a sliding-window layer.
    pub layers: Vec<bool>,
    pub rope_base: f32,
}

/// A mixture-of-experts FFN (qwen3moe; llama files with experts, as Mixtral's are): a router
/// (`ffn_gate_inp`, [n_embd] -> [n_expert] logits) picks `n_expert_used` of `n_expert` SwiGLU
/// experts stacked in `ffn_{gate,up,down}_exps`; the row's FFN output is their outputs weighted.
///
/// The weights are llama.cpp's `build_moe_ffn` with softmax gating and `norm_w` (both families
/// pass it true): softmax over all router logits, the `n_expert_used` largest probabilities
/// (ties to the lower expert index), those probabilities divided by their sum (the sum clamped
/// below at 2^-14, as llama.cpp does against a division by zero).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Moe {
    pub n_expert: usize,
    pub n_expert_used: usize,
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
    /// FFN length: of the dense FFN, or of each expert when `moe` is set.
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
    /// q and k are RMS-normed per head before rope (qwen3, gemma3).
    pub qk_norm: bool,
    /// The token embedding is multiplied by this before the first layer (gemma: sqrt(n_embd)).
    pub embd_scale: f32,
    /// Attention scores are q·k times this.
    pub attn_scale: f32,
    /// The attention output and the FFN output are RMS-normed before their residual adds (gemma3).
    pub post_norms: bool,
    pub ffn_act: FfnAct,
    /// Sliding-window layers beside global ones (gemma3), None when every layer is global.
    pub swa: Option<SlidingWindow>,
    /// Final logits become cap * tanh(logit / cap) (the file's `final_logit_softcapping`).
    pub logit_softcap: Option<f32>,
    /// Routed expert FFNs in place of the dense FFN, None for a dense model.
    pub moe: Option<Moe>,
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
    /// gemma3's norms of the attention output and of the FFN output.
    pub attn_post_norm: String,
    pub ffn_post_norm: String,
    pub gate: String,
    pub up: String,
    pub down: String,
    /// The router and the stacked experts of a mixture-of-experts layer.
    pub gate_inp: String,
    pub gate_exps: String,
    pub up_exps: String,
    pub down_exps: String,
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
            attn_post_norm: n("post_attention_norm.weight"),
            ffn_post_norm: n("post_ffw_norm.weight"),
            gate: n("ffn_gate.weight"),
            up: n("ffn_up.weight"),
            down: n("ffn_down.weight"),
            gate_inp: n("ffn_gate_inp.weight"),
            gate_exps: n("ffn_gate_exps.weight"),
            up_exps: n("ffn_up_exps.weight"),
            down_exps: n("ffn_down_exps.weight"),
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
        let moe = moe(f, arch, a)?;
        // A qwen3moe file's `feed_forward_length` is the dense FFN its experts replace; each
        // expert's length is `expert_feed_forward_length` (Mixtral's experts are its
        // `feed_forward_length` long).
        let n_ff = match (moe, arch) {
            (Some(_), Arch::Qwen3Moe) => req("expert_feed_forward_length")?,
            _ => req("feed_forward_length")?,
        };
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
        let gemma = arch == Arch::Gemma3;
        // Gemma scales the embedding by sqrt(n_embd), rounded to f32 as llama.cpp's graph does.
        let embd_scale = if gemma { (n_embd as f32).sqrt() } else { 1.0 };
        // Gemma 3 scales queries by 1/sqrt(query_pre_attn_scalar), which the GGUF does not carry:
        // it is the head dimension for every size but the 27B (62 layers), whose scalar is
        // n_embd / n_head (llama.cpp decides the same way).
        let attn_scale = if gemma && n_layer == 62 { 1.0 / ((n_embd / n_head) as f32).sqrt() } else { 1.0 / (head_dim as f32).sqrt() };
        let swa = if gemma { sliding_window(f, a, n_layer)? } else { None };
        let logit_softcap = match f.get_f64(&format!("{a}.final_logit_softcapping"))? {
            // 0 is how a converter writes "none".
            None | Some(0.0) => None,
            Some(c) if c > 0.0 && c.is_finite() => Some(c as f32),
            Some(c) => return Err(inv(&format!("{a}.final_logit_softcapping = {c} must be positive"))),
        };
        // The larger Gemma 3 files stretch their global layers' rope (linear, by 8): resin has no
        // rope scaling, so such a file is refused rather than run with the wrong positions.
        if let (true, Some(kind)) = (gemma, f.get_str(&format!("{a}.rope.scaling.type"))?) {
            let factor = f.get_f64(&format!("{a}.rope.scaling.factor"))?.unwrap_or(1.0);
            if kind != "none" && factor != 1.0 {
                return Err(inv(&format!("rope scaling {kind:?} by {factor} is not supported")));
            }
        }
        let cfg = ModelConfig {
            arch,
            name,
            n_layer,
            n_embd,
            n_head,
            n_head_kv,
            head_dim,
            n_ff,
            vocab,
            ctx_train,
            rope_base,
            rope_dims,
            rms_eps,
            tied_output,
            qkv_bias,
            qk_norm,
            embd_scale,
            attn_scale,
            post_norms: gemma,
            ffn_act: if gemma { FfnAct::GeluTanh } else { FfnAct::Silu },
            swa,
            logit_softcap,
            moe,
        };
        if gemma && !qk_norm {
            return Err(inv("a gemma3 file needs attn_q_norm / attn_k_norm tensors"));
        }
        if arch == Arch::Qwen3Moe && !qk_norm {
            return Err(inv("a qwen3moe file needs attn_q_norm / attn_k_norm tensors"));
        }
        cfg.check_tensors(f)?;
        Ok(cfg)
    }

    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }
    pub fn kv_dim(&self) -> usize {
        self.n_head_kv * self.head_dim
    }

    /// The keys layer `l` sees: its last `window` (a sliding-window layer), or all (None).
    pub fn layer_window(&self, l: usize) -> Option<usize> {
        self.swa.as_ref().filter(|s| s.layers.get(l).copied().unwrap_or(false)).map(|s| s.window)
    }

    /// The rope base of layer `l`: the one its table in [`rope_bases`](Self::rope_bases) holds.
    pub fn layer_rope_base(&self, l: usize) -> f32 {
        self.rope_bases().get(self.layer_rope_table(l)).copied().unwrap_or(self.rope_base)
    }

    /// The rope bases the layers use, each once, global first: each home builds one table a
    /// base, in this order.
    pub fn rope_bases(&self) -> Vec<f32> {
        let mut v = vec![self.rope_base];
        if let Some(s) = &self.swa {
            if s.layers.iter().any(|&b| b) && s.rope_base != self.rope_base {
                v.push(s.rope_base);
            }
        }
        v
    }

    /// Which of [`rope_bases`](Self::rope_bases) layer `l` ropes with. Both homes pick each
    /// layer's table through this (and its keys through [`layer_window`](Self::layer_window)),
    /// so one test of the two covers the assignment every home runs.
    pub fn layer_rope_table(&self, l: usize) -> usize {
        match &self.swa {
            // A sliding layer's base has a table of its own only where it differs.
            Some(s) if self.layer_window(l).is_some() && s.rope_base != self.rope_base => 1,
            _ => 0,
        }
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
            match self.moe {
                None => {
                    want(&n.gate, &[d, ff])?;
                    want(&n.up, &[d, ff])?;
                    want(&n.down, &[ff, d])?;
                }
                Some(m) => {
                    let e = m.n_expert;
                    if f.tensor(&n.gate_exps).is_none() && f.tensor(&format!("blk.{l}.ffn_gate.0.weight")).is_some() {
                        return Err(inv(&format!("layer {l} stores its experts one tensor each (blk.{l}.ffn_gate.0.weight, ...): resin reads the stacked {} only; convert the file again with a current llama.cpp", n.gate_exps)));
                    }
                    want(&n.gate_inp, &[d, e])?;
                    want(&n.gate_exps, &[d, ff, e])?;
                    want(&n.up_exps, &[d, ff, e])?;
                    want(&n.down_exps, &[ff, d, e])?;
                }
            }
            if self.qkv_bias {
                want(&n.q_bias, &[q])?;
                want(&n.k_bias, &[kv])?;
                want(&n.v_bias, &[kv])?;
            }
            if self.qk_norm {
                want(&n.q_norm, &[self.head_dim])?;
                want(&n.k_norm, &[self.head_dim])?;
            }
            if self.post_norms {
                want(&n.attn_post_norm, &[d])?;
                want(&n.ffn_post_norm, &[d])?;
            }
        }
        Ok(())
    }
}

/// The experts of a MoE file: `{arch}.expert_count` and `{arch}.expert_used_count`. qwen3moe
/// needs them; a llama file without them (or with a count of 0) is dense, as llama.cpp reads it.
fn moe(f: &GgufFile, arch: Arch, a: &str) -> Result<Option<Moe>> {
    let (ck, uk) = (format!("{a}.expert_count"), format!("{a}.expert_used_count"));
    let count = |k: &str| -> Result<Option<u64>> {
        match f.get(k) {
            None => Ok(None),
            Some(v) if v.as_array().is_some() => Err(inv(&format!("{k} is an array (a count per layer): resin takes one count for every layer"))),
            Some(_) => Ok(f.get_u64(k)?),
        }
    };
    let (n_expert, n_used) = (count(&ck)?, count(&uk)?);
    let n_expert = match (arch, n_expert) {
        (Arch::Qwen3Moe, None | Some(0)) => return Err(inv(&format!("{ck} is missing or 0 (a qwen3moe file has experts)"))),
        (Arch::Llama, None | Some(0)) => return Ok(None),
        (Arch::Qwen3Moe | Arch::Llama, Some(n)) => n,
        (_, _) => return Ok(None),
    };
    if n_expert > 1 << 16 {
        return Err(inv(&format!("{ck} = {n_expert} is out of range")));
    }
    let n_used = n_used.ok_or_else(|| inv(&format!("{uk} is missing (a file with {ck} = {n_expert})")))?;
    if n_used == 0 || n_used > n_expert {
        return Err(inv(&format!("{uk} = {n_used} must be between 1 and {ck} = {n_expert}")));
    }
    Ok(Some(Moe { n_expert: n_expert as usize, n_expert_used: n_used as usize }))
}

/// gemma3's sliding-window layers: `attention.sliding_window` keys, on the layers that
/// `attention.sliding_window_pattern` marks (an array of flags), or every layer but each
/// n-th when it is a number n (gemma3's default n is 6: five sliding layers, then a global
/// one), with `rope.freq_base_swa` (default 10,000). No window: every layer is global.
fn sliding_window(f: &GgufFile, a: &str, n_layer: usize) -> Result<Option<SlidingWindow>> {
    let window = match f.get_u64(&format!("{a}.attention.sliding_window"))? {
        None | Some(0) => return Ok(None),
        Some(w) => usize::try_from(w).map_err(|_| inv(&format!("{a}.attention.sliding_window = {w} is out of range")))?,
    };
    let key = format!("{a}.attention.sliding_window_pattern");
    let every = |n: usize| -> Vec<bool> { (0..n_layer).map(|l| n == 0 || l % n < n - 1).collect() };
    let layers = match f.get(&key) {
        None => every(6),
        Some(v) => match v.as_array() {
            Some(arr) => {
                let flags: Option<Vec<bool>> = arr.iter().map(|x| x.as_bool()).collect();
                let flags = flags.ok_or_else(|| inv(&format!("{key} is an array of something other than booleans")))?;
                if flags.len() < n_layer {
                    return Err(inv(&format!("{key} has {} flags for {n_layer} layers", flags.len())));
                }
                flags[..n_layer].to_vec()
            }
            None => every(v.as_u64().ok_or_else(|| inv(&format!("{key} is neither a number nor an array of flags")))? as usize),
        },
    };
    let rope_base = f.get_f64(&format!("{a}.rope.freq_base_swa"))?.unwrap_or(10_000.0) as f32;
    if !(rope_base > 0.0 && rope_base.is_finite()) {
        return Err(inv(&format!("{a}.rope.freq_base_swa = {rope_base} must be positive")));
    }
    Ok(Some(SlidingWindow { window, layers, rope_base }))
}

fn tensor<'a>(f: &'a GgufFile, name: &str) -> Result<&'a TensorInfo> {
    f.tensor(name).ok_or_else(|| inv(&format!("tensor {name} is missing")))
}

fn inv(msg: &str) -> ModelError {
    ModelError::Invalid(msg.to_string())
}
