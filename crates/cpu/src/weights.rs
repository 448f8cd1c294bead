//! The model's tensors as the forward pass reads them: matrices stay in their GGUF formats
//! (read in place from the mapped file); norms and biases are small and kept as f32.

use std::sync::Arc;

use resin_gguf::{formats, GgmlType, GgufFile, TensorInfo};
use resin_model::{LayerNames, ModelConfig};

use crate::home::CpuError;
use crate::kernels::QMatrix;

/// Where a weight matrix lives in the file: `rows` rows of `cols` values in format `ty`.
#[derive(Debug, Clone, Copy)]
pub struct MatRef {
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    start: usize,
    len: usize,
}

pub struct Layer {
    pub attn_norm: Vec<f32>,
    pub q: MatRef,
    pub k: MatRef,
    pub v: MatRef,
    /// q/k/v biases (qwen2), empty when absent.
    pub q_bias: Vec<f32>,
    pub k_bias: Vec<f32>,
    pub v_bias: Vec<f32>,
    /// Per-head q/k RMS-norm weights (qwen3), empty when absent.
    pub q_norm: Vec<f32>,
    pub k_norm: Vec<f32>,
    pub attn_out: MatRef,
    pub ffn_norm: Vec<f32>,
    /// Norms of the attention output and of the FFN output (gemma3), empty when absent.
    pub attn_post_norm: Vec<f32>,
    pub ffn_post_norm: Vec<f32>,
    pub ffn: Ffn,
}

/// A layer's FFN: one for every row, or routed experts.
pub enum Ffn {
    Dense { gate: MatRef, up: MatRef, down: MatRef },
    Moe(MoeFfn),
}

/// A mixture-of-experts FFN: the router and the experts' matrices, each stacked expert after
/// expert as the GGUF stores them ([n_expert][n_ff][n_embd] for gate and up, [n_expert][n_embd][n_ff]
/// for down).
pub struct MoeFfn {
    /// [n_expert, n_embd]: one logit an expert.
    pub router: MatRef,
    pub gate: MatRef,
    pub up: MatRef,
    pub down: MatRef,
    pub n_expert: usize,
}

impl MoeFfn {
    /// Expert `e`'s slice of a stacked matrix: its rows only, so a row reads no other expert.
    pub fn expert(&self, m: &MatRef, e: usize) -> MatRef {
        let (rows, len) = (m.rows / self.n_expert, m.len / self.n_expert);
        MatRef { ty: m.ty, rows, cols: m.cols, start: m.start + e * len, len }
    }
}

pub struct Weights {
    file: Arc<GgufFile>,
    /// Token embedding, [vocab, n_embd].
    pub embd: MatRef,
    pub layers: Vec<Layer>,
    pub output_norm: Vec<f32>,
    /// Classifier, [vocab, n_embd] (the embedding itself when tied).
    pub output: MatRef,
}

impl Weights {
    pub fn load(file: Arc<GgufFile>, cfg: &ModelConfig) -> Result<Self, CpuError> {
        let f = &*file;
        if let Some(m) = cfg.moe {
            if m.n_expert_used == 0 || m.n_expert_used > m.n_expert {
                return Err(CpuError::Model(format!("{} experts a row of {}", m.n_expert_used, m.n_expert)));
            }
        }
        let layers = (0..cfg.n_layer)
            .map(|l| {
                let n = LayerNames::new(l);
                let opt = |name: &str, on: bool| if on { vector(f, name) } else { Ok(Vec::new()) };
                Ok(Layer {
                    attn_norm: vector(f, &n.attn_norm)?,
                    q: matrix(f, &n.q)?,
                    k: matrix(f, &n.k)?,
                    v: matrix(f, &n.v)?,
                    q_bias: opt(&n.q_bias, cfg.qkv_bias)?,
                    k_bias: opt(&n.k_bias, cfg.qkv_bias)?,
                    v_bias: opt(&n.v_bias, cfg.qkv_bias)?,
                    q_norm: opt(&n.q_norm, cfg.qk_norm)?,
                    k_norm: opt(&n.k_norm, cfg.qk_norm)?,
                    attn_out: matrix(f, &n.attn_out)?,
                    ffn_norm: vector(f, &n.ffn_norm)?,
                    attn_post_norm: opt(&n.attn_post_norm, cfg.post_norms)?,
                    ffn_post_norm: opt(&n.ffn_post_norm, cfg.post_norms)?,
                    ffn: match cfg.moe {
                        None => Ffn::Dense { gate: matrix(f, &n.gate)?, up: matrix(f, &n.up)?, down: matrix(f, &n.down)? },
                        Some(m) => Ffn::Moe(MoeFfn {
                            router: matrix(f, &n.gate_inp)?,
                            gate: stacked(f, &n.gate_exps, m.n_expert)?,
                            up: stacked(f, &n.up_exps, m.n_expert)?,
                            down: stacked(f, &n.down_exps, m.n_expert)?,
                            n_expert: m.n_expert,
                        }),
                    },
                })
            })
            .collect::<Result<Vec<_>, CpuError>>()?;
        let embd = matrix(f, resin_model::TOKEN_EMBD)?;
        let output = if cfg.tied_output { embd } else { matrix(f, resin_model::OUTPUT)? };
        let output_norm = vector(f, resin_model::OUTPUT_NORM)?;
        Ok(Weights { embd, layers, output_norm, output, file })
    }

    pub fn mat(&self, m: &MatRef) -> QMatrix<'_> {
        QMatrix { ty: m.ty, rows: m.rows, cols: m.cols, data: &self.file.bytes()[m.start..m.start + m.len] }
    }

    /// Dequantize one embedding row into `out` (n_embd values).
    pub fn embed(&self, token: u32, out: &mut [f32]) -> Result<(), CpuError> {
        let m = &self.embd;
        let row_bytes = m.len / m.rows;
        let start = m.start + token as usize * row_bytes;
        formats::dequantize(m.ty, &self.file.bytes()[start..start + row_bytes], out)?;
        Ok(())
    }
}

fn info<'a>(f: &'a GgufFile, name: &str) -> Result<&'a TensorInfo, CpuError> {
    f.tensor(name).ok_or_else(|| CpuError::Model(format!("tensor {name} is missing")))
}

fn matrix(f: &GgufFile, name: &str) -> Result<MatRef, CpuError> {
    let t = info(f, name)?;
    if t.dims.len() != 2 {
        return Err(CpuError::Model(format!("{name} is not a matrix: {:?}", t.dims)));
    }
    let (rows, cols) = t.rows_cols();
    Ok(MatRef { ty: t.ty, rows, cols, start: (f.data_offset + t.offset) as usize, len: t.size as usize })
}

/// A 3-D tensor of `n` matrices stacked along its last dimension, read as one matrix of all
/// their rows.
fn stacked(f: &GgufFile, name: &str, n: usize) -> Result<MatRef, CpuError> {
    let t = info(f, name)?;
    if t.dims.len() != 3 || t.dims[2] as usize != n {
        return Err(CpuError::Model(format!("{name} is not {n} stacked matrices: {:?}", t.dims)));
    }
    let (rows, cols) = t.rows_cols();
    Ok(MatRef { ty: t.ty, rows, cols, start: (f.data_offset + t.offset) as usize, len: t.size as usize })
}

fn vector(f: &GgufFile, name: &str) -> Result<Vec<f32>, CpuError> {
    let t = info(f, name)?;
    let mut v = vec![0f32; t.n_elements() as usize];
    formats::dequantize(t.ty, f.tensor_data(t), &mut v)?;
    Ok(v)
}
