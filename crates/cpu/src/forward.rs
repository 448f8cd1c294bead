//! The forward pass over a batch of rows: embed (scaled, for gemma), per layer (norm, QKV,
//! q/k norm, rope-and-store, attention over all keys or a sliding window, output projection,
//! post-norm (gemma3) + residual, norm, gate/up, SwiGLU or GeGLU, down, post-norm (gemma3) +
//! residual; or the routed experts of a MoE layer), final norm and classifier (soft-capped where the model says) on the rows that
//! need logits.

use resin_core::Counters;

use crate::attention::{attend, AttnShape};
use crate::home::{CpuError, CpuHome};
use crate::kernels::{matmul_many, Acts};
use crate::ops::{gated, rms_norm, rms_norm_inplace, softcap};
use crate::weights::{Ffn, MatRef};

/// One row of a pass: (region, position, token).
pub type PassRow = (usize, u32, u32);

/// `out_i = W_i x` for several weights over the same activations in one parallel region.
pub(crate) fn project(home: &CpuHome, x: &[f32], n: usize, cols: usize, jobs: &mut [(&MatRef, &mut Vec<f32>)]) {
    let acts = Acts::prepare(x, n, cols, jobs[0].0.ty);
    let mats: Vec<_> = jobs.iter().map(|(w, _)| home.weights.mat(w)).collect();
    let mut outs: Vec<(&crate::kernels::QMatrix, &mut [f32])> = mats
        .iter()
        .zip(jobs.iter_mut())
        .map(|(m, (w, out))| {
            out.resize(n * w.rows, 0.0);
            (m, out.as_mut_slice())
        })
        .collect();
    matmul_many(&mut outs, &acts);
}

fn add_bias(x: &mut [f32], bias: &[f32]) {
    if bias.is_empty() {
        return;
    }
    for row in x.chunks_exact_mut(bias.len()) {
        row.iter_mut().zip(bias).for_each(|(v, b)| *v += b);
    }
}

/// RMS-norm every row of `x` in place with `w` (gemma3's post-norms); nothing when `w` is empty.
fn post_norm(x: &mut [f32], w: &[f32], eps: f32) {
    if w.is_empty() {
        return;
    }
    x.chunks_exact_mut(w.len()).for_each(|row| rms_norm_inplace(row, w, eps));
}

/// Gather rows `sel` of a [n][width] matrix.
fn gather(x: &[f32], width: usize, sel: &[usize]) -> Vec<f32> {
    sel.iter().flat_map(|&i| x[i * width..(i + 1) * width].iter().copied()).collect()
}

impl CpuHome {
    /// Run `rows` through every layer; returns logits for the rows listed in `logit_rows`
    /// (indices into `rows`, in that order). Only those rows run the last layer's attention
    /// output, FFN and the classifier (last-layer narrowing).
    pub(crate) fn pass(&mut self, rows: &[PassRow], logit_rows: &[usize]) -> Result<Vec<f32>, CpuError> {
        let cfg = self.cfg.clone();
        let (d, hd) = (cfg.n_embd, cfg.head_dim);
        let (q_dim, kv_dim) = (cfg.q_dim(), cfg.kv_dim());

        let mut n = rows.len();
        let mut x = vec![0f32; n * d];
        for (i, &(_, _, tok)) in rows.iter().enumerate() {
            self.weights.embed(tok, &mut x[i * d..(i + 1) * d])?;
        }
        if cfg.embd_scale != 1.0 {
            x.iter_mut().for_each(|v| *v *= cfg.embd_scale);
        }
        let mut attn_rows: Vec<(usize, u32)> = rows.iter().map(|&(r, p, _)| (r, p)).collect();
        let (mut xn, mut q, mut k, mut v, mut att, mut o) = (vec![0f32; n * d], vec![], vec![], vec![], vec![], vec![]);
        let (mut gate, mut up, mut down) = (vec![], vec![], vec![]);
        let mut cs = Vec::new();

        for (l, layer) in self.weights.layers.iter().enumerate() {
            let last = l + 1 == cfg.n_layer;
            let window = cfg.layer_window(l);
            let rope = self.ropes.get(cfg.layer_rope_table(l)).ok_or_else(|| CpuError::Model(format!("layer {l} has no rope table")))?;
            let shape = AttnShape { n_head: cfg.n_head, n_head_kv: cfg.n_head_kv, head_dim: hd, scale: cfg.attn_scale, window };
            xn.resize(n * d, 0.0);
            for i in 0..n {
                rms_norm(&x[i * d..(i + 1) * d], &layer.attn_norm, cfg.rms_eps, &mut xn[i * d..(i + 1) * d]);
            }
            // Past the K/V store, the last layer only needs the rows that give logits; q is
            // projected with k and v unless the last layer narrows.
            let narrow = last && logit_rows.len() < n;
            if narrow {
                project(self, &xn, n, d, &mut [(&layer.k, &mut k), (&layer.v, &mut v)]);
            } else {
                project(self, &xn, n, d, &mut [(&layer.q, &mut q), (&layer.k, &mut k), (&layer.v, &mut v)]);
            }
            add_bias(&mut k, &layer.k_bias);
            add_bias(&mut v, &layer.v_bias);
            for (i, &(region, pos, _)) in rows.iter().enumerate() {
                let ki = &mut k[i * kv_dim..(i + 1) * kv_dim];
                if !layer.k_norm.is_empty() {
                    ki.chunks_exact_mut(hd).for_each(|h| rms_norm_inplace(h, &layer.k_norm, cfg.rms_eps));
                }
                rope.angles(pos, &mut cs);
                rope.apply(ki, hd, &cs);
                self.kv.store(region, l, pos as usize, ki, &v[i * kv_dim..(i + 1) * kv_dim]);
            }

            if narrow {
                Counters::add(&self.counters.prefill_rows_narrowed, (n - logit_rows.len()) as u64);
                x = gather(&x, d, logit_rows);
                xn = gather(&xn, d, logit_rows);
                attn_rows = logit_rows.iter().map(|&i| attn_rows[i]).collect();
                n = logit_rows.len();
                if n == 0 {
                    // A window in which no segment ends: its K/V rows were all it owed.
                    return Ok(Vec::new());
                }
                project(self, &xn, n, d, &mut [(&layer.q, &mut q)]);
            }
            add_bias(&mut q, &layer.q_bias);
            for (i, &(_, pos)) in attn_rows.iter().enumerate() {
                let qi = &mut q[i * q_dim..(i + 1) * q_dim];
                if !layer.q_norm.is_empty() {
                    qi.chunks_exact_mut(hd).for_each(|h| rms_norm_inplace(h, &layer.q_norm, cfg.rms_eps));
                }
                rope.angles(pos, &mut cs);
                rope.apply(qi, hd, &cs);
            }
            att.resize(n * q_dim, 0.0);
            attend(&self.kv, l, &attn_rows, &shape, &q, &mut att);
            project(self, &att, n, q_dim, &mut [(&layer.attn_out, &mut o)]);
            post_norm(&mut o, &layer.attn_post_norm, cfg.rms_eps);
            x.iter_mut().zip(&o).for_each(|(a, b)| *a += b);

            for i in 0..n {
                rms_norm(&x[i * d..(i + 1) * d], &layer.ffn_norm, cfg.rms_eps, &mut xn[i * d..(i + 1) * d]);
            }
            match (&layer.ffn, cfg.moe) {
                (Ffn::Dense { gate: wg, up: wu, down: wd }, _) => {
                    project(self, &xn, n, d, &mut [(wg, &mut gate), (wu, &mut up)]);
                    gated(cfg.ffn_act, &mut gate, &up);
                    project(self, &gate, n, cfg.n_ff, &mut [(wd, &mut down)]);
                }
                (Ffn::Moe(m), Some(moe)) => self.moe_ffn(m, moe, cfg.ffn_act, &xn[..n * d], n, &mut down),
                (Ffn::Moe(_), None) => return Err(CpuError::Model("MoE weights without a MoE config".into())),
            }
            post_norm(&mut down, &layer.ffn_post_norm, cfg.rms_eps);
            x.iter_mut().zip(&down).for_each(|(a, b)| *a += b);
        }

        // `x` now holds exactly the logit rows, in `logit_rows` order (callers pass them sorted).
        let m = logit_rows.len();
        let mut xn = vec![0f32; m * d];
        for i in 0..m {
            rms_norm(&x[i * d..(i + 1) * d], &self.weights.output_norm, cfg.rms_eps, &mut xn[i * d..(i + 1) * d]);
        }
        let mut logits = Vec::new();
        project(self, &xn, m, d, &mut [(&self.weights.output, &mut logits)]);
        if let Some(cap) = cfg.logit_softcap {
            softcap(&mut logits, cap);
        }
        Ok(logits)
    }
}
