//! The canonical matrix product of many activation rows (docs/canonical-order.md): what the
//! Vulkan home's token command computes, bit for bit. Activations are quantized in 32-value
//! int8 blocks ([`CanonRows`]: plain, or with the RMS norm folded: u = x * w quantized and
//! each row's r kept for the epilogue); each output element sums its blocks' float terms
//! left to right within the chunks that [`Cut`] fixes from K alone, then the chunks by the
//! pairwise tree, then the epilogue (r * y', + the residual).
//!
//! The weights are laid out in tiles of 16 rows (`canon_pack::CanonMatrix`). Paths: the
//! portable one reads the tiles element by element through the reference's sum
//! (`Cut::sum`); the AVX2 and AVX-512 VNNI ones (`canon_x86`) share one body, one weight row a
//! SIMD lane: each block's float term, each chunk's sum and the tree as lane-wise adds, so no
//! lane ever adds two blocks of another order.

use rayon::prelude::*;
use resin_core::canon::{Cut, BLOCK};
use resin_gguf::GgmlType;

use super::acts::{quant_block, SendPtr};
use super::canon::{canon_format, canon_rms_scale, canon_sumsq, CanonActs};
use super::canon_pack::{get16, quants, CanonMatrix, TILE};
use super::{KernelError, QMatrix, Simd};

/// `n` activation rows of `cols` values quantized in 32-value blocks: quants (row `i` at
/// `i * blocks() * 32`), each block's `d`, integer sum and first half's sum (row `i` at
/// `i * blocks()`); and each row's r where a norm was folded.
#[derive(Debug, Clone)]
pub struct CanonRows {
    pub(super) n: usize,
    pub(super) cols: usize,
    pub(super) q: Vec<i8>,
    pub(super) d: Vec<f32>,
    pub(super) s: Vec<i32>,
    /// The sum of each block's first 16 quants (Q6_K's blocks have two scales).
    pub(super) h: Vec<i32>,
    /// r of each row (the folded norm's scale), empty when none was folded.
    pub(super) r: Vec<f32>,
}

/// Rows a task quantizes when the rows are spread over threads.
const ROWS_PER_TASK: usize = 8;

impl CanonRows {
    fn with(n: usize, cols: usize, folded: bool) -> Result<CanonRows, KernelError> {
        if cols == 0 || !cols.is_multiple_of(BLOCK) {
            return Err(KernelError::PartialBlock { ty: GgmlType::Q8_0, cols });
        }
        let nb = cols / BLOCK;
        let r = if folded { vec![0.0; n] } else { Vec::new() };
        Ok(CanonRows { n, cols, q: vec![0; n * nb * BLOCK], d: vec![0.0; n * nb], s: vec![0; n * nb], h: vec![0; n * nb], r })
    }

    /// Quantize `n` rows of `x` as they are (attention output, the SwiGLU's h).
    pub fn pack(x: &[f32], n: usize, cols: usize) -> Result<CanonRows, KernelError> {
        Self::build(x, n, cols, None)
    }

    /// The folded RMS norm of `n` rows of `x` with weights `w`: u = x * w quantized, and each
    /// row's r = 1 / sqrt(ss / cols + eps) from its sum of squares in the canonical order.
    pub fn norm(x: &[f32], n: usize, cols: usize, w: &[f32], eps: f32) -> Result<CanonRows, KernelError> {
        if w.len() != cols {
            return Err(KernelError::Shape(format!("norm weights of {} values for rows of {cols}", w.len())));
        }
        Self::build(x, n, cols, Some((w, eps)))
    }

    fn build(x: &[f32], n: usize, cols: usize, norm: Option<(&[f32], f32)>) -> Result<CanonRows, KernelError> {
        if x.len() != n * cols {
            return Err(KernelError::Shape(format!("activations of {} values, want {n} x {cols}", x.len())));
        }
        let mut a = Self::with(n, cols, norm.is_some())?;
        let cut = Cut::of(cols).ok_or(KernelError::PartialBlock { ty: GgmlType::Q8_0, cols })?;
        let nb = a.blocks();
        let ptrs = (SendPtr(a.q.as_mut_ptr()), SendPtr(a.d.as_mut_ptr()), SendPtr(a.s.as_mut_ptr()), SendPtr(a.r.as_mut_ptr()), SendPtr(a.h.as_mut_ptr()));
        let row = |i: usize| {
            let (qp, dp, sp, rp, hp) = (&ptrs.0, &ptrs.1, &ptrs.2, &ptrs.3, &ptrs.4);
            let xr = &x[i * cols..(i + 1) * cols];
            // SAFETY: row i writes only its own blocks i * nb .. (i + 1) * nb.
            let (q, d, s) = unsafe {
                (
                    std::slice::from_raw_parts_mut(qp.0.add(i * nb * BLOCK), nb * BLOCK),
                    std::slice::from_raw_parts_mut(dp.0.add(i * nb), nb),
                    std::slice::from_raw_parts_mut(sp.0.add(i * nb), nb),
                )
            };
            quantize_row(xr, norm.map(|(w, _)| w), q, d, s);
            for (b, qb) in q.chunks_exact(BLOCK).enumerate() {
                // SAFETY: as the blocks above.
                unsafe { *hp.0.add(i * nb + b) = qb[..BLOCK / 2].iter().map(|&v| v as i32).sum() };
            }
            if let Some((_, eps)) = norm {
                // SAFETY: r has n values (folded) and row i writes only its own.
                unsafe { *rp.0.add(i) = canon_rms_scale(canon_sumsq(xr, &cut), cols, eps) };
            }
        };
        if n * cols < 1 << 16 {
            (0..n).for_each(row);
        } else {
            (0..n.div_ceil(ROWS_PER_TASK)).into_par_iter().for_each(|t| (t * ROWS_PER_TASK..((t + 1) * ROWS_PER_TASK).min(n)).for_each(row));
        }
        Ok(a)
    }

    /// Blocks a row.
    pub(super) fn blocks(&self) -> usize {
        self.cols / BLOCK
    }

    /// Rows `sel` of these (a row may repeat), in that order.
    pub fn select(&self, sel: &[usize]) -> CanonRows {
        let (nb, qb) = (self.blocks(), self.blocks() * BLOCK);
        let mut a = CanonRows { n: sel.len(), cols: self.cols, q: Vec::with_capacity(sel.len() * qb), d: Vec::new(), s: Vec::new(), h: Vec::new(), r: Vec::new() };
        for &i in sel {
            a.q.extend_from_slice(&self.q[i * qb..(i + 1) * qb]);
            a.d.extend_from_slice(&self.d[i * nb..(i + 1) * nb]);
            a.s.extend_from_slice(&self.s[i * nb..(i + 1) * nb]);
            a.h.extend_from_slice(&self.h[i * nb..(i + 1) * nb]);
            if !self.r.is_empty() {
                a.r.push(self.r[i]);
            }
        }
        a
    }

    /// Rows.
    pub fn n(&self) -> usize {
        self.n
    }

    /// Row `i` as the scalar reference takes it.
    pub fn row(&self, i: usize) -> CanonActs {
        let nb = self.blocks();
        let (q0, b0) = (i * nb * BLOCK, i * nb);
        CanonActs { q: self.q[q0..q0 + nb * BLOCK].to_vec(), d: self.d[b0..b0 + nb].to_vec(), s: self.s[b0..b0 + nb].to_vec() }
    }

    /// r of row `i` (1 where no norm was folded).
    pub fn r(&self, i: usize) -> f32 {
        self.r.get(i).copied().unwrap_or(1.0)
    }
}

/// One row's blocks: u = x (or x * w) quantized block by block.
#[inline(always)]
fn row_body(x: &[f32], w: Option<&[f32]>, q: &mut [i8], d: &mut [f32], s: &mut [i32]) {
    let mut u = [0f32; BLOCK];
    for (b, xb) in x.chunks_exact(BLOCK).enumerate() {
        let src: &[f32] = match w {
            Some(w) => {
                for ((o, v), g) in u.iter_mut().zip(xb).zip(&w[b * BLOCK..(b + 1) * BLOCK]) {
                    *o = v * g;
                }
                &u
            }
            None => xb,
        };
        let mut qb = [0i8; BLOCK];
        (d[b], s[b]) = quant_block(src, &mut qb);
        q[b * BLOCK..(b + 1) * BLOCK].copy_from_slice(&qb);
    }
}

/// `row_body` compiled for the vector units this machine has (rounding to even is one
/// instruction there, a library call on the baseline); IEEE operations give the same bits
/// in every build.
fn quantize_row(x: &[f32], w: Option<&[f32]>, q: &mut [i8], d: &mut [f32], s: &mut [i32]) {
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
        unsafe fn avx512(x: &[f32], w: Option<&[f32]>, q: &mut [i8], d: &mut [f32], s: &mut [i32]) {
            row_body(x, w, q, d, s)
        }
        #[target_feature(enable = "avx2,fma")]
        unsafe fn avx2(x: &[f32], w: Option<&[f32]>, q: &mut [i8], d: &mut [f32], s: &mut [i32]) {
            row_body(x, w, q, d, s)
        }
        if std::arch::is_x86_feature_detected!("avx512bw") && std::arch::is_x86_feature_detected!("avx512vl") {
            // SAFETY: the features were detected.
            return unsafe { avx512(x, w, q, d, s) };
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
            // SAFETY: the features were detected.
            return unsafe { avx2(x, w, q, d, s) };
        }
    }
    row_body(x, w, q, d, s)
}

/// Whether `w` takes the canonical product: a format with a canonical expression, whole blocks.
pub fn canon_takes(w: &QMatrix) -> bool {
    canon_format(w.ty) && w.cols.is_multiple_of(BLOCK)
}

/// What the canonical product does with its output: store y (r * y' where a norm was folded)
/// or add it to what `out` holds (the residual sum: y + x).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Epilogue {
    Store,
    Add,
}

/// Several canonical products of the same activations (q, k and v; gate and up) in one
/// parallel region, on the path detected at run time: `out[i * w.rows + m]` = the canonical
/// product of weight row m and activation row i, then the epilogue.
pub fn canon_many(jobs: &mut [(&CanonMatrix, &mut [f32])], x: &CanonRows, epi: Epilogue) -> Result<(), KernelError> {
    canon_many_on(Simd::detected(), jobs, x, epi)
}

/// Bytes of weights one task keeps hot (about half of L2).
const CHUNK_BYTES: usize = 256 << 10;

/// `canon_many` on a given path (tests and benches).
pub fn canon_many_on(simd: Simd, jobs: &mut [(&CanonMatrix, &mut [f32])], x: &CanonRows, epi: Epilogue) -> Result<(), KernelError> {
    let mut each: Vec<(&CanonMatrix, &CanonRows, &mut [f32])> = jobs.iter_mut().map(|(w, out)| (&**w, x, &mut **out)).collect();
    canon_each_on(simd, &mut each, epi)
}

/// Canonical products each of its own activations (a row's experts' down products) in one
/// parallel region; each output equals what `canon_many` gives for its weight and rows.
pub fn canon_each(jobs: &mut [(&CanonMatrix, &CanonRows, &mut [f32])], epi: Epilogue) -> Result<(), KernelError> {
    canon_each_on(Simd::detected(), jobs, epi)
}

/// `canon_each` on a given path.
pub fn canon_each_on(simd: Simd, jobs: &mut [(&CanonMatrix, &CanonRows, &mut [f32])], epi: Epilogue) -> Result<(), KernelError> {
    if !simd.is_available() {
        return Err(KernelError::Unavailable(simd.name()));
    }
    let threads = rayon::current_num_threads().max(1);
    let mut tasks = Vec::new();
    let mut parts = Vec::with_capacity(jobs.len());
    let mut work_bytes = 0u64;
    for (j, (w, x, out)) in jobs.iter_mut().enumerate() {
        let cut = Cut::of(x.cols).ok_or(KernelError::PartialBlock { ty: GgmlType::Q8_0, cols: x.cols })?;
        if w.cols != x.cols {
            return Err(KernelError::Shape(format!("activations of {} columns, weights of {}", x.cols, w.cols)));
        }
        if out.len() != x.n * w.rows {
            return Err(KernelError::Shape(format!("output {j} of {} values, want {} x {}", out.len(), x.n, w.rows)));
        }
        parts.push((&**w, &**x, cut, SendPtr(out.as_mut_ptr())));
        if x.n == 0 {
            continue;
        }
        let tiles = w.tiles();
        let per = (CHUNK_BYTES / w.tile_bytes.max(1)).max(1).min(tiles.div_ceil(threads * 4)).max(1);
        tasks.extend((0..tiles.div_ceil(per)).map(|c| (j, c * per, ((c + 1) * per).min(tiles))));
        work_bytes += w.size() as u64 * x.n as u64;
    }
    let work = |&(j, t0, t1): &(usize, usize, usize)| {
        let (w, x, cut, out) = &parts[j];
        match simd {
            #[cfg(target_arch = "x86_64")]
            Simd::Avx2 | Simd::Avx512Vnni => super::canon_x86::tiles(simd, w, x, cut, t0, t1, out.0, epi),
            _ => portable_tiles(w, x, cut, t0, t1, out.0, epi),
        }
    };
    if tasks.len() <= 1 || work_bytes < 32 << 10 {
        tasks.iter().for_each(work);
    } else {
        tasks.par_iter().for_each(work);
    }
    Ok(())
}

/// The epilogue of one output element.
#[inline(always)]
pub(super) fn finish(y: f32, r: Option<f32>, old: f32, epi: Epilogue) -> f32 {
    let y = match r {
        Some(r) => r * y,
        None => y,
    };
    match epi {
        Epilogue::Store => y,
        Epilogue::Add => y + old,
    }
}

/// f_b of block `b` of lane `r` of tile bytes `t` against activation row `i` (section 2 of
/// the spec, read from the tile layout).
fn block_term(w: &CanonMatrix, t: &[u8], b: usize, r: usize, x: &CanonRows, i: usize) -> f32 {
    let l = &w.layout;
    let u = quants(w.ty, l, t, b, r);
    let xb = i * x.blocks() + b;
    let a = &x.q[xb * BLOCK..(xb + 1) * BLOCK];
    let (d, sx, h) = (x.d[xb], x.s[xb], x.h[xb]);
    let dot = |e: std::ops::Range<usize>| -> i32 { e.map(|e| u[e] * a[e] as i32).sum() };
    let at = l.block_at(b);
    match w.ty {
        GgmlType::Q6_K => {
            let dd = get16(t, l.head_at(b), r);
            let (sc0, sc1) = (t[at + r] as i8 as i32, t[at + TILE + r] as i8 as i32);
            let s0 = dot(0..16) - l.off * h;
            let s1 = dot(16..32) - l.off * (sx - h);
            (d * dd) * (sc0 * s0 + sc1 * s1) as f32
        }
        GgmlType::Q4_K | GgmlType::Q5_K => {
            let (dd, dmin) = (get16(t, l.head_at(b), r), get16(t, l.head_at(b) + 32, r));
            let (sc, mn) = (t[at + r] as i32, t[at + TILE + r] as i32);
            (d * dd) * (sc * dot(0..32)) as f32 - (d * dmin) * (mn * sx) as f32
        }
        _ => {
            let s = dot(0..32) - l.off * sx;
            let tw = (get16(t, at, r) * d) * s as f32;
            if w.ty == GgmlType::Q4_1 {
                tw + (get16(t, at + 32, r) * d) * sx as f32
            } else {
                tw
            }
        }
    }
}

/// The portable path: tiles t0..t1 of every activation row, one element at a time.
fn portable_tiles(w: &CanonMatrix, x: &CanonRows, cut: &Cut, t0: usize, t1: usize, out: *mut f32, epi: Epilogue) {
    for t in t0..t1 {
        let tb = w.tile(t);
        for i in 0..x.n {
            let r = (!x.r.is_empty()).then(|| x.r[i]);
            for lane in 0..TILE.min(w.rows - t * TILE) {
                let m = t * TILE + lane;
                // SAFETY: (i, m) is inside out and only this task writes tiles t0..t1.
                unsafe {
                    let o = out.add(i * w.rows + m);
                    *o = finish(cut.sum(|b| block_term(w, tb, b, lane, x, i)), r, *o, epi);
                }
            }
        }
    }
}
