//! The mixture-of-experts FFN: the router's logits, each row's chosen experts and their weights
//! (see [`resin_model::Moe`] for the rule), the chosen experts' SwiGLU FFNs, their weighted sum.
//!
//! Rows are grouped by expert: an expert's rows share one pass over its weights, and an expert
//! no row chose is never read. Each row's result depends on that row alone: the kernels give
//! every output element the same bits whatever rows share the product, and a row sums its
//! experts' outputs in its own rank order (largest weight first), so N rows stepped together
//! equal each row stepped alone, bit for bit.

use resin_model::{FfnAct, Moe};

use crate::forward::{project, run_canon};
use crate::home::{CpuError, CpuHome};
use crate::kernels::{canon_each, matmul_each, Acts, CanonMatrix, CanonRows, Epilogue, QMatrix};
use crate::ops::{axpy, gated, rms_norm_rows};
use crate::weights::{MatRef, MoeFfn};

/// llama.cpp clamps the sum of the chosen weights below at the smallest normal f16 before it
/// divides by it.
const MIN_WEIGHT_SUM: f32 = 6.103_516e-5;

/// The `k` experts a row takes, largest probability first (ties: the lower expert index), and
/// their weights: the softmax probabilities over every expert divided by the chosen ones' sum.
/// Writes `(expert, weight)` pairs into `out` (length `k`).
pub fn route(logits: &[f32], out: &mut [(usize, f32)]) {
    let k = out.len();
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut p: Vec<f32> = logits.iter().map(|&l| (l - max).exp()).collect();
    let sum: f32 = p.iter().sum();
    let inv = 1.0 / sum;
    p.iter_mut().for_each(|v| *v *= inv);
    let mut order: Vec<usize> = (0..p.len()).collect();
    // Stable: equal probabilities keep the lower index first. NaN (a broken file) compares equal
    // rather than panicking.
    order.sort_by(|&a, &b| p[b].partial_cmp(&p[a]).unwrap_or(std::cmp::Ordering::Equal));
    let chosen: f32 = order[..k].iter().map(|&e| p[e]).sum();
    let norm = 1.0 / chosen.max(MIN_WEIGHT_SUM);
    for (o, &e) in out.iter_mut().zip(&order[..k]) {
        *o = (e, p[e] * norm);
    }
}

impl CpuHome {
    /// The MoE FFN of `n` rows `x` ([n][n_embd]) under the FFN norm `norm`; `out` becomes
    /// [n][n_embd]. The router reads the f32 normed rows; experts that take the canonical
    /// product read the norm folded (u = x * w in 32-value blocks, r in the epilogue) and the
    /// gated activations in 32-value blocks, as the Vulkan home's grouped experts do.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn moe_ffn(&self, ffn: &MoeFfn, moe: Moe, act: FfnAct, x: &[f32], norm: &[f32], n: usize, out: &mut Vec<f32>) -> Result<(), CpuError> {
        let (d, ff, e_n, k) = (self.cfg.n_embd, self.cfg.n_ff, moe.n_expert, moe.n_expert_used);
        let xn = &rms_norm_rows(x, n, d, norm, self.cfg.rms_eps)[..];
        let mut logits = Vec::new();
        project(self, xn, n, d, &mut [(&ffn.router, &mut logits)]);
        let mut sel = vec![(0usize, 0f32); n * k];
        for i in 0..n {
            route(&logits[i * e_n..(i + 1) * e_n], &mut sel[i * k..(i + 1) * k]);
        }
        // Slot s = i * k + j is row i's j-th expert; each expert runs its slots' rows at once.
        let mut slots: Vec<Vec<usize>> = vec![Vec::new(); e_n];
        for (s, &(e, _)) in sel.iter().enumerate() {
            slots[e].push(s);
        }
        let mut y = vec![0f32; n * k * d];
        let canon = [&ffn.gate, &ffn.up, &ffn.down].iter().all(|m| self.weights.canon(m).is_some());
        if canon {
            let packed = CanonRows::norm(x, n, d, norm, self.cfg.rms_eps)?;
            if n == 1 {
                self.one_row_canon_experts(ffn, act, &packed, &sel, &mut y)?;
            } else {
                let (mut gate, mut up, mut down) = (Vec::new(), Vec::new(), Vec::new());
                for (e, ss) in slots.iter().enumerate().filter(|(_, ss)| !ss.is_empty()) {
                    let m = ss.len();
                    let rows: Vec<usize> = ss.iter().map(|&s| s / k).collect();
                    let (g, u, dn) = (ffn.expert(&ffn.gate, e), ffn.expert(&ffn.up, e), ffn.expert(&ffn.down, e));
                    run_canon(self, &mut [(&g, &mut gate), (&u, &mut up)], &packed.select(&rows), Epilogue::Store)?;
                    gated(act, &mut gate, &up);
                    run_canon(self, &mut [(&dn, &mut down)], &CanonRows::pack(&gate, m, ff)?, Epilogue::Store)?;
                    for (r, &s) in ss.iter().enumerate() {
                        y[s * d..(s + 1) * d].copy_from_slice(&down[r * d..(r + 1) * d]);
                    }
                }
            }
        } else if n == 1 {
            self.one_row_experts(ffn, act, xn, &sel, &mut y);
        } else {
            let (mut xe, mut gate, mut up, mut down) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
            for (e, ss) in slots.iter().enumerate().filter(|(_, ss)| !ss.is_empty()) {
                let m = ss.len();
                xe.clear();
                for &s in ss {
                    let i = s / k;
                    xe.extend_from_slice(&xn[i * d..(i + 1) * d]);
                }
                let (g, u, dn) = (ffn.expert(&ffn.gate, e), ffn.expert(&ffn.up, e), ffn.expert(&ffn.down, e));
                project(self, &xe, m, d, &mut [(&g, &mut gate), (&u, &mut up)]);
                gated(act, &mut gate, &up);
                project(self, &gate, m, ff, &mut [(&dn, &mut down)]);
                for (r, &s) in ss.iter().enumerate() {
                    y[s * d..(s + 1) * d].copy_from_slice(&down[r * d..(r + 1) * d]);
                }
            }
        }
        out.clear();
        out.resize(n * d, 0.0);
        for i in 0..n {
            let o = &mut out[i * d..(i + 1) * d];
            for j in 0..k {
                let s = i * k + j;
                axpy(sel[s].1, &y[s * d..(s + 1) * d], o);
            }
        }
        Ok(())
    }
}

impl CpuHome {
    /// A lone row's experts in the canonical product: gate and up of every chosen expert in
    /// one parallel region, then every down from its own activations in another.
    fn one_row_canon_experts(&self, ffn: &MoeFfn, act: FfnAct, x: &CanonRows, sel: &[(usize, f32)], y: &mut [f32]) -> Result<(), CpuError> {
        let ff = self.cfg.n_ff;
        let mats = gate_up_mats(ffn, sel);
        let mut gu: Vec<(Vec<f32>, Vec<f32>)> = vec![(Vec::new(), Vec::new()); sel.len()];
        run_canon(self, &mut gate_up_jobs(&mats, &mut gu), x, Epilogue::Store)?;
        let acts = gu
            .iter_mut()
            .map(|(gate, up)| {
                gated(act, gate, up);
                CanonRows::pack(gate, 1, ff)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let downs = sel
            .iter()
            .map(|&(e, _)| self.weights.canon(&ffn.expert(&ffn.down, e)).ok_or_else(|| CpuError::Model("an expert without its tiles".into())))
            .collect::<Result<Vec<&CanonMatrix>, _>>()?;
        let d = self.cfg.n_embd;
        let mut outs: Vec<(&CanonMatrix, &CanonRows, &mut [f32])> = downs.iter().zip(&acts).zip(y.chunks_exact_mut(d)).map(|((m, a), out)| (*m, a, out)).collect();
        Ok(canon_each(&mut outs, Epilogue::Store)?)
    }

    /// A lone row (decode): its experts' gate and up products share its activations, so they
    /// run in one parallel region rather than one an expert. The kernels give each element the
    /// same bits either way, so this equals the grouped path.
    fn one_row_experts(&self, ffn: &MoeFfn, act: FfnAct, xn: &[f32], sel: &[(usize, f32)], y: &mut [f32]) {
        let (d, ff) = (self.cfg.n_embd, self.cfg.n_ff);
        let mats = gate_up_mats(ffn, sel);
        let mut gu: Vec<(Vec<f32>, Vec<f32>)> = vec![(Vec::new(), Vec::new()); sel.len()];
        project(self, xn, 1, d, &mut gate_up_jobs(&mats, &mut gu));
        // Each expert's down from its own activations, all in one parallel region (one
        // fork-join a layer, not one an expert).
        let downs: Vec<MatRef> = sel.iter().map(|&(e, _)| ffn.expert(&ffn.down, e)).collect();
        let acts: Vec<Acts> = gu
            .iter_mut()
            .zip(&downs)
            .map(|((gate, up), dn)| {
                gated(act, gate, up);
                Acts::prepare(gate, 1, ff, dn.ty)
            })
            .collect();
        let mats: Vec<QMatrix> = downs.iter().map(|dn| self.weights.mat(dn)).collect();
        let mut outs: Vec<(&QMatrix, &Acts, &mut [f32])> = mats.iter().zip(&acts).zip(y.chunks_exact_mut(d)).map(|((m, a), out)| (m, a, out)).collect();
        matmul_each(&mut outs);
    }
}

/// Each chosen expert's gate and up matrices, in the row's rank order.
fn gate_up_mats(ffn: &MoeFfn, sel: &[(usize, f32)]) -> Vec<(MatRef, MatRef)> {
    sel.iter().map(|&(e, _)| (ffn.expert(&ffn.gate, e), ffn.expert(&ffn.up, e))).collect()
}

/// The products of every chosen expert's gate and up as one list of jobs, each into its pair
/// of `gu`.
fn gate_up_jobs<'a>(mats: &'a [(MatRef, MatRef)], gu: &'a mut [(Vec<f32>, Vec<f32>)]) -> Vec<(&'a MatRef, &'a mut Vec<f32>)> {
    let mut jobs = Vec::with_capacity(2 * mats.len());
    for ((g, u), (og, ou)) in mats.iter().zip(gu.iter_mut()) {
        jobs.push((g, og));
        jobs.push((u, ou));
    }
    jobs
}

#[cfg(test)]
mod tests {
    use super::route;

    #[test]
    fn route_takes_the_top_k_and_renormalises_their_softmax() {
        let logits = [0.5f32, 2.0, -1.0, 2.0, 1.0];
        let mut out = [(0, 0.0); 3];
        route(&logits, &mut out);
        // Ties (experts 1 and 3) keep the lower index first.
        assert_eq!(out.iter().map(|o| o.0).collect::<Vec<_>>(), vec![1, 3, 4]);
        let e = |l: f64| (l - 2.0).exp();
        let z = e(2.0) + e(2.0) + e(1.0);
        for (o, l) in out.iter().zip([2.0, 2.0, 1.0]) {
            assert!((o.1 as f64 - e(l) / z).abs() < 1e-6, "{out:?}");
        }
        let mut all = [(0, 0.0); 5];
        route(&logits, &mut all);
        assert!((all.iter().map(|o| o.1).sum::<f32>() - 1.0).abs() < 1e-6);
        // A NaN logit does not panic.
        route(&[f32::NAN, 1.0], &mut [(0, 0.0); 1]);
    }
}
