//! The CPU home's canonical product (docs/canonical-order.md) against the scalar reference
//! `kernels::canon`, bit for bit: every format with a canonical expression, every SIMD path
//! this machine has, several row counts and row lengths (a short last group, chunks of 8 and
//! 16 blocks), plain and with the norm folded, storing and adding to the residual. Outputs are
//! poisoned first and every element is checked; a control that sums the same blocks left to
//! right (llama.cpp's order) must differ somewhere.

mod common;

use common::Rng;
use resin_core::canon::Cut;
use resin_cpu::kernels::canon::{canon_block, canon_dot, canon_rms_scale, canon_sumsq, CanonActs};
use resin_cpu::kernels::{canon_many_on, CanonMatrix, CanonRows, Epilogue, QMatrix, Simd};
use resin_gguf::{formats, GgmlType};

const FORMATS: [GgmlType; 7] = [GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K];

/// Row lengths: 576 (18 blocks: a short last group, 3 chunks), 896, 4864 (19 chunks), 14336
/// (chunks of 16 blocks); the K-quants take whole super-blocks.
fn lengths(ty: GgmlType) -> Vec<usize> {
    if ty.block_len() == 256 {
        vec![256, 2304, 4864, 14336]
    } else {
        vec![576, 896, 4864, 14336]
    }
}

fn weights(ty: GgmlType, rows: usize, cols: usize, rng: &mut Rng) -> Vec<u8> {
    formats::quantize(ty, &rng.vec(rows * cols, 0.05)).unwrap()
}

/// What the reference gives element (i, m), with the epilogue.
fn want(w: &QMatrix, acts: &[CanonActs], r: &[f32], old: f32, (i, m): (usize, usize), cut: &Cut, epi: Epilogue) -> f32 {
    let rb = w.row_bytes();
    let mut y = canon_dot(w.ty, &w.data[m * rb..(m + 1) * rb], &acts[i], cut);
    if !r.is_empty() {
        y *= r[i];
    }
    match epi {
        Epilogue::Store => y,
        Epilogue::Add => y + old,
    }
}

#[test]
fn canonical_products_equal_the_reference_bit_for_bit() {
    let mut rng = Rng(0x5eed_cafe);
    let mut checked = 0usize;
    for ty in FORMATS {
        for cols in lengths(ty) {
            let cut = Cut::of(cols).unwrap();
            // 37 rows: two whole tiles of 16 and a short one (half of which is empty).
            let rows = 37;
            let data = weights(ty, rows, cols, &mut rng);
            let w = QMatrix::new(ty, rows, cols, &data).unwrap();
            let pw = CanonMatrix::pack(&w).unwrap();
            let nw: Vec<f32> = rng.vec(cols, 1.0);
            // Activation rows in passes of 8, 4, 2 and 1.
            for n in [1, 3, 5, 15] {
                let x = rng.vec(n * cols, 1.0);
                for folded in [false, true] {
                    let acts = if folded { CanonRows::norm(&x, n, cols, &nw, 1e-5).unwrap() } else { CanonRows::pack(&x, n, cols).unwrap() };
                    let rows_ref: Vec<CanonActs> = (0..n).map(|i| acts.row(i)).collect();
                    let r: Vec<f32> = if folded { (0..n).map(|i| acts.r(i)).collect() } else { Vec::new() };
                    for simd in Simd::available() {
                        for epi in [Epilogue::Store, Epilogue::Add] {
                            let old: Vec<f32> = rng.vec(n * rows, 1.0);
                            let mut out = match epi {
                                Epilogue::Store => vec![f32::NAN; n * rows],
                                Epilogue::Add => old.clone(),
                            };
                            canon_many_on(simd, &mut [(&pw, &mut out)], &acts, epi).unwrap();
                            for i in 0..n {
                                for m in 0..rows {
                                    let e = want(&w, &rows_ref, &r, old[i * rows + m], (i, m), &cut, epi);
                                    let got = out[i * rows + m];
                                    assert_eq!(got.to_bits(), e.to_bits(), "{ty} {} cols {cols} n {n} folded {folded} {epi:?} ({i}, {m}): {got} vs {e}", simd.name());
                                    checked += 1;
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    assert!(checked > 0);
}

/// The activations: each row's blocks are what the reference quantizes (u = x * w where the
/// norm is folded), and r is the canonical norm's.
#[test]
fn canonical_rows_are_the_reference_blocks() {
    let mut rng = Rng(7);
    for cols in [576, 896, 4864] {
        let cut = Cut::of(cols).unwrap();
        let n = 5;
        let x = rng.vec(n * cols, 1.0);
        let nw = rng.vec(cols, 1.0);
        let plain = CanonRows::pack(&x, n, cols).unwrap();
        let normed = CanonRows::norm(&x, n, cols, &nw, 1e-6).unwrap();
        for i in 0..n {
            let xr = &x[i * cols..(i + 1) * cols];
            assert_eq!(plain.row(i), CanonActs::quantize(xr));
            let u: Vec<f32> = xr.iter().zip(&nw).map(|(a, b)| a * b).collect();
            assert_eq!(normed.row(i), CanonActs::quantize(&u));
            assert_eq!(normed.r(i).to_bits(), canon_rms_scale(canon_sumsq(xr, &cut), cols, 1e-6).to_bits());
            assert_eq!(plain.r(i), 1.0);
        }
    }
    assert!(CanonRows::pack(&[0.0; 48], 1, 48).is_err());
    assert!(CanonRows::norm(&[0.0; 64], 1, 64, &[1.0; 32], 0.0).is_err());
}

/// The control: the same block terms added left to right over the whole row (no chunks, no
/// tree) differ from the kernel's results somewhere, so the test above can tell the orders
/// apart.
#[test]
fn the_left_to_right_order_differs() {
    let mut rng = Rng(11);
    for ty in FORMATS {
        let cols = 4864;
        let rows = 64;
        let data = weights(ty, rows, cols, &mut rng);
        let w = QMatrix::new(ty, rows, cols, &data).unwrap();
        let x = rng.vec(cols, 1.0);
        let acts = CanonRows::pack(&x, 1, cols).unwrap();
        let a = acts.row(0);
        let simd = *Simd::available().last().unwrap();
        let mut out = vec![f32::NAN; rows];
        canon_many_on(simd, &mut [(&CanonMatrix::pack(&w).unwrap(), &mut out)], &acts, Epilogue::Store).unwrap();
        let rb = w.row_bytes();
        let differ = (0..rows)
            .filter(|&m| {
                let seq = (0..cols / 32).fold(0f32, |s, b| s + canon_block(ty, &data[m * rb..(m + 1) * rb], b, &a));
                seq.to_bits() != out[m].to_bits()
            })
            .count();
        assert!(differ > 0, "{ty}: the left-to-right sum equals the canonical one on every row");
    }
}

#[test]
fn bad_shapes_are_errors() {
    let data = formats::quantize(GgmlType::Q8_0, &[0.5; 64]).unwrap();
    let w = CanonMatrix::pack(&QMatrix::new(GgmlType::Q8_0, 1, 64, &data).unwrap()).unwrap();
    let acts = CanonRows::pack(&[1.0; 96], 1, 96).unwrap();
    let mut out = vec![0.0; 1];
    assert!(canon_many_on(Simd::Portable, &mut [(&w, &mut out)], &acts, Epilogue::Store).is_err());
    let acts = CanonRows::pack(&[1.0; 128], 2, 64).unwrap();
    assert!(canon_many_on(Simd::Portable, &mut [(&w, &mut out)], &acts, Epilogue::Store).is_err());
    let f = formats::quantize(GgmlType::F16, &[0.5; 64]).unwrap();
    let wf = QMatrix::new(GgmlType::F16, 1, 64, &f).unwrap();
    assert!(CanonMatrix::pack(&wf).is_err());
}

/// A stack of matrices (a layer's experts) laid out together: each part is its own rows'
/// product, bit for bit with the reference (an expert's rows start a tile; 20 rows: a short
/// tile in every part).
#[test]
fn a_stack_lays_out_each_part_on_its_own_rows() {
    let mut rng = Rng(21);
    for ty in [GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q6_K] {
        let (parts, rows, cols) = (3, 20, 512);
        let data = weights(ty, parts * rows, cols, &mut rng);
        let w = QMatrix::new(ty, parts * rows, cols, &data).unwrap();
        let stack = CanonMatrix::pack_stack(&w, parts).unwrap();
        assert_eq!(stack.len(), parts);
        let x = rng.vec(2 * cols, 1.0);
        let acts = CanonRows::pack(&x, 2, cols).unwrap();
        let rows_ref: Vec<CanonActs> = (0..2).map(|i| acts.row(i)).collect();
        let cut = Cut::of(cols).unwrap();
        for (e, part) in stack.iter().enumerate() {
            assert_eq!((part.rows, part.cols), (rows, cols));
            let mut out = vec![f32::NAN; 2 * rows];
            canon_many_on(Simd::detected(), &mut [(part, &mut out)], &acts, Epilogue::Store).unwrap();
            let rb = w.row_bytes();
            for i in 0..2 {
                for m in 0..rows {
                    let r = e * rows + m;
                    let want = canon_dot(ty, &data[r * rb..(r + 1) * rb], &rows_ref[i], &cut);
                    assert_eq!(out[i * rows + m].to_bits(), want.to_bits(), "{ty} part {e} ({i}, {m})");
                }
            }
        }
    }
    let data = weights(GgmlType::Q8_0, 10, 64, &mut rng);
    assert!(CanonMatrix::pack_stack(&QMatrix::new(GgmlType::Q8_0, 10, 64, &data).unwrap(), 3).is_err());
}
