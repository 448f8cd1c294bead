//! The prefill GEMM (src/gemm.rs, shaders/ops/gemm.comp).
//!
//! On the device (lavapipe in CI, which runs the portable tier): every format, activation-row
//! counts in each of the portable tier's tiles and around the 64-row one (1, 9, 20, 63, 64,
//! 65, 200), weight-row counts that are not
//! multiples of the tile (67, 130), 256 and 512 values a row. Every output element against an
//! f64 oracle with the GEMV's bar, (cols + 8) u sum_j |w_ij x_j| (any f32 summation order of
//! `cols` products is within gamma_cols of the exact sum, plus a few roundings of the in-kernel
//! dequantization); outputs NaN-poisoned, and every element outside the n written rows (gaps of
//! y_stride, before y_off, past n) must still be poison; the activation gaps of x_stride hold
//! NaN, so reading one shows. Each activation row's GEMM result is within the same bar of the
//! GEMV's (`gemv` with n = 1) for that row. Negative controls: a perturbed oracle and an
//! unwritten output fail the bar.
//!
//! Each activation row's output is the same bits whatever the row count (the tile follows the
//! row count, each output's order over K does not); rows of 2048 values split K into pieces
//! (`gemm_split`): the same checks (the split follows the matrix's shape alone).
//!
//! On the host: the tier choice (`pick_tier`) from device capabilities, and the grid.

mod common;

use common::*;
use resin_gguf::{formats, GgmlType};
use resin_vulkan::buffers::submit_once;
use resin_vulkan::device::CoopShape;
use resin_vulkan::gemm::*;
use resin_vulkan::kernels::{GemvPush, Recorder};
use resin_vulkan::pipelines::{Bind, VARIANTS};

const NS: [usize; 7] = [1, 9, 20, 63, 64, 65, 200];
const NMAX: usize = 200;

/// Partial-sum and counter (zeroed) buffers for a split GEMM of `rows` x `cols` over up to
/// NMAX activation rows.
fn split_bufs(h: &Harness, rows: usize, cols: usize) -> (resin_vulkan::buffers::Buffer, resin_vulkan::buffers::Buffer) {
    let part = h.poisoned(gemm_part_floats(rows as u32, cols as u32, NMAX as u32).max(1));
    let done = h.buf_f32(&vec![0.0; gemm_done_words(rows as u32, NMAX as u32).max(1)]);
    (part, done)
}

#[test]
#[allow(clippy::needless_range_loop)]
fn gemm_every_format_edges_strides_and_gemv_agreement() {
    let Some(mut h) = Harness::new() else { return };
    // The portable tier, forced (the H200 would pick the cooperative-matrix one).
    let t0 = std::time::Instant::now();
    let mut rng = Rng(0x6e33);
    let (mut worst, mut worst_gemv) = (0f64, 0f64); // largest err / bar seen
    for ty in FORMATS {
        for (rows, cols) in [(67usize, 256usize), (130, 512), (67, 512), (130, 256), (130, 2048)] {
            let what = format!("gemm {ty} {rows}x{cols}");
            let (upp, pieces) = gemm_split(rows as u32, cols as u32);
            assert_eq!(pieces > 1, cols == 2048, "{what}: split K in {pieces} pieces of {upp} units");
            let (part, done) = split_bufs(&h, rows, cols);
            let src = rng.vec(rows * cols, 1.0);
            let wbytes = formats::quantize(ty, &src).unwrap();
            let mut wq = vec![0f32; rows * cols];
            formats::dequantize(ty, &wbytes, &mut wq).unwrap();
            let (wbuf, row_bytes) = h.weights(ty, cols, &wbytes);
            // x: NMAX activation rows of `cols` values at x_stride = cols + 64 (a multiple of
            // 256 bytes, so each row can also be bound alone for the GEMV); the gaps are NaN.
            let xs_stride = cols + 64;
            let xrows: Vec<Vec<f32>> = (0..NMAX).map(|_| rng.vec(cols, 2.0)).collect();
            let mut xflat = vec![f32::NAN; NMAX * xs_stride];
            for (c, r) in xrows.iter().enumerate() {
                xflat[c * xs_stride..c * xs_stride + cols].copy_from_slice(r);
            }
            let xbuf = h.buf_f32(&xflat);
            let want: Vec<(Vec<f64>, Vec<f64>)> = xrows.iter().map(|x| gemv_oracle(&wq, x, rows, cols)).collect();
            let (ys, yo) = (rows + 5, 3usize);
            let mut last = Vec::new();
            let mut first9 = Vec::new();
            let mut first1 = Vec::new();
            for n in NS {
                let len = (n + 1) * ys + yo;
                let ybuf = h.poisoned(len);
                let p = GemvPush { rows: rows as u32, cols: cols as u32, row_bytes: row_bytes as u32, x_stride: xs_stride as u32, y_stride: ys as u32, y_off: yo as u32 };
                let split = GemmSplit { part: (&part).into(), done: (&done).into() };
                h.run(|rec| rec.gemm_in(GemmTier::Tiled, ty, n as u32, (&wbuf).into(), (&xbuf).into(), (&ybuf).into(), p, Some(split)));
                let got = ybuf.read_f32(0, len).unwrap();
                // Each row the same bits whatever the row count (and so the tile): row 0 of
                // n = 1 against every n, rows 0..9 of every n >= 9.
                if n == 1 {
                    first1 = got[yo..yo + rows].iter().map(|v| v.to_bits()).collect();
                } else {
                    let row0: Vec<u32> = got[yo..yo + rows].iter().map(|v| v.to_bits()).collect();
                    assert!(first1 == row0, "{what}: row 0 at n={n} differs from n=1");
                }
                if n >= 9 {
                    let rows9: Vec<u32> = (0..9).flat_map(|c| got[c * ys + yo..c * ys + yo + rows].iter().map(|v| v.to_bits())).collect();
                    if first9.is_empty() {
                        first9 = rows9;
                    } else {
                        assert!(first9 == rows9, "{what}: rows 0..9 at n={n} differ from n=9");
                    }
                }
                let mut written = vec![false; len];
                for c in 0..n {
                    let at = c * ys + yo;
                    worst = worst.max(check(&format!("{what} n={n} row {c}"), &got[at..at + rows], &want[c].0, &want[c].1).unwrap());
                    written[at..at + rows].iter_mut().for_each(|w| *w = true);
                }
                for (i, g) in got.iter().enumerate() {
                    assert!(written[i] || g.to_bits() == POISON, "{what} n={n}: wrote element {i} outside its rows (y_off {yo}, y_stride {ys})");
                }
                if n == NMAX {
                    last = got;
                }
            }
            // The GEMV (n = 1) of each activation row alone, all in one submit.
            let ygv = h.poisoned(NMAX * rows);
            let sz = std::mem::size_of::<f32>() as u64;
            assert_eq!((xs_stride as u64 * sz) % h.gpu.info.storage_align, 0);
            h.run(|rec: &mut Recorder<'_>| {
                for c in 0..NMAX {
                    let xb = Bind { buf: &xbuf, offset: (c * xs_stride) as u64 * sz, range: cols as u64 * sz };
                    let p = GemvPush { rows: rows as u32, cols: cols as u32, row_bytes: row_bytes as u32, x_stride: cols as u32, y_stride: 0, y_off: (c * rows) as u32 };
                    rec.gemv(ty, 1, (&wbuf).into(), xb, (&ygv).into(), p)?;
                }
                Ok(())
            });
            let gv = ygv.read_f32(0, NMAX * rows).unwrap();
            for c in 0..NMAX {
                let gemv: Vec<f64> = gv[c * rows..(c + 1) * rows].iter().map(|&v| v as f64).collect();
                let at = c * ys + yo;
                worst_gemv = worst_gemv.max(check(&format!("{what}: GEMM row {c} against the GEMV"), &last[at..at + rows], &gemv, &want[c].1).unwrap());
            }
            // Negative controls: the oracle of a weight matrix with one value of row 5 moved by
            // a tenth of that row's largest magnitude (about one 4-bit quantization step, amax/8),
            // at the activation's largest value, must fail; so must an output never written.
            let (mut wrong, bar) = want[0].clone();
            let amax = wq[5 * cols..6 * cols].iter().fold(0f32, |m, v| m.max(v.abs())) as f64;
            let xmax = xrows[0].iter().fold(0f32, |m, v| m.max(v.abs())) as f64;
            wrong[5] += 0.1 * amax * xmax;
            assert!(check("control", &last[yo..yo + rows], &wrong, &bar).is_err(), "{what}: a perturbed oracle must fail the bar");
            let unwritten = h.poisoned(rows);
            assert!(check("control: poisoned", &unwritten.read_f32(0, rows).unwrap(), &want[0].0, &bar).is_err());
        }
    }
    eprintln!("gemm: 9 formats x 4 shapes x {} row counts in {:.1} s; worst err/bar {worst:.3} (oracle), {worst_gemv:.3} (GEMV)", NS.len(), t0.elapsed().as_secs_f64());
}

#[test]
fn gemm_classifier_sized_rows() {
    // 151936 weight rows (Qwen's classifier): 2374 row tiles in the grid's x dimension.
    let Some(mut h) = Harness::new() else { return };
    let (rows, cols, n) = (151_936usize, 32usize, 9usize);
    let mut rng = Rng(17);
    let src = rng.vec(rows * cols, 1.0);
    let wbytes = formats::quantize(GgmlType::Q8_0, &src).unwrap();
    let mut wq = vec![0f32; rows * cols];
    formats::dequantize(GgmlType::Q8_0, &wbytes, &mut wq).unwrap();
    let x = rng.vec(n * cols, 1.0);
    let ((wbuf, row_bytes), xbuf, ybuf) = (h.weights(GgmlType::Q8_0, cols, &wbytes), h.buf_f32(&x), h.poisoned(n * rows));
    let p = GemvPush { rows: rows as u32, cols: cols as u32, row_bytes: row_bytes as u32, x_stride: cols as u32, y_stride: rows as u32, y_off: 0 };
    assert_eq!(gemm_split(rows as u32, cols as u32).1, 1, "one unit a row cannot split");
    h.run(|rec| rec.gemm_in(GemmTier::Tiled, GgmlType::Q8_0, n as u32, (&wbuf).into(), (&xbuf).into(), (&ybuf).into(), p, None));
    let got = ybuf.read_f32(0, n * rows).unwrap();
    for c in 0..n {
        let (want, bar) = gemv_oracle(&wq, &x[c * cols..(c + 1) * cols], rows, cols);
        check(&format!("gemm 151936 rows, row {c}"), &got[c * rows..(c + 1) * rows], &want, &bar).unwrap();
    }
}

#[test]
fn gemm_refuses_what_it_cannot_run() {
    let Some(h) = Harness::new() else { return };
    let Harness { gpu, mut pipes, mut desc } = h;
    let w = resin_vulkan::buffers::Buffer::new(&gpu, 4096, resin_vulkan::buffers::Location::Device).unwrap();
    let p = GemvPush { rows: 4, cols: 32, row_bytes: 34, x_stride: 32, y_stride: 4, y_off: 0 };
    let mut errs = Vec::new();
    submit_once(&gpu, |cmd| {
        let mut rec = Recorder::new(&gpu, &mut pipes, &mut desc, cmd);
        if !gpu.info.coopmat {
            // The cooperative-matrix tier forced on a device without it is an error, not a dispatch.
            errs.push(rec.gemm_in(GemmTier::CoopMat, GgmlType::Q8_0, 3, (&w).into(), (&w).into(), (&w).into(), p, None).is_err());
        }
        errs.push(rec.gemm(GgmlType::Q8_0, 0, (&w).into(), (&w).into(), (&w).into(), p, None).is_err());
        errs.push(rec.gemm(GgmlType::Q8_0, 3, (&w).into(), (&w).into(), (&w).into(), GemvPush { cols: 48, ..p }, None).is_err());
        errs.push(rec.gemm(GgmlType::Q4_K, 3, (&w).into(), (&w).into(), (&w).into(), GemvPush { cols: 128, ..p }, None).is_err());
        errs.push(rec.gemm(GgmlType::Q2_K, 3, (&w).into(), (&w).into(), (&w).into(), GemvPush { cols: 256, ..p }, None).is_err());
        // A shape that splits K with partial-sum buffers too small.
        let split = GemvPush { rows: 4, cols: 2048, row_bytes: 2176, x_stride: 2048, y_stride: 4, y_off: 0 };
        errs.push(rec.gemm(GgmlType::Q8_0, 3, (&w).into(), (&w).into(), (&w).into(), split, Some(GemmSplit { part: (&w).into(), done: (&w).into() })).is_err());
    })
    .unwrap();
    assert!(errs.iter().all(|&e| e), "{errs:?}");
}

#[test]
#[allow(clippy::needless_range_loop)]
fn gemm_coopmat_tier_where_offered() {
    // Runs only on a device with a 16x16x16 f16 x f16 -> f32 cooperative-matrix shape (never
    // on lavapipe: run on the H200 through the device kit). The tier is forced, whatever
    // pick_tier says. Rows of 17 units (544 values) leave a partial K step at 2 and 4 units a
    // step (RESIN_VK_GEMM_KU).
    // Bar: weights and activations each rounded to f16 (relative 2^-11, U16), so each product
    // within 2 U16 (+U16^2) of the exact; subnormal f16 halves add at most 2^-25 absolute per
    // operand (|w|, |x| <= 2 here); then the f32 accumulation's (cols + 8) u.
    let Some(mut h) = Harness::new() else { return };
    let info = h.gpu.info.clone();
    if !(info.coopmat && has_f16_16x16x16(&info.coopmat_shapes) && info.f16_arith && info.api >= (1, 3, 0)) {
        eprintln!("SKIP: {} has no 16x16x16 f16 x f16 -> f32 cooperative matrix; the coopmat GEMM tier was not run", info.name);
        return;
    }
    let rows = 130usize;
    let mut rng = Rng(0xc00b);
    // Second: rows that split K in 4 pieces (the last one short, a partial K step in it).
    for (ty, cols) in FORMATS.iter().flat_map(|&ty| if ty.block_len() == 256 { [(ty, 512), (ty, 2304)] } else { [(ty, 544), (ty, 2080)] }) {
        let (part, done) = split_bufs(&h, rows, cols);
        let split = GemmSplit { part: (&part).into(), done: (&done).into() };
        let src = rng.vec(rows * cols, 1.0);
        let wbytes = formats::quantize(ty, &src).unwrap();
        let mut wq = vec![0f32; rows * cols];
        formats::dequantize(ty, &wbytes, &mut wq).unwrap();
        let (wbuf, row_bytes) = h.weights(ty, cols, &wbytes);
        let xs = rng.vec(NMAX * cols, 2.0);
        let xbuf = h.buf_f32(&xs);
        let mut first9: Vec<u32> = Vec::new();
        for n in [1usize, 9, 65, NMAX] {
            let (ys, yo) = (rows + 5, 3usize);
            let len = (n + 1) * ys + yo;
            let ybuf = h.poisoned(len);
            let p = GemvPush { rows: rows as u32, cols: cols as u32, row_bytes: row_bytes as u32, x_stride: cols as u32, y_stride: ys as u32, y_off: yo as u32 };
            h.run(|rec| rec.gemm_in(GemmTier::CoopMat, ty, n as u32, (&wbuf).into(), (&xbuf).into(), (&ybuf).into(), p, Some(split)));
            let got = ybuf.read_f32(0, len).unwrap();
            // Each row the same bits whatever the row count: 9 rows run in a 64-row activation
            // tile, 65 and 200 in 128-row tiles (coopmat_tile_n).
            if n >= 9 {
                let rows9: Vec<u32> = (0..9).flat_map(|c| got[c * ys + yo..c * ys + yo + rows].iter().map(|v| v.to_bits())).collect();
                if first9.is_empty() {
                    first9 = rows9;
                } else {
                    assert!(
                        first9 == rows9,
                        "coopmat gemm {ty} {rows}x{cols}: rows 0..9 at n={n} (tile {}) differ from n=9 (tile {})",
                        coopmat_tile_n(n as u32),
                        coopmat_tile_n(9)
                    );
                }
            }
            let mut written = vec![false; len];
            for c in 0..n {
                let (want, mut bar) = gemv_oracle(&wq, &xs[c * cols..(c + 1) * cols], rows, cols);
                for r in 0..rows {
                    let a = bar[r] / ((cols as f64 + 8.0) * U);
                    bar[r] += (2.0 * U16 + U16 * U16) * a + cols as f64 * 4.0 * 2f64.powi(-25);
                }
                let at = c * ys + yo;
                check(&format!("coopmat gemm {ty} n={n} row {c}"), &got[at..at + rows], &want, &bar).unwrap();
                written[at..at + rows].iter_mut().for_each(|w| *w = true);
                if c == 0 {
                    // Control: an oracle moved by four bars must fail (the wide f16 bar aside).
                    let mut wrong = want.clone();
                    wrong[5] += 4.0 * bar[5];
                    assert!(check("control", &got[at..at + rows], &wrong, &bar).is_err(), "coopmat {ty}: a perturbed oracle must fail");
                }
            }
            for (i, g) in got.iter().enumerate() {
                assert!(written[i] || g.to_bits() == POISON, "coopmat gemm {ty} n={n}: wrote element {i} outside its rows");
            }
        }
    }
}

// ---------------------------------------------------------------- host: tier choice and grid

fn shape(m: u32, n: u32, k: u32, types: &str) -> CoopShape {
    CoopShape { m, n, k, types: types.into() }
}

/// An H200 as the driver reports it (README "On the H200"), with the memory model enabled.
fn h200() -> GemmCaps {
    GemmCaps {
        coopmat: true,
        coopmat_shapes: vec![shape(16, 16, 16, "f16xf16->f16"), shape(16, 16, 16, "f16xf16->f32"), shape(16, 16, 32, "s8xs8->s32")],
        f16_arith: true,
        api: (1, 4, 312),
        subgroup_basic: true,
        subgroup_size: 32,
        max_workgroup_invocations: 1024,
        shared_memory: 48 * 1024,
        vulkan_memory_model: true,
    }
}

/// lavapipe: no cooperative matrix.
fn lavapipe() -> GemmCaps {
    GemmCaps {
        coopmat: false,
        coopmat_shapes: vec![],
        f16_arith: true,
        api: (1, 3, 0),
        subgroup_basic: true,
        subgroup_size: 8,
        max_workgroup_invocations: 1024,
        shared_memory: 32 * 1024,
        vulkan_memory_model: true,
    }
}

#[test]
fn coopmat_tile_choice() {
    // The H200 (subgroup 32, 1024 threads, 48 KiB): both tiles; 128 rows take 8 subgroups.
    assert!(coopmat_tile_fits(128, 32, 1024, 49_152) && coopmat_tile_fits(64, 32, 1024, 49_152));
    // Subgroups of 64 (512 threads) and 16 (128 threads) still hold a step's quads.
    assert!(coopmat_tile_fits(128, 64, 1024, 49_152) && coopmat_tile_fits(128, 16, 1024, 49_152));
    // Subgroups of 8: 64 threads would hold 32 quads each at 2 units a step; 16 KiB of shared
    // memory or 128 threads at most: no room. The 64-row tile stays.
    assert!(!coopmat_tile_fits(128, 8, 1024, 49_152));
    assert!(!coopmat_tile_fits(128, 32, 1024, 16_384));
    assert!(!coopmat_tile_fits(128, 32, 128, 49_152));
    assert_eq!(coopmat_tile_n(200), 128);
    assert_eq!(coopmat_tile_n(64), 64);
}

#[test]
fn tier_choice() {
    assert_eq!(pick_tier(&h200()), GemmTier::CoopMat);
    assert_eq!(pick_tier(&lavapipe()), GemmTier::Tiled);
    // Each requirement alone declines the cooperative-matrix tier.
    type Change = Box<dyn Fn(&mut GemmCaps)>;
    let declines: Vec<(&str, Change)> = vec![
        ("no coopmat feature", Box::new(|c| c.coopmat = false)),
        ("no shapes", Box::new(|c| c.coopmat_shapes.clear())),
        ("only f16 results", Box::new(|c| c.coopmat_shapes = vec![shape(16, 16, 16, "f16xf16->f16")])),
        ("only int8", Box::new(|c| c.coopmat_shapes = vec![shape(16, 16, 32, "s8xs8->s32")])),
        ("other f16 shape", Box::new(|c| c.coopmat_shapes = vec![shape(16, 8, 16, "f16xf16->f32"), shape(8, 8, 16, "f16xf16->f32")])),
        ("no f16 arithmetic", Box::new(|c| c.f16_arith = false)),
        ("Vulkan 1.2", Box::new(|c| c.api = (1, 2, 198))),
        ("no subgroup basic", Box::new(|c| c.subgroup_basic = false)),
        ("subgroup size 0", Box::new(|c| c.subgroup_size = 0)),
        ("workgroup too large", Box::new(|c| c.max_workgroup_invocations = 64)),
        ("too little shared memory", Box::new(|c| c.shared_memory = 8 * 1024)),
        ("no memory model", Box::new(|c| c.vulkan_memory_model = false)),
    ];
    for (what, f) in declines {
        let mut c = h200();
        f(&mut c);
        assert_eq!(pick_tier(&c), GemmTier::Tiled, "{what}");
    }
    // AMD-like: 16x16x16 f16 -> f32 with 64-wide subgroups fits 256 invocations.
    let mut amd = h200();
    amd.subgroup_size = 64;
    assert_eq!(pick_tier(&amd), GemmTier::CoopMat);
    // A real device's caps carry what device.rs enabled; without cooperative matrices (lavapipe)
    // the portable tier is picked.
    if let Some(h) = Harness::new() {
        let caps = GemmCaps::of(&h.gpu.info);
        assert_eq!(caps.vulkan_memory_model, h.gpu.info.vulkan_memory_model);
        if !h.gpu.info.coopmat {
            assert_eq!(pick_tier(&caps), GemmTier::Tiled);
        }
    }
}

#[test]
fn grid_and_variants() {
    assert_eq!(gemm_grid(151_936, 512, 1, 64).unwrap(), [2374, 8, 1]);
    assert_eq!(gemm_grid(67, 1, 1, 8).unwrap(), [2, 1, 1]);
    assert_eq!(gemm_grid(64, 65, 4, 64).unwrap(), [1, 2, 4], "z: K pieces");
    assert!(gemm_grid(64 * 65_536 + 1, 9, 1, 16).is_err());
    assert!(gemm_grid(1, 65_536 * 64 + 1, 1, 64).is_err());
    let tiles: Vec<u32> = [1, 8, 9, 16, 17, 32, 33, 64, 65, 512].iter().map(|&n| tiled_tile_n(n)).collect();
    assert_eq!(tiles, [8, 8, 16, 16, 32, 32, 64, 64, 64, 64]);
    // K splits by the matrix's shape: few row tiles and a long K take pieces, each a whole
    // number of 4-unit steps; a classifier's many row tiles or a short K take none.
    assert_eq!(gemm_split(2048, 8192), (64, 4));
    assert_eq!(gemm_split(512, 2048), (16, 4));
    assert_eq!(gemm_split(8192, 2048), (64, 1));
    assert_eq!(gemm_split(128_256, 2048), (64, 1));
    assert_eq!(gemm_split(576, 576), (18, 1));
    assert_eq!(gemm_split(896, 4864), (20, 8));
    assert_eq!(gemm_variant(GgmlType::Q4_K, GemmTier::Tiled).unwrap(), "gemm_q4_k");
    assert_eq!(gemm_variant(GgmlType::Q4_K, GemmTier::CoopMat).unwrap(), "gemm_cm_q4_k");
    // Every format has both modules; the cooperative-matrix ones are SPIR-V 1.6 declaring
    // CooperativeMatrixKHR (OpCapability 6022) and the VulkanMemoryModel capability (5345), the
    // portable ones SPIR-V 1.3 with neither.
    let words = |b: &[u8]| b.chunks_exact(4).map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]])).collect::<Vec<u32>>();
    let has_cap = |w: &[u32], cap: u32| w.windows(2).any(|p| p[0] == (2 << 16 | 17) && p[1] == cap);
    for ty in FORMATS {
        for tier in [GemmTier::Tiled, GemmTier::CoopMat] {
            let name = gemm_variant(ty, tier).unwrap();
            let v = VARIANTS.iter().find(|v| v.name == name).unwrap_or_else(|| panic!("no variant {name}"));
            let w = words(v.spv);
            let cm = tier == GemmTier::CoopMat;
            assert_eq!(w[1], if cm { 0x0001_0600 } else { 0x0001_0300 }, "{name}: SPIR-V version");
            assert_eq!(has_cap(&w, 6022), cm, "{name}: CooperativeMatrixKHR");
            assert_eq!(has_cap(&w, 5345), cm, "{name}: VulkanMemoryModel");
        }
    }
}
