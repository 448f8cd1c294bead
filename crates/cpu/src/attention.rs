//! Causal attention of rows over their own regions of the K/V cache.

use rayon::prelude::*;

use crate::kv::{KvCache, Side};
use crate::ops::{axpy, dot};

/// Shapes of one attention call.
pub struct AttnShape {
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    /// Scores are q·k times this.
    pub scale: f32,
    /// A sliding-window layer's keys: the row's last `window` (its own included); None: all.
    pub window: Option<usize>,
}

/// The first key a row at `pos` attends to.
fn first_key(pos: u32, window: Option<usize>) -> usize {
    window.map_or(0, |w| (pos as usize + 1).saturating_sub(w))
}

/// Rows of one region at consecutive positions share one read of their keys and values.
const CHUNK_ROWS: usize = 32;

/// For each row r (region, pos) and head h: softmax(scale q·K[first..=pos]) · V[first..=pos],
/// `first` being 0, or the start of the row's window on a sliding-window layer.
/// `q` is [rows][n_head * head_dim]; `out` the same shape.
///
/// Work is split into (chunk, kv group) tasks, a chunk being up to CHUNK_ROWS consecutive rows
/// of one region whose keys are read (and decoded from the mirror's codec) once. Each head's
/// reduction order is fixed, so a row's result never depends on the batch around it.
pub fn attend(kv: &KvCache, layer: usize, rows: &[(usize, u32)], shape: &AttnShape, q: &[f32], out: &mut [f32]) {
    let hd = shape.head_dim;
    let q_dim = shape.n_head * hd;
    let group = shape.n_head / shape.n_head_kv;
    let scale = shape.scale;

    let mut chunks = Vec::new();
    let mut i = 0;
    while i < rows.len() {
        let mut j = i + 1;
        while j < rows.len() && j - i < CHUNK_ROWS && rows[j].0 == rows[i].0 && rows[j].1 == rows[j - 1].1 + 1 {
            j += 1;
        }
        chunks.push(i..j);
        i = j;
    }
    let tasks: Vec<(usize, usize)> = (0..chunks.len()).flat_map(|c| (0..shape.n_head_kv).map(move |g| (c, g))).collect();
    let results: Vec<Vec<f32>> = tasks
        .par_iter()
        .map_init(
            || (Vec::new(), Vec::new(), Vec::new()),
            |(kbuf, vbuf, scores), &(c, g)| {
                let span = chunks[c].clone();
                let region = rows[span.start].0;
                let n = rows[span.end - 1].1 as usize + 1;
                // The chunk's rows are at consecutive positions: the first row's window starts first.
                let base = first_key(rows[span.start].1, shape.window);
                kbuf.resize((n - base) * hd, 0.0);
                vbuf.resize((n - base) * hd, 0.0);
                kv.read(Side::K, region, layer, base, n, g * hd, hd, kbuf);
                kv.read(Side::V, region, layer, base, n, g * hd, hd, vbuf);
                let mut o = vec![0f32; span.len() * group * hd];
                for (ri, r) in span.enumerate() {
                    let lo = first_key(rows[r].1, shape.window) - base;
                    let keys = rows[r].1 as usize + 1 - base;
                    scores.resize(keys - lo, 0.0);
                    let (kbuf, vbuf) = (&kbuf[lo * hd..], &vbuf[lo * hd..]);
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
                        let oh = &mut o[(ri * group + j) * hd..(ri * group + j + 1) * hd];
                        for (t, &s) in scores.iter().enumerate() {
                            axpy(s, &vbuf[t * hd..(t + 1) * hd], oh);
                        }
                        let inv = 1.0 / sum;
                        oh.iter_mut().for_each(|v| *v *= inv);
                    }
                }
                o
            },
        )
        .collect();
    for (&(c, g), o) in tasks.iter().zip(results) {
        for (ri, r) in chunks[c].clone().enumerate() {
            let dst = r * q_dim + g * group * hd;
            out[dst..dst + group * hd].copy_from_slice(&o[ri * group * hd..(ri + 1) * group * hd]);
        }
    }
}
