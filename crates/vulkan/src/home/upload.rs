//! The weights on the device: each matrix in its GGUF block format, in parts of whole rows
//! that fit the device's storage range; norms, biases and the rope table as f32.

use std::sync::Arc;

use resin_gguf::{formats, GgmlType, GgufFile};
use resin_model::{LayerNames, ModelConfig};

use crate::buffers::{f32_bytes, Buffer, Location};
use crate::device::Gpu;
use crate::pipelines::Bind;
use crate::VkError;

use super::{Plan, VulkanOptions};

/// A weight matrix on the device: `rows` x `cols` of `ty`, in parts of whole rows.
pub(super) struct Mat {
    pub(super) ty: GgmlType,
    pub(super) rows: usize,
    pub(super) cols: usize,
    pub(super) row_bytes: usize,
    pub(super) parts: Vec<Part>,
}

/// Rows `r0 .. r0 + rows` of a matrix, `offset` bytes into a buffer (which a gate matrix
/// shares with its up matrix).
pub(super) struct Part {
    pub(super) buf: Arc<Buffer>,
    pub(super) offset: u64,
    pub(super) r0: usize,
    pub(super) rows: usize,
    pub(super) bytes: u64,
}

impl Part {
    pub(super) fn bind(&self) -> Bind<'_> {
        Bind { buf: &self.buf, offset: self.offset, range: self.bytes }
    }
}

impl Mat {
    /// Where gate (self) and `up` lie in one buffer, up right after gate: that buffer's range
    /// of both and the byte offset of up's rows in it (the SwiGLU product reads both).
    pub(super) fn pair_with<'a>(&'a self, up: &Mat) -> Option<(Bind<'a>, u32)> {
        let ([g], [u]) = (&self.parts[..], &up.parts[..]) else { return None };
        let same = Arc::ptr_eq(&g.buf, &u.buf) && self.ty == up.ty && self.rows == up.rows && self.cols == up.cols && u.offset == g.offset + g.bytes;
        same.then(|| (Bind { buf: &g.buf, offset: g.offset, range: g.bytes + u.bytes }, g.bytes as u32))
    }
}

pub(super) struct Layer {
    pub(super) attn_norm: Buffer,
    pub(super) q: Mat,
    pub(super) k: Mat,
    pub(super) v: Mat,
    /// [q_dim | kv_dim | kv_dim] biases (or a dummy word when the model has none).
    pub(super) bias: Buffer,
    /// [head_dim | head_dim] q and k norm weights (or a dummy).
    pub(super) qk_norm: Buffer,
    pub(super) attn_out: Mat,
    pub(super) ffn_norm: Buffer,
    /// gemma3's norms of the attention output and of the FFN output.
    pub(super) attn_post_norm: Option<Buffer>,
    pub(super) ffn_post_norm: Option<Buffer>,
    /// The FFN's matrices; of a mixture-of-experts layer, the stacked experts (each expert's
    /// `rows / n_expert` rows one after another, in one part: see plan.rs).
    pub(super) gate: Mat,
    pub(super) up: Mat,
    pub(super) down: Mat,
    /// A mixture-of-experts layer's router, [n_expert][n_embd] as f32.
    pub(super) router: Option<Buffer>,
    pub(super) mk: Buffer,
    pub(super) mv: Buffer,
}

pub(super) fn tensor<'a>(f: &'a GgufFile, name: &str) -> Result<&'a resin_gguf::TensorInfo, VkError> {
    f.tensor(name).ok_or_else(|| VkError::Model(format!("tensor {name} is missing")))
}

pub(super) fn vector(f: &GgufFile, name: &str) -> Result<Vec<f32>, VkError> {
    let t = tensor(f, name)?;
    let mut v = vec![0f32; t.n_elements() as usize];
    formats::dequantize(t.ty, f.tensor_data(t), &mut v).map_err(|e| VkError::Model(format!("{name}: {e}")))?;
    Ok(v)
}

/// Write rows `r0 .. r0 + nr` of tensor `t` into `b` from byte `at`, in the device layout.
fn write_rows(b: &mut Buffer, at: u64, f: &GgufFile, t: &resin_gguf::TensorInfo, r0: usize, nr: usize) -> Result<(), VkError> {
    let (rows, cols) = t.rows_cols();
    let data = f.tensor_data(t);
    let src_row = data.len() / rows.max(1);
    let row_bytes = crate::layout::device_row_bytes(t.ty, cols, src_row);
    // Rows rearranged and written this many at a time (one 64 MiB staging copy each).
    let chunk = ((64usize << 20) / row_bytes.max(1)).max(1);
    let mut c0 = 0;
    while c0 < nr {
        let cn = chunk.min(nr - c0);
        let src = &data[(r0 + c0) * src_row..(r0 + c0 + cn) * src_row];
        b.write(at + (c0 * row_bytes) as u64, &crate::layout::device_rows(t.ty, cols, src))?;
        c0 += cn;
    }
    Ok(())
}

fn device_row_bytes(f: &GgufFile, t: &resin_gguf::TensorInfo) -> usize {
    let (rows, cols) = t.rows_cols();
    crate::layout::device_row_bytes(t.ty, cols, f.tensor_data(t).len() / rows.max(1))
}

/// Upload a matrix in parts of whole rows that each fit the device's storage range, its rows
/// in the device layout (`layout`).
pub(super) fn upload_mat(gpu: &Arc<Gpu>, f: &GgufFile, name: &str) -> Result<Mat, VkError> {
    let t = tensor(f, name)?;
    let (rows, cols) = t.rows_cols();
    let row_bytes = device_row_bytes(f, t);
    let per = (gpu.info.max_storage_range as usize / row_bytes.max(1)).max(1);
    let mut parts = Vec::new();
    let mut r0 = 0;
    while r0 < rows {
        let nr = per.min(rows - r0);
        let bytes = (nr * row_bytes) as u64;
        let mut b = Buffer::new(gpu, bytes, Location::Device)?;
        write_rows(&mut b, 0, f, t, r0, nr)?;
        parts.push(Part { buf: Arc::new(b), offset: 0, r0, rows: nr, bytes });
        r0 += nr;
    }
    Ok(Mat { ty: t.ty, rows, cols, row_bytes, parts })
}

/// Upload the gate and up matrices: in one buffer, up's rows right after gate's (what the
/// SwiGLU product reads), where they have one format and shape and both fit one binding;
/// else each on its own.
pub(super) fn upload_gate_up(gpu: &Arc<Gpu>, f: &GgufFile, gate: &str, up: &str) -> Result<(Mat, Mat), VkError> {
    let (tg, tu) = (tensor(f, gate)?, tensor(f, up)?);
    let (rows, cols) = tg.rows_cols();
    let row_bytes = device_row_bytes(f, tg);
    let bytes = (rows * row_bytes) as u64;
    let one = tg.ty == tu.ty && tg.rows_cols() == tu.rows_cols() && 2 * bytes <= gpu.info.max_storage_range && bytes.is_multiple_of(gpu.info.storage_align.max(16));
    if !one {
        return Ok((upload_mat(gpu, f, gate)?, upload_mat(gpu, f, up)?));
    }
    let mut b = Buffer::new(gpu, 2 * bytes, Location::Device)?;
    write_rows(&mut b, 0, f, tg, 0, rows)?;
    write_rows(&mut b, bytes, f, tu, 0, rows)?;
    let buf = Arc::new(b);
    let mat = |ty, offset| Mat { ty, rows, cols, row_bytes, parts: vec![Part { buf: buf.clone(), offset, r0: 0, rows, bytes }] };
    Ok((mat(tg.ty, 0), mat(tu.ty, bytes)))
}

/// The CPU home's rope table: cos and sin of pos * base^(-2i/dims), in f64, cast to f32.
pub fn rope_table(n_ctx: usize, rope_dims: usize, base: f32) -> Vec<f32> {
    let inv: Vec<f64> = (0..rope_dims / 2).map(|i| (base as f64).powf(-2.0 * i as f64 / rope_dims as f64)).collect();
    let mut t = Vec::with_capacity(n_ctx * rope_dims);
    for p in 0..n_ctx {
        for f in &inv {
            let (s, c) = (p as f64 * f).sin_cos();
            t.push(c as f32);
            t.push(s as f32);
        }
    }
    t
}

/// Everything of the model on the device, as a pass reads it.
pub(super) struct Weights {
    pub(super) layers: Vec<Layer>,
    pub(super) embd: Mat,
    /// None when tied to the embedding.
    pub(super) output: Option<Mat>,
    pub(super) output_norm: Buffer,
    /// A rope table of `plan.n_ctx` positions a base of `cfg.rope_bases()`, in its order.
    pub(super) ropes: Vec<Buffer>,
}

impl Weights {
    /// The rope table layer `l` reads (`cfg.layer_rope_table`, as the CPU home picks it).
    pub(super) fn rope_for(&self, cfg: &ModelConfig, l: usize) -> Result<&Buffer, VkError> {
        self.ropes.get(cfg.layer_rope_table(l)).ok_or_else(|| VkError::Model(format!("layer {l} has no rope table")))
    }
}

/// Upload the model as `plan` says, each layer's K/V mirror with it, reporting progress to
/// `opts.progress` (or a log line every 10 %).
pub(super) fn upload(gpu: &Arc<Gpu>, f: &GgufFile, cfg: &ModelConfig, plan: &Plan, opts: &VulkanOptions) -> Result<Weights, VkError> {
    let total = plan.weights;
    let mut done = 0u64;
    let mut last_tenth = 0u64;
    let mut progress = |bytes: u64| {
        done += bytes;
        if let Some(p) = &opts.progress {
            (p.0)(done, total);
            return;
        }
        let tenth = done * 10 / total.max(1);
        if tenth > last_tenth {
            last_tenth = tenth;
            tracing::info!("vulkan upload {}% ({} of {} MiB)", tenth * 10, done >> 20, total >> 20);
        }
    };
    let mirror_bytes = (opts.regions * plan.n_ctx) as u64 * opts.codec.bytes_for(cfg.kv_dim()) as u64;
    let mut layers = Vec::with_capacity(cfg.n_layer);
    for l in 0..cfg.n_layer {
        let n = LayerNames::new(l);
        let mut mat = |name: &str| -> Result<Mat, VkError> {
            let m = upload_mat(gpu, f, name)?;
            progress((m.rows * m.row_bytes) as u64);
            Ok(m)
        };
        let (q, k, v, attn_out) = (mat(&n.q)?, mat(&n.k)?, mat(&n.v)?, mat(&n.attn_out)?);
        // Gate and up in one buffer where they fit: the canonical product's SwiGLU epilogue
        // takes both (an expert stack's gate rows, then its up rows).
        let (gate_name, up_name, down_name) = if cfg.moe.is_some() { (&n.gate_exps, &n.up_exps, &n.down_exps) } else { (&n.gate, &n.up, &n.down) };
        let down = mat(down_name)?;
        let (gate, up) = upload_gate_up(gpu, f, gate_name, up_name)?;
        progress(((gate.rows * gate.row_bytes) + (up.rows * up.row_bytes)) as u64);
        let bias = if cfg.qkv_bias { [vector(f, &n.q_bias)?, vector(f, &n.k_bias)?, vector(f, &n.v_bias)?].concat() } else { vec![0.0] };
        let qk_norm = if cfg.qk_norm { [vector(f, &n.q_norm)?, vector(f, &n.k_norm)?].concat() } else { vec![0.0] };
        let dev = |v: &[f32]| Buffer::with_data(gpu, &f32_bytes(v), Location::Device);
        let post = |name: &str| -> Result<Option<Buffer>, VkError> {
            if cfg.post_norms {
                Ok(Some(dev(&vector(f, name)?)?))
            } else {
                Ok(None)
            }
        };
        layers.push(Layer {
            attn_norm: dev(&vector(f, &n.attn_norm)?)?,
            q,
            k,
            v,
            bias: dev(&bias)?,
            qk_norm: dev(&qk_norm)?,
            attn_out,
            ffn_norm: dev(&vector(f, &n.ffn_norm)?)?,
            attn_post_norm: post(&n.attn_post_norm)?,
            ffn_post_norm: post(&n.ffn_post_norm)?,
            gate,
            up,
            down,
            router: cfg.moe.map(|_| dev(&vector(f, &n.gate_inp)?)).transpose()?,
            mk: Buffer::new(gpu, mirror_bytes, Location::Device)?,
            mv: Buffer::new(gpu, mirror_bytes, Location::Device)?,
        });
    }
    let embd = upload_mat(gpu, f, resin_model::TOKEN_EMBD)?;
    progress((embd.rows * embd.row_bytes) as u64);
    let output = if cfg.tied_output { None } else { Some(upload_mat(gpu, f, resin_model::OUTPUT)?) };
    let output_norm = Buffer::with_data(gpu, &f32_bytes(&vector(f, resin_model::OUTPUT_NORM)?), Location::Device)?;
    let table = |base: f32| Buffer::with_data(gpu, &f32_bytes(&rope_table(plan.n_ctx, cfg.rope_dims, base)), Location::Device);
    let ropes = cfg.rope_bases().into_iter().map(table).collect::<Result<_, _>>()?;
    Ok(Weights { layers, embd, output, output_norm, ropes })
}
