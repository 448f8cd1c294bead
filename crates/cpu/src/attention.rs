//! Causal attention of rows over their own regions of the K/V cache.

use rayon::prelude::*;

use crate::kv::{KvCache, Side};
use crate::ops::{axpy, dot};

/// Shapes of one attention call.
pub struct AttnShape {
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
}

/// For each row r (region, pos) and head h: softmax(q·K[0..=pos] / sqrt(d)) · V[0..=pos].
/// `q` is [rows][n_head * head_dim]; `out` the same shape. Work is split over (row, kv group)
/// pairs; each head's reduction order is fixed, so a row's result does not depend on the batch.
pub fn attend(kv: &KvCache, layer: usize, rows: &[(usize, u32)], shape: &AttnShape, q: &[f32], out: &mut [f32]) {
    let hd = shape.head_dim;
    let q_dim = shape.n_head * hd;
    let group = shape.n_head / shape.n_head_kv;
    let scale = 1.0 / (hd as f32).sqrt();
    // One task per (row, kv group): its slice of `out` is group * hd contiguous values.
    out.par_chunks_mut(group * hd).enumerate().for_each_init(
        || (Vec::new(), Vec::new(), Vec::new()),
        |(kbuf, vbuf, scores), (task, o)| {
            let (r, g) = (task / shape.n_head_kv, task % shape.n_head_kv);
            let (region, pos) = rows[r];
            let n = pos as usize + 1;
            kbuf.resize(n * hd, 0.0);
            vbuf.resize(n * hd, 0.0);
            scores.resize(n, 0.0);
            kv.read(Side::K, region, layer, n, g * hd, hd, kbuf);
            kv.read(Side::V, region, layer, n, g * hd, hd, vbuf);
            for j in 0..group {
                let h = g * group + j;
                let qh = &q[r * q_dim + h * hd..r * q_dim + (h + 1) * hd];
                let mut max = f32::NEG_INFINITY;
                for (t, s) in scores.iter_mut().enumerate() {
                    *s = dot(qh, &kbuf[t * hd..(t + 1) * hd]) * scale;
                    max = max.max(*s);
                }
                let mut sum = 0.0;
                for s in scores.iter_mut() {
                    *s = (*s - max).exp();
                    sum += *s;
                }
                let oh = &mut o[j * hd..(j + 1) * hd];
                oh.fill(0.0);
                for (t, &s) in scores.iter().enumerate() {
                    axpy(s, &vbuf[t * hd..(t + 1) * hd], oh);
                }
                let inv = 1.0 / sum;
                oh.iter_mut().for_each(|v| *v *= inv);
            }
        },
    );
}
