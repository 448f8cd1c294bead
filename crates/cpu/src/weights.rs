//! The model's tensors as the forward pass reads them. A matrix whose format has a canonical
//! expression (docs/canonical-order.md) is laid out once, at load, in the canonical product's
//! tiles (`CanonMatrix`, owned); the others (float formats, the rarer quants) and the token
//! embedding are read in place from the mapped file. Norms and biases are small and kept as
//! f32.

use std::sync::Arc;

use resin_gguf::{formats, GgmlType, GgufFile, TensorInfo};
use resin_model::{LayerNames, ModelConfig};

use crate::home::CpuError;
use crate::kernels::{canon_takes, CanonMatrix, QMatrix};

/// Where a weight matrix lives in the file: `rows` rows of `cols` values in format `ty`.
#[derive(Debug, Clone, Copy)]
pub struct MatRef {
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    start: usize,
    len: usize,
    /// Its tiles in `Weights::packed` where it takes the canonical product (a stacked
    /// matrix's experts are consecutive, the first here).
    canon: Option<usize>,
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
        MatRef { ty: m.ty, rows, cols: m.cols, start: m.start + e * len, len, canon: m.canon.map(|c| c + e) }
    }
}

/// Told the bytes of weights laid out so far and the total, as packing goes.
#[derive(Clone)]
pub struct PackProgress(pub Arc<dyn Fn(u64, u64) + Send + Sync>);

impl std::fmt::Debug for PackProgress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PackProgress")
    }
}

/// The tiles are owned memory: a model that does not fit is refused before it is laid out,
/// rather than swapping or being killed halfway.
fn check_memory(need: u64) -> Result<(), CpuError> {
    let Ok(info) = std::fs::read_to_string("/proc/meminfo") else { return Ok(()) };
    let avail = info.lines().find_map(|l| l.strip_prefix("MemAvailable:")).and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok());
    match avail {
        Some(kb) if need > kb * 1024 => Err(CpuError::Model(format!(
            "the CPU home lays its weights out in {:.1} GiB of memory and {:.1} GiB is available",
            need as f64 / (1u64 << 30) as f64,
            (kb * 1024) as f64 / (1u64 << 30) as f64
        ))),
        _ => Ok(()),
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
    /// The matrices that take the canonical product, in tiles.
    packed: Vec<CanonMatrix>,
}

impl Weights {
    pub fn load(file: Arc<GgufFile>, cfg: &ModelConfig, progress: Option<&PackProgress>) -> Result<Self, CpuError> {
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
        let mut w = Weights { embd, layers, output_norm, output, file, packed: Vec::new() };
        w.pack(progress)?;
        tracing::debug!(matrices = w.packed.len(), bytes = w.packed.iter().map(|m| m.size()).sum::<usize>(), "weights laid out in canonical tiles");
        Ok(w)
    }

    /// Lay every matrix that takes the canonical product out in tiles (each expert of a
    /// stacked one apart, so an expert's rows start a tile), reporting bytes done of the total.
    fn pack(&mut self, progress: Option<&PackProgress>) -> Result<(), CpuError> {
        // Each matrix with the count of matrices stacked in it.
        let mut refs: Vec<(&mut MatRef, usize)> = Vec::new();
        for l in &mut self.layers {
            refs.extend([(&mut l.q, 1), (&mut l.k, 1), (&mut l.v, 1), (&mut l.attn_out, 1)]);
            match &mut l.ffn {
                Ffn::Dense { gate, up, down } => refs.extend([(gate, 1), (up, 1), (down, 1)]),
                // The router reads the f32 normed rows (as the Vulkan home's does).
                Ffn::Moe(m) => refs.extend([(&mut m.gate, m.n_expert), (&mut m.up, m.n_expert), (&mut m.down, m.n_expert)]),
            }
        }
        refs.push((&mut self.output, 1));
        let bytes = self.file.bytes();
        let q = |m: &MatRef| QMatrix { ty: m.ty, rows: m.rows, cols: m.cols, data: &bytes[m.start..m.start + m.len] };
        let takes: Vec<bool> = refs.iter().map(|(m, _)| canon_takes(&q(m))).collect();
        let total: u64 = refs.iter().zip(&takes).filter(|(_, t)| **t).map(|((m, _), _)| m.len as u64).sum();
        check_memory(total)?;
        let mut done = 0u64;
        for ((m, parts), take) in refs.into_iter().zip(takes) {
            if !take {
                continue;
            }
            m.canon = Some(self.packed.len());
            let tiles = CanonMatrix::pack_stack(&q(m), parts)?;
            self.packed.extend(tiles);
            // The tiles are what the passes read: the file's copy need not stay resident.
            self.file.release(m.start, m.len);
            done += m.len as u64;
            if let Some(p) = progress {
                (p.0)(done, total);
            }
        }
        Ok(())
    }

    pub fn mat(&self, m: &MatRef) -> QMatrix<'_> {
        QMatrix { ty: m.ty, rows: m.rows, cols: m.cols, data: &self.file.bytes()[m.start..m.start + m.len] }
    }

    /// `m` in the canonical product's tiles, where it takes that product.
    pub fn canon(&self, m: &MatRef) -> Option<&CanonMatrix> {
        m.canon.map(|c| &self.packed[c])
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
    Ok(MatRef { ty: t.ty, rows, cols, start: (f.data_offset + t.offset) as usize, len: t.size as usize, canon: None })
}

/// A 3-D tensor of `n` matrices stacked along its last dimension, read as one matrix of all
/// their rows.
fn stacked(f: &GgufFile, name: &str, n: usize) -> Result<MatRef, CpuError> {
    let t = info(f, name)?;
    if t.dims.len() != 3 || t.dims[2] as usize != n {
        return Err(CpuError::Model(format!("{name} is not {n} stacked matrices: {:?}", t.dims)));
    }
    let (rows, cols) = t.rows_cols();
    Ok(MatRef { ty: t.ty, rows, cols, start: (f.data_offset + t.offset) as usize, len: t.size as usize, canon: None })
}

fn vector(f: &GgufFile, name: &str) -> Result<Vec<f32>, CpuError> {
    let t = info(f, name)?;
    let mut v = vec![0f32; t.n_elements() as usize];
    formats::dequantize(t.ty, f.tensor_data(t), &mut v)?;
    Ok(v)
}
