//! Activations prepared for a weight format family.
//!
//! Three families:
//! - `Float`: f32 kept (for F32 / F16 / BF16 weights).
//! - `Pair32`: 8-bit blocks of 32 values with an f32 scale `d` and `s = d * sum(q)` (ggml's
//!   Q8_0 / Q8_1 in one), for Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 weights. Blocks go in GROUPS of 16
//!   (512 bytes), transposed: 8 steps of 64 bytes, step t holds values 4t..4t+4 of all 16
//!   blocks, 4 bytes a block (block k at bytes 4k..4k+4). So one i32 lane of an integer dot is
//!   one block and 16 block scales are one vector. A row's last group is padded with zero
//!   blocks (`d = s = 0`).
//! - `Super256`: ggml's Q8_K: 256 values, f32 scale, and 16 sums of 16 values (`bsums`), for
//!   the K-quants. Values in natural order.
//!
//! Quantization: `d = amax / 127`, `q = round_ties_even(x * (127 / amax))`. The same source is
//! compiled for each SIMD level; IEEE operations are exact-rounded and Rust never contracts to
//! FMA, so every build gives the same bytes.

use resin_gguf::GgmlType;
use std::sync::OnceLock;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Family {
    Float,
    Pair32,
    Super256,
}

impl Family {
    pub(crate) fn of(ty: GgmlType) -> Family {
        use GgmlType::*;
        match ty {
            F32 | F16 | BF16 => Family::Float,
            Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q8_1 => Family::Pair32,
            Q2_K | Q3_K | Q4_K | Q5_K | Q6_K | Q8_K => Family::Super256,
        }
    }
    fn index(self) -> usize {
        self as usize
    }
    fn block(self) -> usize {
        match self {
            Family::Float => 1,
            Family::Pair32 => 32,
            Family::Super256 => 256,
        }
    }
}

/// Quantized activations of one family (see the module docs).
pub(crate) struct Prepared {
    /// i8 values; row `i` starts at `i * qs_stride`.
    pub qs: Vec<i8>,
    pub qs_stride: usize,
    /// Per block scale; row `i` starts at `i * d_stride`.
    pub d: Vec<f32>,
    pub d_stride: usize,
    /// Pair32: `d * sum(q)` per block (same indexing as `d`).
    pub s: Vec<f32>,
    /// Super256: 16 sums of 16 values per superblock; row `i` starts at `i * d_stride * 16`.
    pub bsums: Vec<i16>,
}

/// Activations prepared once for a weight format family (quantized to 8-bit blocks, or f32
/// kept) so q, k and v (or gate and up) reuse them. Another family is prepared on first use
/// (and cached), so one `Acts` serves weights of any format.
pub struct Acts {
    pub(crate) n: usize,
    pub(crate) cols: usize,
    pub(crate) x: Vec<f32>,
    preps: [OnceLock<Prepared>; 3],
}

impl Acts {
    /// `x` holds `n` rows of `cols` values. `for_ty` names the weight format to prepare for
    /// now; other families are prepared when a weight of that family first uses them.
    pub fn prepare(x: &[f32], n: usize, cols: usize, for_ty: GgmlType) -> Acts {
        assert_eq!(x.len(), n * cols, "Acts::prepare: x has {} values, want {n} x {cols}", x.len());
        let acts = Acts { n, cols, x: x.to_vec(), preps: Default::default() };
        let fam = Family::of(for_ty);
        if fam != Family::Float && cols.is_multiple_of(fam.block()) {
            acts.prepared(fam);
        }
        acts
    }

    /// Rows of activations.
    pub fn n(&self) -> usize {
        self.n
    }

    /// Values per row.
    pub fn cols(&self) -> usize {
        self.cols
    }

    pub(crate) fn prepared(&self, fam: Family) -> &Prepared {
        self.preps[fam.index()].get_or_init(|| {
            assert!(self.cols.is_multiple_of(fam.block()), "activations of {} columns cannot be blocked by {}", self.cols, fam.block());
            match fam {
                Family::Float => Prepared { qs: Vec::new(), qs_stride: 0, d: Vec::new(), d_stride: 0, s: Vec::new(), bsums: Vec::new() },
                Family::Pair32 => prepare_pair32(&self.x, self.n, self.cols),
                Family::Super256 => prepare_super256(&self.x, self.n, self.cols),
            }
        })
    }
}

/// Rows handed to one rayon task when quantizing.
const ROWS_PER_TASK: usize = 16;

fn for_rows(n: usize, cols: usize, f: impl Fn(usize) + Sync) {
    use rayon::prelude::*;
    if n * cols < 1 << 16 {
        (0..n).for_each(f);
    } else {
        (0..n.div_ceil(ROWS_PER_TASK)).into_par_iter().for_each(|t| {
            for i in t * ROWS_PER_TASK..((t + 1) * ROWS_PER_TASK).min(n) {
                f(i)
            }
        });
    }
}

/// A raw pointer that may cross threads; every user writes a disjoint range.
#[derive(Clone, Copy)]
pub(crate) struct SendPtr<T>(pub *mut T);
unsafe impl<T> Send for SendPtr<T> {}
unsafe impl<T> Sync for SendPtr<T> {}

#[inline(always)]
pub(crate) fn quant_block<const N: usize>(x: &[f32], q: &mut [i8; N]) -> (f32, i32) {
    let mut amax = 0u32;
    for &v in x {
        amax = amax.max(v.to_bits() & 0x7fff_ffff);
    }
    let amax = f32::from_bits(amax);
    let d = amax / 127.0;
    let id = if amax > 0.0 { 127.0 / amax } else { 0.0 };
    let mut sum = 0i32;
    for (o, &v) in q.iter_mut().zip(x) {
        let r = (v * id).round_ties_even() as i8;
        *o = r;
        sum += r as i32;
    }
    (d, sum)
}

#[inline(always)]
fn pair32_row(x: &[f32], qs: &mut [i8], d: &mut [f32], s: &mut [f32]) {
    let nb = x.len() / 32;
    for b in 0..nb {
        let mut q = [0i8; 32];
        let (db, sum) = quant_block(&x[b * 32..b * 32 + 32], &mut q);
        let (g, k) = (b / 16, b % 16);
        d[16 * g + k] = db;
        s[16 * g + k] = db * sum as f32;
        let grp = &mut qs[512 * g..512 * g + 512];
        for t in 0..8 {
            grp[64 * t + 4 * k..64 * t + 4 * k + 4].copy_from_slice(&q[4 * t..4 * t + 4]);
        }
    }
}

#[inline(always)]
fn super256_row(x: &[f32], qs: &mut [i8], d: &mut [f32], bsums: &mut [i16]) {
    for b in 0..x.len() / 256 {
        let mut q = [0i8; 256];
        let (db, _) = quant_block(&x[b * 256..b * 256 + 256], &mut q);
        d[b] = db;
        for k in 0..16 {
            bsums[b * 16 + k] = q[16 * k..16 * k + 16].iter().map(|&v| v as i16).sum();
        }
        qs[b * 256..b * 256 + 256].copy_from_slice(&q);
    }
}

macro_rules! multiversion {
    ($name:ident, $body:ident, ($($arg:ident : $t:ty),*)) => {
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
        unsafe fn avx512_v($($arg: $t),*) { $body($($arg),*) }
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = "avx2,fma")]
        unsafe fn avx2_v($($arg: $t),*) { $body($($arg),*) }
        fn $name($($arg: $t),*) {
            #[cfg(target_arch = "x86_64")]
            {
                if std::arch::is_x86_feature_detected!("avx512bw") && std::arch::is_x86_feature_detected!("avx512vl") {
                    return unsafe { avx512_v($($arg),*) };
                }
                if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
                    return unsafe { avx2_v($($arg),*) };
                }
            }
            $body($($arg),*)
        }
    };
}

mod mv_pair {
    use super::*;
    multiversion!(run, pair32_row, (x: &[f32], qs: &mut [i8], d: &mut [f32], s: &mut [f32]));
    pub(super) fn row(x: &[f32], qs: &mut [i8], d: &mut [f32], s: &mut [f32]) {
        run(x, qs, d, s)
    }
}

mod mv_super {
    use super::*;
    multiversion!(run, super256_row, (x: &[f32], qs: &mut [i8], d: &mut [f32], bsums: &mut [i16]));
    pub(super) fn row(x: &[f32], qs: &mut [i8], d: &mut [f32], bsums: &mut [i16]) {
        run(x, qs, d, bsums)
    }
}

fn prepare_pair32(x: &[f32], n: usize, cols: usize) -> Prepared {
    let nb = cols / 32;
    let nbp = nb.div_ceil(16) * 16;
    let qs_stride = nbp * 32;
    let mut qs = vec![0i8; n * qs_stride];
    let mut d = vec![0f32; n * nbp];
    let mut s = vec![0f32; n * nbp];
    let (qp, dp, sp) = (SendPtr(qs.as_mut_ptr()), SendPtr(d.as_mut_ptr()), SendPtr(s.as_mut_ptr()));
    for_rows(n, cols, |i| {
        let (qp, dp, sp) = (&qp, &dp, &sp);
        // SAFETY: each row writes only its own disjoint ranges.
        let (q, dd, ss) = unsafe {
            (
                std::slice::from_raw_parts_mut(qp.0.add(i * qs_stride), qs_stride),
                std::slice::from_raw_parts_mut(dp.0.add(i * nbp), nbp),
                std::slice::from_raw_parts_mut(sp.0.add(i * nbp), nbp),
            )
        };
        mv_pair::row(&x[i * cols..(i + 1) * cols], q, dd, ss);
    });
    Prepared { qs, qs_stride, d, d_stride: nbp, s, bsums: Vec::new() }
}

fn prepare_super256(x: &[f32], n: usize, cols: usize) -> Prepared {
    let nb = cols / 256;
    let mut qs = vec![0i8; n * cols];
    let mut d = vec![0f32; n * nb];
    let mut bsums = vec![0i16; n * nb * 16];
    let (qp, dp, bp) = (SendPtr(qs.as_mut_ptr()), SendPtr(d.as_mut_ptr()), SendPtr(bsums.as_mut_ptr()));
    for_rows(n, cols, |i| {
        let (qp, dp, bp) = (&qp, &dp, &bp);
        // SAFETY: each row writes only its own disjoint ranges.
        let (q, dd, bs) = unsafe {
            (
                std::slice::from_raw_parts_mut(qp.0.add(i * cols), cols),
                std::slice::from_raw_parts_mut(dp.0.add(i * nb), nb),
                std::slice::from_raw_parts_mut(bp.0.add(i * nb * 16), nb * 16),
            )
        };
        mv_super::row(&x[i * cols..(i + 1) * cols], q, dd, bs);
    });
    Prepared { qs, qs_stride: cols, d, d_stride: nb, s: Vec::new(), bsums }
}
