//! The forward pass over a batch of rows: embed (scaled, for gemma), per layer (norm, QKV,
//! q/k norm, rope-and-store, attention over all keys or a sliding window, output projection,
//! post-norm (gemma3) + residual, norm, gate/up, SwiGLU or GeGLU, down, post-norm (gemma3) +
//! residual; or the routed experts of a MoE layer), final norm and classifier (soft-capped where the model says) on the rows that
//! need logits.
//!
//! Matrices whose format has a canonical expression take the canonical product
//! (docs/canonical-order.md), as the Vulkan home's token command does (its `norm_mm`,
//! `ffn_in`, `resid_mm`): a norm whose matrices all take it is folded (u = x * w quantized,
//! y = r * y'), the attention output and the gated FFN activations are quantized in 32-value
//! blocks, and the residual is added in the product's epilogue (y' + x). Other matrices read
//! the normed rows as `project` prepares them; gemma3's post-norms come between a product and
//! its residual, so there the product is stored, normed, then added.

use resin_core::Counters;

use crate::attention::{attend, AttnShape};
use crate::home::{CpuError, CpuHome};
use crate::kernels::{canon_many, matmul_many, Acts, CanonMatrix, CanonRows, Epilogue};
use crate::ops::{gated, rms_norm_inplace, rms_norm_rows, softcap};
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

/// Whether every matrix of `ms` takes the canonical product (a norm before them then folds).
fn all_canon(home: &CpuHome, ms: &[&MatRef]) -> bool {
    ms.iter().all(|m| home.weights.canon(m).is_some())
}

/// `out_i = W_i x` where the matrices that take the canonical product read `x` quantized in
/// 32-value blocks, the others `project`'s activations.
fn project_mixed(home: &CpuHome, x: &[f32], n: usize, cols: usize, jobs: &mut [(&MatRef, &mut Vec<f32>)]) -> Result<(), CpuError> {
    let (mut canon, mut plain): (Vec<_>, Vec<_>) = jobs.iter_mut().map(|(w, out)| (*w, &mut **out)).partition(|(w, _)| home.weights.canon(w).is_some());
    if !canon.is_empty() {
        let acts = CanonRows::pack(x, n, cols)?;
        run_canon(home, &mut canon, &acts, Epilogue::Store)?;
    }
    if !plain.is_empty() {
        project(home, x, n, cols, &mut plain);
    }
    Ok(())
}

/// The canonical products `jobs` of `acts`, each output sized to its rows (`Add` keeps what
/// it holds: the residual sum).
pub(crate) fn run_canon(home: &CpuHome, jobs: &mut [(&MatRef, &mut Vec<f32>)], acts: &CanonRows, epi: Epilogue) -> Result<(), CpuError> {
    let mats =
        jobs.iter().map(|(w, _)| home.weights.canon(w).ok_or_else(|| CpuError::Model(format!("a {} matrix without its tiles", w.ty)))).collect::<Result<Vec<&CanonMatrix>, _>>()?;
    let mut outs: Vec<(&CanonMatrix, &mut [f32])> = mats
        .iter()
        .zip(jobs.iter_mut())
        .map(|(m, (w, out))| {
            out.resize(acts.n() * w.rows, 0.0);
            (*m, out.as_mut_slice())
        })
        .collect();
    Ok(canon_many(&mut outs, acts, epi)?)
}

/// `out_i = W_i (rmsnorm(x) * w)` for n rows: the norm folded into the canonical products
/// where `fold` (every matrix the norm feeds takes them: `all_canon`), else normalised first
/// and `project_mixed`.
#[allow(clippy::too_many_arguments)]
fn norm_project(home: &CpuHome, x: &[f32], n: usize, cols: usize, w: &[f32], eps: f32, fold: bool, jobs: &mut [(&MatRef, &mut Vec<f32>)]) -> Result<(), CpuError> {
    if fold {
        let acts = CanonRows::norm(x, n, cols, w, eps)?;
        return run_canon(home, jobs, &acts, Epilogue::Store);
    }
    project_mixed(home, &rms_norm_rows(x, n, cols, w, eps), n, cols, jobs)
}

/// x += W a for a matrix that ends a sub-block (attention output, down), n rows of `cols`
/// values in `a`: the canonical product adds in its epilogue; with gemma3's post-norm `post`
/// (or outside the canonical product) the product goes to `y`, is normed, then added.
#[allow(clippy::too_many_arguments)]
fn resid_project(home: &CpuHome, a: &[f32], n: usize, cols: usize, w: &MatRef, post: &[f32], eps: f32, x: &mut Vec<f32>, y: &mut Vec<f32>) -> Result<(), CpuError> {
    if post.is_empty() && home.weights.canon(w).is_some() {
        let acts = CanonRows::pack(a, n, cols)?;
        return run_canon(home, &mut [(w, x)], &acts, Epilogue::Add);
    }
    project_mixed(home, a, n, cols, &mut [(w, y)])?;
    post_norm(y, post, eps);
    x.iter_mut().zip(y.iter()).for_each(|(s, v)| *s += v);
    Ok(())
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
        let (mut q, mut k, mut v, mut att, mut o) = (vec![], vec![], vec![], vec![], vec![]);
        let (mut gate, mut up, mut down) = (vec![], vec![], vec![]);
        let mut cs = Vec::new();

        for (l, layer) in self.weights.layers.iter().enumerate() {
            let last = l + 1 == cfg.n_layer;
            let window = cfg.layer_window(l);
            let rope = self.ropes.get(cfg.layer_rope_table(l)).ok_or_else(|| CpuError::Model(format!("layer {l} has no rope table")))?;
            let shape = AttnShape { n_head: cfg.n_head, n_head_kv: cfg.n_head_kv, head_dim: hd, scale: cfg.attn_scale, window };
            // Past the K/V store, the last layer only needs the rows that give logits; q is
            // projected with k and v unless the last layer narrows (the norm folds or not by
            // the same rule either way: a row's q does not depend on narrowing).
            let narrow = last && logit_rows.len() < n;
            let eps = cfg.rms_eps;
            let fold = all_canon(self, &[&layer.q, &layer.k, &layer.v]);
            if narrow {
                norm_project(self, &x, n, d, &layer.attn_norm, eps, fold, &mut [(&layer.k, &mut k), (&layer.v, &mut v)])?;
            } else {
                norm_project(self, &x, n, d, &layer.attn_norm, eps, fold, &mut [(&layer.q, &mut q), (&layer.k, &mut k), (&layer.v, &mut v)])?;
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
                attn_rows = logit_rows.iter().map(|&i| attn_rows[i]).collect();
                n = logit_rows.len();
                if n == 0 {
                    // A window in which no segment ends: its K/V rows were all it owed.
                    return Ok(Vec::new());
                }
                norm_project(self, &x, n, d, &layer.attn_norm, eps, fold, &mut [(&layer.q, &mut q)])?;
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
            resid_project(self, &att, n, q_dim, &layer.attn_out, &layer.attn_post_norm, eps, &mut x, &mut o)?;

            match (&layer.ffn, cfg.moe) {
                (Ffn::Dense { gate: wg, up: wu, down: wd }, _) => {
                    let fold = all_canon(self, &[wg, wu]);
                    norm_project(self, &x, n, d, &layer.ffn_norm, eps, fold, &mut [(wg, &mut gate), (wu, &mut up)])?;
                    gated(cfg.ffn_act, &mut gate, &up);
                    resid_project(self, &gate, n, cfg.n_ff, wd, &layer.ffn_post_norm, eps, &mut x, &mut down)?;
                }
                (Ffn::Moe(m), Some(moe)) => {
                    self.moe_ffn(m, moe, cfg.ffn_act, &x, &layer.ffn_norm, n, &mut down)?;
                    post_norm(&mut down, &layer.ffn_post_norm, eps);
                    x.iter_mut().zip(&down).for_each(|(a, b)| *a += b);
                }
                (Ffn::Moe(_), None) => return Err(CpuError::Model("MoE weights without a MoE config".into())),
            }
        }

        // `x` now holds exactly the logit rows, in `logit_rows` order (callers pass them sorted).
        let m = logit_rows.len();
        let mut logits = Vec::new();
        let out = &self.weights.output;
        norm_project(self, &x, m, d, &self.weights.output_norm, cfg.rms_eps, all_canon(self, &[out]), &mut [(out, &mut logits)])?;
        if let Some(cap) = cfg.logit_softcap {
            softcap(&mut logits, cap);
        }
        Ok(logits)
    }
}
