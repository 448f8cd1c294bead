//! Quantized matrix multiply kernels of the CPU home.
//!
//! Two products. The canonical one (`canon_*`, docs/canonical-order.md) takes every matrix
//! in a format of the spec's table, laid out at load in tiles (`CanonMatrix`): the forward
//! pass's products. The rounded one (`matmul`, below) takes the rest: float weights, the
//! formats without a canonical expression (Q5_1, Q2_K, Q3_K) and a mixture-of-experts router,
//! which reads the f32 normed rows as the Vulkan home's does.
//!
//! `matmul` computes `out[i * w.rows + r] = dot(w row r, x row i)`. Weights stay in their GGUF
//! block format; activations are prepared once ([`Acts`]) per format family: quantized to
//! 8-bit blocks (integer dot products, as llama.cpp does) or kept as f32 for float weights.
//!
//! Paths: `portable` (scalar, every format; the fallback and the oracle of the SIMD paths),
//! `avx2` (AVX2 + FMA + F16C + BMI2) and `avx512vnni` (AVX-512 F/BW/VL + VNNI), chosen once at
//! run time.
//!
//! Determinism: one output element is always computed by one call of one tile function, in a
//! fixed order over the row's blocks, whatever `n`, the other rows in the batch, the tile
//! width or the threads. So `out[i, r]` is bit-identical for any batch (given the SIMD path).
//!
//! Threads: rayon's global pool, split over weight rows in chunks sized to stay in L2; inside
//! a chunk, activation rows go in tiles of `NR` so every unpacked weight block is used for
//! `NR` activation rows. Prefill on the AVX-512 path (`n >= PACK_MIN`) instead unpacks a
//! chunk's weight rows once into a thread-local buffer (the very values the tile functions
//! compute on the fly) and runs every activation tile (8 rows; 4 for K-quants) over them, with
//! the same per-element arithmetic, so results stay bit-identical to n = 1.

mod acts;
#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
mod blocks;
pub mod canon;
mod canon_mm;
mod canon_pack;
#[cfg(target_arch = "x86_64")]
mod canon_x86;
mod portable;

pub use acts::Acts;
use acts::{Family, Prepared, SendPtr};
pub use canon_mm::{canon_each, canon_each_on, canon_many, canon_many_on, canon_takes, CanonRows, Epilogue};
pub use canon_pack::CanonMatrix;
use resin_gguf::GgmlType;
use std::sync::OnceLock;

pub use crate::error::KernelError;

/// A weight matrix: `rows` rows of `cols` values each, row-major, each row whole blocks of `ty`.
#[derive(Debug, Clone, Copy)]
pub struct QMatrix<'a> {
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub data: &'a [u8],
}

impl<'a> QMatrix<'a> {
    pub fn new(ty: GgmlType, rows: usize, cols: usize, data: &'a [u8]) -> Result<Self, KernelError> {
        if matches!(ty, GgmlType::Q8_1 | GgmlType::Q8_K) {
            return Err(KernelError::Unsupported(ty));
        }
        if !cols.is_multiple_of(ty.block_len()) {
            return Err(KernelError::PartialBlock { ty, cols });
        }
        let expected = (cols / ty.block_len()).checked_mul(ty.block_bytes()).and_then(|b| b.checked_mul(rows)).unwrap_or(usize::MAX);
        if data.len() != expected {
            return Err(KernelError::WrongByteLength { ty, rows, cols, got: data.len(), expected });
        }
        Ok(QMatrix { ty, rows, cols, data })
    }

    /// Bytes of one row.
    pub fn row_bytes(&self) -> usize {
        self.cols / self.ty.block_len() * self.ty.block_bytes()
    }

    pub(crate) fn row(&self, r: usize) -> &'a [u8] {
        let rb = self.row_bytes();
        &self.data[r * rb..(r + 1) * rb]
    }
}

/// A SIMD path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Simd {
    Portable,
    Avx2,
    Avx512Vnni,
}

impl Simd {
    pub fn name(self) -> &'static str {
        match self {
            Simd::Portable => "portable",
            Simd::Avx2 => "avx2",
            Simd::Avx512Vnni => "avx512vnni",
        }
    }

    /// Whether this machine can run the path.
    pub fn is_available(self) -> bool {
        match self {
            Simd::Portable => true,
            #[cfg(target_arch = "x86_64")]
            Simd::Avx2 => {
                use std::arch::is_x86_feature_detected as has;
                has!("avx2") && has!("fma") && has!("f16c") && has!("bmi2")
            }
            #[cfg(target_arch = "x86_64")]
            Simd::Avx512Vnni => {
                use std::arch::is_x86_feature_detected as has;
                Simd::Avx2.is_available() && has!("avx512f") && has!("avx512bw") && has!("avx512vl") && has!("avx512vnni")
            }
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// Every path this machine can run, slowest first.
    pub fn available() -> Vec<Simd> {
        [Simd::Portable, Simd::Avx2, Simd::Avx512Vnni].into_iter().filter(|s| s.is_available()).collect()
    }

    /// The fastest available path (detected once).
    pub fn detected() -> Simd {
        static LEVEL: OnceLock<Simd> = OnceLock::new();
        *LEVEL.get_or_init(|| *Simd::available().last().unwrap_or(&Simd::Portable))
    }
}

/// Which SIMD path was chosen at run time ("avx512vnni", "avx2", "portable").
pub fn simd_level() -> &'static str {
    Simd::detected().name()
}

/// `out[i * w.rows + r] = dot(w row r, x row i)` for i in 0..n (x is n rows of w.cols values).
pub fn matmul(w: &QMatrix, acts: &Acts, out: &mut [f32]) {
    matmul_on(Simd::detected(), w, acts, out)
}

/// Convenience: prepare + matmul.
pub fn matmul_f32(w: &QMatrix, x: &[f32], n: usize, out: &mut [f32]) {
    let acts = Acts::prepare(x, n, w.cols, w.ty);
    matmul(w, &acts, out)
}

/// Activation rows per tile.
const NR: usize = 4;
/// Weight rows per tile when a tile has fewer than NR activation rows (decode).
const MR: usize = 4;
/// Bytes of weights one task keeps hot (about half of L2).
const CHUNK_BYTES: usize = 256 << 10;

/// `matmul` on a given path (tests and benches). Panics when the path is not available here.
pub fn matmul_on(simd: Simd, w: &QMatrix, acts: &Acts, out: &mut [f32]) {
    assert!(simd.is_available(), "SIMD path {} is not available on this machine", simd.name());
    assert_eq!(acts.cols, w.cols, "matmul: activations have {} columns, weights {}", acts.cols, w.cols);
    let (n, rows) = (acts.n, w.rows);
    assert_eq!(out.len(), n * rows, "matmul: out has {} values, want {n} x {rows}", out.len());
    if n == 0 || rows == 0 {
        return;
    }
    let fam = Family::of(w.ty);
    let prep = acts.prepared(fam);
    let row_bytes = w.row_bytes().max(1);
    let threads = rayon::current_num_threads().max(1);
    let by_cache = (CHUNK_BYTES / row_bytes).max(4);
    let by_par = rows.div_ceil(threads * 4).max(1);
    let chunk = by_cache.min(by_par);
    let nchunks = rows.div_ceil(chunk);
    let outp = SendPtr(out.as_mut_ptr());
    let work = |c: usize| {
        let outp = &outp;
        let (r0, r1) = (c * chunk, ((c + 1) * chunk).min(rows));
        run_chunk(simd, w, acts, prep, r0, r1, outp.0);
    };
    // Small products are not worth waking the pool.
    if nchunks == 1 || (w.data.len() as u64) * (n as u64) < 32 << 10 {
        (0..nchunks).for_each(work);
    } else {
        use rayon::prelude::*;
        (0..nchunks).into_par_iter().for_each(work);
    }
}

/// Several products of the same activations (q, k and v; gate and up) in ONE parallel region:
/// one fork-join instead of one each. Each output equals what `matmul` gives for its weight
/// (the same chunks run the same tiles; only the scheduling differs).
pub fn matmul_many(jobs: &mut [(&QMatrix, &mut [f32])], acts: &Acts) {
    let mut each: Vec<(&QMatrix, &Acts, &mut [f32])> = jobs.iter_mut().map(|(w, out)| (&**w, acts, &mut **out)).collect();
    matmul_each(&mut each);
}

/// Products each of its own activations (a row's experts' down projections) in ONE parallel
/// region; each output equals what `matmul` gives for its weight and activations.
pub fn matmul_each(jobs: &mut [(&QMatrix, &Acts, &mut [f32])]) {
    let simd = Simd::detected();
    let threads = rayon::current_num_threads().max(1);
    let mut tasks = Vec::new();
    let mut parts = Vec::with_capacity(jobs.len());
    let mut work_bytes = 0u64;
    for (j, (w, acts, out)) in jobs.iter_mut().enumerate() {
        assert_eq!(acts.cols, w.cols, "matmul_each: activations have {} columns, weights {}", acts.cols, w.cols);
        assert_eq!(out.len(), acts.n * w.rows, "matmul_each: output {j} has the wrong length");
        parts.push((&**w, &**acts, SendPtr(out.as_mut_ptr())));
        if acts.n == 0 {
            continue;
        }
        let row_bytes = w.row_bytes().max(1);
        let chunk = (CHUNK_BYTES / row_bytes).max(4).min(w.rows.div_ceil(threads * 4).max(1));
        tasks.extend((0..w.rows.div_ceil(chunk)).map(|c| (j, c * chunk, ((c + 1) * chunk).min(w.rows))));
        acts.prepared(Family::of(w.ty));
        work_bytes += w.data.len() as u64 * acts.n as u64;
    }
    let work = |&(j, r0, r1): &(usize, usize, usize)| {
        let (w, acts, out) = &parts[j];
        run_chunk(simd, w, acts, acts.prepared(Family::of(w.ty)), r0, r1, out.0);
    };
    if tasks.len() <= 1 || work_bytes < 32 << 10 {
        tasks.iter().for_each(work);
    } else {
        use rayon::prelude::*;
        tasks.par_iter().for_each(work);
    }
}

fn run_chunk(simd: Simd, w: &QMatrix, acts: &Acts, prep: &Prepared, r0: usize, r1: usize, out: *mut f32) {
    let n = acts.n;
    #[cfg(target_arch = "x86_64")]
    if simd == Simd::Avx512Vnni && n >= PACK_MIN && avx512::packs(w.ty) {
        packed_chunk(w, acts, prep, r0, r1, out);
        return;
    }
    let mut i = 0;
    while i + NR <= n {
        rows_of::<1, NR>(simd, w, acts, prep, r0, r1, i, out);
        i += NR;
    }
    // Tiles of fewer activation rows (decode: one) take MR weight rows at a time instead.
    match n - i {
        0 => {}
        1 => rows_of::<MR, 1>(simd, w, acts, prep, r0, r1, i, out),
        2 => rows_of::<MR, 2>(simd, w, acts, prep, r0, r1, i, out),
        3 => rows_of::<MR, 3>(simd, w, acts, prep, r0, r1, i, out),
        _ => unreachable!(),
    }
}

/// Activation rows from which the AVX-512 path unpacks a chunk's weights once (prefill).
const PACK_MIN: usize = 8;
/// Weight rows of a packed tile (activation rows: `packed_tiles`).
const PM: usize = 1;
/// Packed weight bytes unpacked at a time (they stay in L2 while every activation tile passes).
const PACK_BYTES: usize = 1 << 20;

#[cfg(target_arch = "x86_64")]
std::thread_local! {
    static PACKED: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Prefill on the AVX-512 path: the chunk's weight rows are unpacked once (the same values the
/// tile functions compute on the fly), then every activation tile reuses them. Per element the
/// arithmetic and its order are those of `avx512::tile`, so results do not change.
#[cfg(target_arch = "x86_64")]
fn packed_chunk(w: &QMatrix, acts: &Acts, prep: &Prepared, r0: usize, r1: usize, out: *mut f32) {
    let prb = avx512::packed_row_bytes(w.ty, w.cols);
    let sub = (PACK_BYTES / prb).max(PM);
    let mut s0 = r0;
    while s0 < r1 {
        let s1 = (s0 + sub).min(r1);
        packed_sub(w, acts, prep, prb, s0, s1, out);
        s0 = s1;
    }
}

#[cfg(target_arch = "x86_64")]
fn packed_sub(w: &QMatrix, acts: &Acts, prep: &Prepared, prb: usize, r0: usize, r1: usize, out: *mut f32) {
    PACKED.with(|buf| {
        let mut buf = buf.borrow_mut();
        let need = prb * (r1 - r0);
        if buf.len() < need {
            buf.resize(need, 0);
        }
        for r in r0..r1 {
            let o = (r - r0) * prb;
            // SAFETY: the caller checked the AVX-512 features.
            unsafe { avx512::pack_row(w.ty, w.row(r), w.cols, &mut buf[o..o + prb]) };
        }
        let pk = buf.as_ptr();
        // K-quant tiles keep more accumulators (mins): 8 activation rows would spill.
        if w.ty.block_len() == 256 {
            packed_tiles::<4>(w, acts.n, prep, pk, prb, r0, r1, out)
        } else {
            packed_tiles::<8>(w, acts.n, prep, pk, prb, r0, r1, out)
        }
    });
}

/// Every activation row against packed weight rows r0..r1, PK activation rows a tile.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
fn packed_tiles<const PK: usize>(w: &QMatrix, n: usize, prep: &Prepared, pk: *const u8, prb: usize, r0: usize, r1: usize, out: *mut f32) {
    {
        let mut i = 0;
        while i + PK <= n {
            packed_rows_of::<PM, PK>(w, prep, pk, prb, r0, r1, i, out);
            i += PK;
        }
        if PK > 4 && n - i >= 4 {
            packed_rows_of::<PM, 4>(w, prep, pk, prb, r0, r1, i, out);
            i += 4;
        }
        match n - i {
            0 => {}
            1 => packed_rows_of::<PM, 1>(w, prep, pk, prb, r0, r1, i, out),
            2 => packed_rows_of::<PM, 2>(w, prep, pk, prb, r0, r1, i, out),
            3 => packed_rows_of::<PM, 3>(w, prep, pk, prb, r0, r1, i, out),
            _ => unreachable!(),
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
fn packed_rows_of<const M: usize, const K: usize>(w: &QMatrix, prep: &Prepared, pk: *const u8, prb: usize, r0: usize, r1: usize, i: usize, out: *mut f32) {
    let rows = w.rows;
    let put = |r: usize, o: &[f32; K]| {
        // SAFETY: (i + j, r) is inside out and only this task writes rows r0..r1.
        for (j, v) in o.iter().enumerate() {
            unsafe { *out.add((i + j) * rows + r) = *v };
        }
    };
    let mut r = r0;
    // SAFETY (both loops): packed rows r0..r1 are in the buffer; features checked by the caller.
    if M > 1 {
        while r + M <= r1 {
            let mut o = [[0f32; K]; M];
            let p: [*const u8; M] = std::array::from_fn(|m| unsafe { pk.add((r - r0 + m) * prb) });
            unsafe { avx512::packed_tile::<M, K>(w.ty, p, w.cols, prep, i, &mut o) };
            for (m, om) in o.iter().enumerate() {
                put(r + m, om);
            }
            r += M;
        }
    }
    while r < r1 {
        let mut o = [[0f32; K]; 1];
        let p = [unsafe { pk.add((r - r0) * prb) }];
        unsafe { avx512::packed_tile::<1, K>(w.ty, p, w.cols, prep, i, &mut o) };
        put(r, &o[0]);
        r += 1;
    }
}

/// Weight rows `r0..r1` against activation rows `i..i + K`, M weight rows a call (the rest
/// one a call). The value of one element does not depend on M or K.
#[allow(clippy::too_many_arguments)]
fn rows_of<const M: usize, const K: usize>(simd: Simd, w: &QMatrix, acts: &Acts, prep: &Prepared, r0: usize, r1: usize, i: usize, out: *mut f32) {
    let rows = w.rows;
    let mut r = r0;
    let put = |r: usize, o: &[f32; K]| {
        // SAFETY: (i + j, r) is inside out and only this task writes rows r0..r1.
        for (j, v) in o.iter().enumerate() {
            unsafe { *out.add((i + j) * rows + r) = *v };
        }
    };
    if M > 1 {
        while r + M <= r1 {
            let mut o = [[0f32; K]; M];
            tile::<M, K>(simd, w.ty, std::array::from_fn(|m| w.row(r + m)), acts, prep, i, &mut o);
            for (m, om) in o.iter().enumerate() {
                put(r + m, om);
            }
            r += M;
        }
    }
    while r < r1 {
        let mut o = [[0f32; K]; 1];
        tile::<1, K>(simd, w.ty, [w.row(r)], acts, prep, i, &mut o);
        put(r, &o[0]);
        r += 1;
    }
}

/// Activation rows `i0..i0 + K` against weight rows `wrows`.
#[inline]
fn tile<const M: usize, const K: usize>(simd: Simd, ty: GgmlType, wrows: [&[u8]; M], acts: &Acts, p: &Prepared, i0: usize, o: &mut [[f32; K]; M]) {
    let x = &acts.x;
    let cols = acts.cols;
    match simd {
        Simd::Portable => {
            for m in 0..M {
                portable::tile::<K>(ty, wrows[m], x, cols, p, i0, &mut o[m])
            }
        }
        #[cfg(target_arch = "x86_64")]
        // SAFETY: matmul_on checked that the machine has the path's features.
        Simd::Avx2 => {
            for m in 0..M {
                unsafe { avx2::tile::<K>(ty, wrows[m], x, cols, p, i0, &mut o[m]) }
            }
        }
        #[cfg(target_arch = "x86_64")]
        Simd::Avx512Vnni => unsafe { avx512::tile::<M, K>(ty, wrows, x, cols, p, i0, o) },
        #[cfg(not(target_arch = "x86_64"))]
        _ => unreachable!(),
    }
}
