//! The pieces of a plain f64 forward pass that the synthetic-model tests write their references
//! from (one token at a time, weights read as f32 and widened), independently of the home's
//! code, and the decode steps they hold the home to.

use resin_core::{RegionId, Row, StepAll};
use resin_cpu::CpuHome;

/// `m` (`rows` by `cols`, row-major) times `x`.
pub fn matvec(m: &[f32], rows: usize, cols: usize, x: &[f64]) -> Vec<f64> {
    (0..rows).map(|r| (0..cols).map(|c| m[r * cols + c] as f64 * x[c]).sum()).collect()
}

/// RMS norm of `x` with weights `w`.
pub fn rms(x: &[f64], w: &[f32], eps: f64) -> Vec<f64> {
    let s = (x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64 + eps).sqrt();
    x.iter().zip(w).map(|(v, g)| v / s * *g as f64).collect()
}

/// RMS norm of each head of `x` (heads of `head_dim`) with the same weights `w`, in place.
pub fn rms_heads(x: &mut [f64], w: &[f32], eps: f64, head_dim: usize) {
    for h in x.chunks_mut(head_dim) {
        let r = rms(h, w, eps);
        h.copy_from_slice(&r);
    }
}

/// NEOX rope at `pos` on each head of `x` (heads of `head_dim`): element i pairs with element
/// i + head_dim/2.
pub fn rope_neox(x: &mut [f64], pos: usize, base: f64, head_dim: usize) {
    for h in x.chunks_mut(head_dim) {
        for i in 0..head_dim / 2 {
            let theta = pos as f64 * base.powf(-2.0 * i as f64 / head_dim as f64);
            let (s, c) = theta.sin_cos();
            let (a, b) = (h[i], h[i + head_dim / 2]);
            h[i] = a * c - b * s;
            h[i + head_dim / 2] = a * s + b * c;
        }
    }
}

/// Softmax attention of `q`'s `heads` heads over `keys` and `values` (one entry a position,
/// `heads_kv` heads each, query heads grouped onto them in order), scaled by 1/sqrt(head_dim).
pub fn attend(q: &[f64], keys: &[Vec<f64>], values: &[Vec<f64>], heads: usize, heads_kv: usize, head_dim: usize) -> Vec<f64> {
    let hd = head_dim;
    let mut att = vec![0f64; heads * hd];
    for hh in 0..heads {
        let g = hh / (heads / heads_kv);
        let qh = &q[hh * hd..(hh + 1) * hd];
        let s: Vec<f64> = keys.iter().map(|kt| qh.iter().zip(&kt[g * hd..(g + 1) * hd]).map(|(a, b)| a * b).sum::<f64>() / (hd as f64).sqrt()).collect();
        let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = s.iter().map(|v| (v - m).exp()).collect();
        let z: f64 = e.iter().sum();
        for (t, vt) in values.iter().enumerate() {
            for d in 0..hd {
                att[hh * hd + d] += e[t] / z * vt[g * hd + d];
            }
        }
    }
    att
}

/// Relative L2 distance of the home's `a` from the reference's `b`.
pub fn rel_l2(a: &[f32], b: &[f64]) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(x, y)| (*x as f64 - y).powi(2)).sum();
    let den: f64 = b.iter().map(|y| y * y).sum();
    (num / den).sqrt()
}

/// Five greedy decode steps after a prompt of `prompt_len` tokens whose reference logits are
/// `want`: each step feeds the reference's choice to the home (region 0) and to `reference`
/// (token, position -> logits), and holds the home's logits within `bar` of the reference's.
pub fn five_decode_steps(home: &mut CpuHome, mut reference: impl FnMut(u32, usize) -> Vec<f64>, want: &[f64], prompt_len: usize, bar: f64) {
    let argmax = |v: &[f64]| (0..v.len()).fold(0, |b, i| if v[i] > v[b] { i } else { b }) as u32;
    let mut tok = argmax(want);
    for i in 0..5 {
        let pos = prompt_len + i;
        let want = reference(tok, pos);
        let got = home.step_logits(&[Row { region: RegionId(0), token: tok, pos: pos as u32 }]).unwrap();
        let err = rel_l2(got.row(0), &want);
        assert!(err < bar, "step {i}: relative L2 {err:.3e}");
        tok = argmax(&want);
    }
}
