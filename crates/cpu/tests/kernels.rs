//! The quantized matmul kernels: every weight format on every SIMD path this machine has,
//! against an f64 dot of the dequantized weights with the f32 activations, under a named
//! error bar; a negative control that must break the bar; and bit-identity of one output
//! element whatever the batch and the thread count.
//!
//! Error bars (derived, per family):
//! - `Q8ACT_BAR` (every quantized format; activations quantized to 8 bits per block of 32 or
//!   256 values with scale d_a = amax/127): rounding moves each activation by at most d_a/2,
//!   so |got - exact| <= sum_e |w_e| * d_a(e) / 2 (+ f32 rounding, 1e-5 * sum |w_e x_e|).
//!   For Gaussian activations amax is about 2.5 sigma over 32 values (3 sigma over 256), so the
//!   bar is about 1.2% (1.5%) of sum |w_e x_e|: the "~1e-2 relative" of 8-bit activations.
//! - `F32_BAR` (F32, F16, BF16 weights, activations kept in f32): f32 accumulation in chains
//!   of at most cols/8 + 32 additions: |got - exact| <= (cols/8 + 32) * 2^-23 * sum |w_e x_e|.

mod common;

use common::Rng;
use resin_cpu::kernels::{matmul_on, Acts, QMatrix, Simd};
use resin_gguf::GgmlType;

const ALL: [GgmlType; 13] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];

fn h(v: f32) -> [u8; 2] {
    half::f16::from_f32(v).to_bits().to_le_bytes()
}

/// Random valid bytes for `rows x cols` of `ty`, with realistic scales.
fn random_weights(ty: GgmlType, rows: usize, cols: usize, rng: &mut Rng) -> Vec<u8> {
    use GgmlType::*;
    let bb = ty.block_bytes();
    let nblocks = rows * cols / ty.block_len();
    let mut out = vec![0u8; nblocks * bb];
    for b in 0..nblocks {
        let blk = &mut out[b * bb..(b + 1) * bb];
        match ty {
            F32 => blk.copy_from_slice(&rng.gauss().to_le_bytes()),
            F16 => blk.copy_from_slice(&h(rng.gauss())),
            BF16 => blk.copy_from_slice(&((rng.gauss().to_bits() >> 16) as u16).to_le_bytes()),
            _ => {
                for v in blk.iter_mut() {
                    *v = rng.next() as u8;
                }
                let d = 0.01 * (0.5 + rng.unit());
                let m = 0.05 * (rng.unit() - 0.5);
                match ty {
                    Q4_0 | Q5_0 | Q8_0 => blk[0..2].copy_from_slice(&h(d)),
                    Q4_1 | Q5_1 => {
                        blk[0..2].copy_from_slice(&h(d));
                        blk[2..4].copy_from_slice(&h(m));
                    }
                    Q2_K => {
                        blk[80..82].copy_from_slice(&h(d));
                        blk[82..84].copy_from_slice(&h(d * 0.5));
                    }
                    Q3_K => blk[108..110].copy_from_slice(&h(d * 0.1)),
                    Q4_K | Q5_K => {
                        blk[0..2].copy_from_slice(&h(d * 0.1));
                        blk[2..4].copy_from_slice(&h(d * 0.1));
                    }
                    Q6_K => blk[208..210].copy_from_slice(&h(d * 0.05)),
                    _ => unreachable!(),
                }
            }
        }
    }
    out
}

fn f16v(b: &[u8], at: usize) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([b[at], b[at + 1]])).to_f32()
}

fn k4(j: usize, q: &[u8]) -> (f32, f32) {
    if j < 4 {
        ((q[j] & 63) as f32, (q[j + 4] & 63) as f32)
    } else {
        (((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4)) as f32, ((q[j + 4] >> 4) | ((q[j] >> 6) << 4)) as f32)
    }
}

/// The test's own reference dequantization, written from ggml-quants.c (dequantize_row_*).
fn dequant_block(ty: GgmlType, b: &[u8], y: &mut [f32]) {
    use GgmlType::*;
    match ty {
        F32 => y[0] = f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
        F16 => y[0] = f16v(b, 0),
        BF16 => y[0] = f32::from_bits((u16::from_le_bytes([b[0], b[1]]) as u32) << 16),
        Q4_0 => {
            let d = f16v(b, 0);
            for j in 0..16 {
                y[j] = ((b[2 + j] & 0xF) as i32 - 8) as f32 * d;
                y[j + 16] = ((b[2 + j] >> 4) as i32 - 8) as f32 * d;
            }
        }
        Q4_1 => {
            let (d, m) = (f16v(b, 0), f16v(b, 2));
            for j in 0..16 {
                y[j] = (b[4 + j] & 0xF) as f32 * d + m;
                y[j + 16] = (b[4 + j] >> 4) as f32 * d + m;
            }
        }
        Q5_0 | Q5_1 => {
            let one = ty == Q5_1;
            let d = f16v(b, 0);
            let m = if one { f16v(b, 2) } else { 0.0 };
            let ho = if one { 4 } else { 2 };
            let qh = u32::from_le_bytes([b[ho], b[ho + 1], b[ho + 2], b[ho + 3]]);
            let qs = &b[ho + 4..ho + 20];
            for j in 0..16 {
                let xh0 = (((qh >> j) << 4) & 0x10) as i32;
                let xh1 = ((qh >> (j + 12)) & 0x10) as i32;
                let (x0, x1) = ((qs[j] & 0xF) as i32 | xh0, (qs[j] >> 4) as i32 | xh1);
                if one {
                    y[j] = x0 as f32 * d + m;
                    y[j + 16] = x1 as f32 * d + m;
                } else {
                    y[j] = (x0 - 16) as f32 * d;
                    y[j + 16] = (x1 - 16) as f32 * d;
                }
            }
        }
        Q8_0 => {
            let d = f16v(b, 0);
            for j in 0..32 {
                y[j] = b[2 + j] as i8 as f32 * d;
            }
        }
        Q2_K => {
            let (d, min) = (f16v(b, 80), f16v(b, 82));
            let mut is = 0;
            let mut yi = 0;
            for n in 0..2 {
                let q = &b[16 + 32 * n..];
                for shift in [0, 2, 4, 6] {
                    for half in 0..2 {
                        let sc = b[is];
                        is += 1;
                        let (dl, ml) = (d * (sc & 0xF) as f32, min * (sc >> 4) as f32);
                        for l in 0..16 {
                            y[yi] = dl * ((q[l + 16 * half] >> shift) & 3) as f32 - ml;
                            yi += 1;
                        }
                    }
                }
            }
        }
        Q3_K => {
            let d = f16v(b, 108);
            let s = &b[96..108];
            let mut sc = [0i32; 16];
            for j in 0..16 {
                // ggml's 6-bit scale layout, written out per index.
                let lo = if j < 8 { s[j] & 0xF } else { s[j - 8] >> 4 };
                let hi = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
                sc[j] = (lo | (hi << 4)) as i32 - 32;
            }
            let mut is = 0;
            let mut yi = 0;
            let mut m = 1u8;
            for n in 0..2 {
                let q = &b[32 + 32 * n..];
                for shift in [0, 2, 4, 6] {
                    for half in 0..2 {
                        let dl = d * sc[is] as f32;
                        is += 1;
                        for l in 0..16 {
                            let li = l + 16 * half;
                            let v = ((q[li] >> shift) & 3) as i32 - if b[li] & m != 0 { 0 } else { 4 };
                            y[yi] = dl * v as f32;
                            yi += 1;
                        }
                    }
                    m <<= 1;
                }
            }
        }
        Q4_K | Q5_K => {
            let five = ty == Q5_K;
            let (d, min) = (f16v(b, 0), f16v(b, 2));
            let s = &b[4..16];
            let ql = &b[if five { 48 } else { 16 }..];
            let mut yi = 0;
            for j in 0..4 {
                let (sc1, m1) = k4(2 * j, s);
                let (sc2, m2) = k4(2 * j + 1, s);
                for l in 0..32 {
                    let hb = if five && b[16 + l] & (1 << (2 * j)) != 0 { 16.0 } else { 0.0 };
                    y[yi] = d * sc1 * ((ql[32 * j + l] & 0xF) as f32 + hb) - min * m1;
                    yi += 1;
                }
                for l in 0..32 {
                    let hb = if five && b[16 + l] & (2 << (2 * j)) != 0 { 16.0 } else { 0.0 };
                    y[yi] = d * sc2 * ((ql[32 * j + l] >> 4) as f32 + hb) - min * m2;
                    yi += 1;
                }
            }
        }
        Q6_K => {
            let d = f16v(b, 208);
            for n in 0..2 {
                let ql = &b[64 * n..];
                let qh = &b[128 + 32 * n..];
                let sc = &b[192 + 8 * n..];
                let y = &mut y[128 * n..];
                for l in 0..32 {
                    let is = l / 16;
                    let q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i32 - 32;
                    let q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
                    let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
                    let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
                    y[l] = d * (sc[is] as i8) as f32 * q1 as f32;
                    y[l + 32] = d * (sc[is + 2] as i8) as f32 * q2 as f32;
                    y[l + 64] = d * (sc[is + 4] as i8) as f32 * q3 as f32;
                    y[l + 96] = d * (sc[is + 6] as i8) as f32 * q4 as f32;
                }
            }
        }
        _ => unreachable!(),
    }
}

fn dequant(ty: GgmlType, data: &[u8], n: usize) -> Vec<f32> {
    let (bl, bb) = (ty.block_len(), ty.block_bytes());
    let mut y = vec![0f32; n];
    for b in 0..n / bl {
        dequant_block(ty, &data[b * bb..(b + 1) * bb], &mut y[b * bl..(b + 1) * bl]);
    }
    // Cross-check against the gguf crate's reference once it exists.
    let theirs = std::panic::catch_unwind(|| {
        let mut t = vec![0f32; n];
        resin_gguf::formats::dequantize(ty, data, &mut t).ok().map(|_| t)
    });
    if let Ok(Some(t)) = theirs {
        for (i, (a, b)) in y.iter().zip(&t).enumerate() {
            assert!(a.to_bits() == b.to_bits() || (a - b).abs() <= 1e-6 * a.abs().max(1e-3), "{ty} value {i}: test {a} vs gguf {b}");
        }
    }
    y
}

fn random_acts(n: usize, cols: usize, rng: &mut Rng) -> Vec<f32> {
    (0..n * cols).map(|_| rng.gauss()).collect()
}

/// The named bar for one output element (see the module docs).
fn bar(ty: GgmlType, w: &[f32], x: &[f32]) -> f64 {
    let sum_abs: f64 = w.iter().zip(x).map(|(a, b)| (*a as f64 * *b as f64).abs()).sum();
    match ty {
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => (w.len() as f64 / 8.0 + 32.0) * f32::EPSILON as f64 * sum_abs + 1e-30,
        _ => {
            let blk = if ty.block_len() == 256 { 256 } else { 32 };
            let mut q8 = 0f64;
            for (wc, xc) in w.chunks(blk).zip(x.chunks(blk)) {
                let amax = xc.iter().fold(0f32, |m, v| m.max(v.abs())) as f64;
                let da = amax / 127.0;
                q8 += wc.iter().map(|v| v.abs() as f64).sum::<f64>() * da / 2.0;
            }
            q8 * 1.001 + 1e-5 * sum_abs
        }
    }
}

fn exact(w: &[f32], x: &[f32]) -> f64 {
    w.iter().zip(x).map(|(a, b)| *a as f64 * *b as f64).sum()
}

fn shapes(ty: GgmlType) -> Vec<(usize, usize)> {
    match ty.block_len() {
        1 => vec![(13, 100), (9, 64)],
        32 => vec![(37, 352), (21, 544), (5, 32), (6, 64), (7, 768), (3, 256)],
        _ => vec![(19, 512), (6, 256)],
    }
}

/// (worst err / bar, mean err / sum|w x|) over every element.
#[allow(clippy::too_many_arguments)]
fn check(ty: GgmlType, simd: Simd, rows: usize, cols: usize, n: usize, data: &[u8], wf: &[f32], x: &[f32]) -> (f64, f64) {
    let w = QMatrix::new(ty, rows, cols, data).unwrap();
    let acts = Acts::prepare(x, n, cols, ty);
    let mut out = vec![0f32; n * rows];
    matmul_on(simd, &w, &acts, &mut out);
    let (mut worst, mut rel) = (0f64, 0f64);
    for i in 0..n {
        for r in 0..rows {
            let (wr, xr) = (&wf[r * cols..(r + 1) * cols], &x[i * cols..(i + 1) * cols]);
            let e = (out[i * rows + r] as f64 - exact(wr, xr)).abs();
            worst = worst.max(e / bar(ty, wr, xr));
            let sa: f64 = wr.iter().zip(xr).map(|(a, b)| (*a as f64 * *b as f64).abs()).sum();
            rel += e / sa.max(1e-30);
        }
    }
    (worst, rel / (n * rows) as f64)
}

#[test]
fn every_format_every_path_within_bar() {
    let mut rng = Rng(0x5eed_1234_abcd_0001);
    for ty in ALL {
        for (rows, cols) in shapes(ty) {
            let data = random_weights(ty, rows, cols, &mut rng);
            let wf = dequant(ty, &data, rows * cols);
            let n = 6;
            let x = random_acts(n, cols, &mut rng);
            let mut outs = Vec::new();
            for simd in Simd::available() {
                let (worst, rel) = check(ty, simd, rows, cols, n, &data, &wf, &x);
                println!("{ty:5} {:10} {rows:3}x{cols:4}: worst err/bar {worst:.3}, mean rel err {rel:.2e}", simd.name());
                assert!(worst <= 1.0, "{ty} on {}: error {worst} x the bar", simd.name());
                let w = QMatrix::new(ty, rows, cols, &data).unwrap();
                let acts = Acts::prepare(&x, n, cols, ty);
                let mut out = vec![0f32; n * rows];
                matmul_on(simd, &w, &acts, &mut out);
                outs.push((simd, out));
            }
            // Every path does the same integer dots: they agree far tighter than the bar.
            let (_, base) = &outs[0];
            for (simd, o) in &outs[1..] {
                for (k, (a, b)) in base.iter().zip(o).enumerate() {
                    let (i, r) = (k / rows, k % rows);
                    let sa: f64 = wf[r * cols..(r + 1) * cols].iter().zip(&x[i * cols..(i + 1) * cols]).map(|(a, b)| (*a as f64 * *b as f64).abs()).sum();
                    assert!(((a - b).abs() as f64) <= 1e-5 * sa + 1e-12, "{ty} {}: element {k} portable {a} vs {b}", simd.name());
                }
            }
        }
    }
}

/// Flip the sign of one weight block (its scale, or one float weight) in every row: the
/// result must break the bar, or the bar tests nothing.
#[test]
fn negative_control_breaks_the_bar() {
    use GgmlType::*;
    let mut rng = Rng(0x0bad_cafe_0000_0007);
    for ty in ALL {
        let (rows, cols) = shapes(ty)[0];
        let data = random_weights(ty, rows, cols, &mut rng);
        let wf = dequant(ty, &data, rows * cols);
        let mut bad = data.clone();
        let row_bytes = data.len() / rows;
        let d_at = match ty {
            F32 => 3,
            F16 | BF16 | Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q4_K | Q5_K => 1,
            Q2_K => 81,
            Q3_K => 109,
            Q6_K => 209,
            _ => unreachable!(),
        };
        for r in 0..rows {
            bad[r * row_bytes + d_at] ^= 0x80;
        }
        let n = 4;
        let x = random_acts(n, cols, &mut rng);
        for simd in Simd::available() {
            let (worst, _) = check(ty, simd, rows, cols, n, &bad, &wf, &x);
            assert!(worst > 1.0, "{ty} on {}: a perturbed block stays within the bar ({worst})", simd.name());
        }
    }
}

/// out[i, r] is bit-identical whatever n, the other rows in the batch and the thread count.
#[test]
fn bit_identical_across_batches_and_threads() {
    let mut rng = Rng(0x1de7_0000_0000_0042);
    for ty in ALL {
        let (rows, cols) = shapes(ty)[0];
        let data = random_weights(ty, rows, cols, &mut rng);
        let w = QMatrix::new(ty, rows, cols, &data).unwrap();
        let n = 33;
        let x = random_acts(n, cols, &mut rng);
        for simd in Simd::available() {
            let run = |xs: &[f32], k: usize| {
                let acts = Acts::prepare(xs, k, cols, ty);
                let mut out = vec![0f32; k * rows];
                matmul_on(simd, &w, &acts, &mut out);
                out
            };
            let all = run(&x, n);
            for i in 0..n {
                let one = run(&x[i * cols..(i + 1) * cols], 1);
                for r in 0..rows {
                    assert_eq!(one[r].to_bits(), all[i * rows + r].to_bits(), "{ty} {}: n=1 vs n=33 at ({i},{r})", simd.name());
                }
            }
            let seven = run(&x[3 * cols..10 * cols], 7);
            for i in 0..7 {
                for r in 0..rows {
                    assert_eq!(seven[i * rows + r].to_bits(), all[(i + 3) * rows + r].to_bits(), "{ty} {}: n=7", simd.name());
                }
            }
            for threads in [1, 3] {
                let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
                let t = pool.install(|| run(&x, n));
                assert!(t.iter().zip(&all).all(|(a, b)| a.to_bits() == b.to_bits()), "{ty} {}: {threads} threads", simd.name());
            }
        }
    }
}

/// Prefill tile shapes (8 and 4 activation rows, remainders) on every shape of every format,
/// including partial 16-block groups of the 32-block formats: each row equals its n = 1 value.
#[test]
fn bit_identical_every_shape_prefill_tiles() {
    let mut rng = Rng(0x7e57_0000_0000_0008);
    for ty in ALL {
        for (rows, cols) in shapes(ty) {
            let data = random_weights(ty, rows, cols, &mut rng);
            let w = QMatrix::new(ty, rows, cols, &data).unwrap();
            for n in [8usize, 13, 20] {
                let x = random_acts(n, cols, &mut rng);
                for simd in Simd::available() {
                    let run = |xs: &[f32], k: usize| {
                        let acts = Acts::prepare(xs, k, cols, ty);
                        let mut out = vec![0f32; k * rows];
                        matmul_on(simd, &w, &acts, &mut out);
                        out
                    };
                    let all = run(&x, n);
                    for i in 0..n {
                        let one = run(&x[i * cols..(i + 1) * cols], 1);
                        for r in 0..rows {
                            assert_eq!(one[r].to_bits(), all[i * rows + r].to_bits(), "{ty} {} {rows}x{cols}: n=1 vs n={n} at ({i},{r})", simd.name());
                        }
                    }
                }
            }
        }
    }
}

/// Big enough to cross the parallel threshold, so chunking over rows really happens.
#[test]
fn bit_identical_when_parallel() {
    let mut rng = Rng(0x9999);
    for ty in [GgmlType::Q4_1, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::Q5_0, GgmlType::F16] {
        let (rows, cols) = (301, 512);
        let data = random_weights(ty, rows, cols, &mut rng);
        let w = QMatrix::new(ty, rows, cols, &data).unwrap();
        let n = 9;
        let x = random_acts(n, cols, &mut rng);
        for simd in Simd::available() {
            let run = |xs: &[f32], k: usize, threads: usize| {
                let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
                pool.install(|| {
                    let acts = Acts::prepare(xs, k, cols, ty);
                    let mut out = vec![0f32; k * rows];
                    matmul_on(simd, &w, &acts, &mut out);
                    out
                })
            };
            let all = run(&x, n, 4);
            for i in [0, 4, 8] {
                let one = run(&x[i * cols..(i + 1) * cols], 1, 2);
                for r in 0..rows {
                    assert_eq!(one[r].to_bits(), all[i * rows + r].to_bits(), "{ty} {}", simd.name());
                }
            }
            assert!(run(&x, n, 1).iter().zip(&all).all(|(a, b)| a.to_bits() == b.to_bits()));
        }
    }
}

#[test]
fn one_acts_serves_every_family() {
    let mut rng = Rng(77);
    let (rows, cols, n) = (8, 512, 3);
    let x = random_acts(n, cols, &mut rng);
    let acts = Acts::prepare(&x, n, cols, GgmlType::Q4_K);
    for ty in [GgmlType::Q6_K, GgmlType::Q5_0, GgmlType::Q8_0, GgmlType::F32] {
        let data = random_weights(ty, rows, cols, &mut rng);
        let w = QMatrix::new(ty, rows, cols, &data).unwrap();
        let mut a = vec![0f32; n * rows];
        let mut b = vec![0f32; n * rows];
        resin_cpu::kernels::matmul(&w, &acts, &mut a);
        resin_cpu::kernels::matmul_f32(&w, &x, n, &mut b);
        assert!(a.iter().zip(&b).all(|(p, q)| p.to_bits() == q.to_bits()), "{ty}");
    }
}

#[test]
fn bad_shapes_are_errors() {
    assert!(QMatrix::new(GgmlType::Q4_K, 2, 100, &[0; 288]).is_err());
    assert!(QMatrix::new(GgmlType::Q4_0, 2, 64, &[0; 71]).is_err());
    assert!(QMatrix::new(GgmlType::Q8_K, 1, 256, &[0; 292]).is_err());
    assert!(QMatrix::new(GgmlType::Q4_0, 2, 64, &[0; 72]).is_ok());
    println!("simd level: {}", resin_cpu::kernels::simd_level());
}

/// Weights quantized by the gguf crate's reference quantizer (realistic value distributions,
/// e.g. Q6_K scales near their limits), every path within the bar.
#[test]
fn reference_quantized_weights_within_bar() {
    let mut rng = Rng(0x00C0_FFEE);
    for ty in ALL {
        let (rows, cols) = shapes(ty)[0];
        let wsrc: Vec<f32> = (0..rows * cols).map(|_| rng.gauss() * 0.05).collect();
        let data = resin_gguf::formats::quantize(ty, &wsrc).unwrap();
        let wf = dequant(ty, &data, rows * cols);
        let n = 5;
        let x = random_acts(n, cols, &mut rng);
        for simd in Simd::available() {
            let (worst, rel) = check(ty, simd, rows, cols, n, &data, &wf, &x);
            println!("{ty:5} {:10} quantized: worst err/bar {worst:.3}, mean rel err {rel:.2e}", simd.name());
            assert!(worst <= 1.0, "{ty} on {}: error {worst} x the bar", simd.name());
        }
    }
}
