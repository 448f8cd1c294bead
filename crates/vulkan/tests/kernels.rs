//! Kernel-unit tests on the device (lavapipe in CI) against CPU oracles computed in f64.
//! Outputs are poisoned with NaN before each run, every element is checked against a bar
//! derived from the precision (stated at each check), and each test has a negative control
//! that must fail the same check.

mod common;

use common::*;
use resin_gguf::{formats, GgmlType};
use resin_model::FfnAct;
use resin_vulkan::buffers::{f32_bytes, Buffer, Location};
use resin_vulkan::kernels::*;
use resin_vulkan::pipelines::Bind;

/// The GEMV tiers this device runs (the portable one always; the subgroup one when the device
/// has subgroup arithmetic, else a SKIP line).
fn gemv_tiers(h: &Harness) -> Vec<GemvTier> {
    let info = &h.gpu.info;
    if GemvTier::for_device(info) == GemvTier::Subgroup {
        vec![GemvTier::Portable, GemvTier::Subgroup]
    } else {
        eprintln!("SKIP: the subgroup GEMV tier (device: subgroup {} [{}])", info.subgroup_size, info.subgroup_ops.join(" "));
        vec![GemvTier::Portable]
    }
}

/// Rows a workgroup of `tier` on this device.
fn rows_per_group(h: &Harness, tier: GemvTier) -> usize {
    match tier {
        GemvTier::Portable => 1,
        GemvTier::Subgroup => GemvTier::subgroup_shape(&h.gpu.info).1 as usize,
    }
}

#[test]
fn gemv_picks_the_subgroup_tier_where_the_device_has_it() {
    let Some(h) = Harness::new() else { return };
    let info = &h.gpu.info;
    let want = if info.subgroup_ops.contains(&"arithmetic") && info.subgroup_size >= 4 { GemvTier::Subgroup } else { GemvTier::Portable };
    assert_eq!(GemvTier::for_device(info), want, "subgroup {} [{}]", info.subgroup_size, info.subgroup_ops.join(" "));
    let (wg, rows) = GemvTier::subgroup_shape(info);
    assert!(rows >= 1 && wg == rows * info.subgroup_size && wg <= info.max_workgroup_invocations);
}

fn gemv_every_format_and_row_count(tier: GemvTier) {
    let Some(mut h) = Harness::new() else { return };
    if !gemv_tiers(&h).contains(&tier) {
        return;
    }
    // 67 rows: not a multiple of the subgroup tier's rows a workgroup.
    let (rows, cols) = (67usize, 512usize);
    let mut rng = Rng(0x5eed);
    for ty in FORMATS {
        let src = rng.vec(rows * cols, 1.0);
        let wbytes = formats::quantize(ty, &src).unwrap();
        let mut wq = vec![0f32; rows * cols];
        formats::dequantize(ty, &wbytes, &mut wq).unwrap();
        let (wbuf, row_bytes) = h.weights(ty, cols, &wbytes);
        let xs = rng.vec(8 * cols, 2.0);
        let xbuf = h.buf_f32(&xs);
        let mut one_row: Vec<Vec<f32>> = Vec::new();
        for n in 1..=8usize {
            let ybuf = h.poisoned(8 * rows);
            let p = GemvPush { rows: rows as u32, cols: cols as u32, row_bytes: row_bytes as u32, x_stride: cols as u32, y_stride: rows as u32, y_off: 0 };
            h.run(|rec| rec.gemv_tier(tier, ty, n as u32, (&wbuf).into(), (&xbuf).into(), (&ybuf).into(), p));
            let got = ybuf.read_f32(0, 8 * rows).unwrap();
            for c in 0..n {
                let (want, bar) = gemv_oracle(&wq, &xs[c * cols..(c + 1) * cols], rows, cols);
                let g = &got[c * rows..(c + 1) * rows];
                check(&format!("gemv {tier:?} {ty} n={n} col {c}"), g, &want, &bar).unwrap();
                if n == 1 {
                    one_row.push(g.to_vec());
                }
            }
            // Columns past n are never written.
            assert!(got[n * rows..].iter().all(|v| v.to_bits() == POISON), "gemv {tier:?} {ty} n={n} wrote past its columns");
            if n == 1 {
                // The one-row form alone, for each column, to compare the N-row form bit for bit.
                for c in 1..8 {
                    let xb = h.buf_f32(&xs[c * cols..(c + 1) * cols]);
                    let yb = h.poisoned(rows);
                    h.run(|rec| rec.gemv_tier(tier, ty, 1, (&wbuf).into(), (&xb).into(), (&yb).into(), p));
                    one_row.push(yb.read_f32(0, rows).unwrap());
                }
            } else {
                for c in 0..n {
                    let same = got[c * rows..(c + 1) * rows].iter().zip(&one_row[c]).all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same, "gemv {tier:?} {ty}: the {n}-row form's column {c} differs from the row run alone");
                }
            }
        }
        // Negative control: the oracle of a weight matrix with one value moved by a
        // quantization step must fail the same check.
        let (mut want, bar) = gemv_oracle(&wq, &xs[..cols], rows, cols);
        want[5] += (wq[5 * cols + 7].abs() as f64).max(0.01) * 0.5 * xs[7].abs().max(0.1) as f64;
        let ybuf = h.poisoned(rows);
        let p = GemvPush { rows: rows as u32, cols: cols as u32, row_bytes: row_bytes as u32, x_stride: cols as u32, y_stride: rows as u32, y_off: 0 };
        assert!(check("control: poisoned", &ybuf.read_f32(0, rows).unwrap(), &want, &bar).is_err(), "an unwritten output must fail");
        h.run(|rec| rec.gemv_tier(tier, ty, 1, (&wbuf).into(), (&xbuf).into(), (&ybuf).into(), p));
        assert!(check("control", &ybuf.read_f32(0, rows).unwrap(), &want, &bar).is_err(), "{tier:?} {ty}: a perturbed oracle must fail the bar");
    }
}

#[test]
fn gemv_every_format_and_row_count_portable() {
    gemv_every_format_and_row_count(GemvTier::Portable);
}

#[test]
fn gemv_every_format_and_row_count_subgroup() {
    gemv_every_format_and_row_count(GemvTier::Subgroup);
}

#[test]
fn gemv_row_counts_not_a_multiple_of_the_workgroup_rows() {
    // 1..13 rows (against 4 rows a workgroup of the subgroup tier) and rows of 96 values (12
    // pieces of 8: lanes of an 8- or 32-lane subgroup take unequal counts), 3 columns with
    // y_stride = rows + 2: every row written, the gaps and the rows past `rows` never.
    let Some(mut h) = Harness::new() else { return };
    let mut rng = Rng(0x0dd);
    for tier in gemv_tiers(&h) {
        for ty in FORMATS {
            let cols = if matches!(ty, GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K) { 768usize } else { 96 };
            for rows in [1usize, 2, 3, 5, 6, 7, 9, 13] {
                let src = rng.vec((rows + 3) * cols, 1.0);
                let wbytes = formats::quantize(ty, &src).unwrap();
                let mut wq = vec![0f32; (rows + 3) * cols];
                formats::dequantize(ty, &wbytes, &mut wq).unwrap();
                let n = 3usize;
                let stride = rows + 2;
                let xs = rng.vec(n * cols, 2.0);
                let ((wbuf, row_bytes), xbuf, ybuf) = (h.weights(ty, cols, &wbytes), h.buf_f32(&xs), h.poisoned(n * stride + 4));
                let p = GemvPush { rows: rows as u32, cols: cols as u32, row_bytes: row_bytes as u32, x_stride: cols as u32, y_stride: stride as u32, y_off: 1 };
                h.run(|rec| rec.gemv_tier(tier, ty, n as u32, (&wbuf).into(), (&xbuf).into(), (&ybuf).into(), p));
                let got = ybuf.read_f32(0, n * stride + 4).unwrap();
                for c in 0..n {
                    let (want, bar) = gemv_oracle(&wq[..rows * cols], &xs[c * cols..(c + 1) * cols], rows, cols);
                    check(&format!("gemv {tier:?} {ty} rows={rows} col {c}"), &got[c * stride + 1..c * stride + 1 + rows], &want, &bar).unwrap();
                }
                for (i, v) in got.iter().enumerate() {
                    let inside = (0..n).any(|c| (c * stride + 1..c * stride + 1 + rows).contains(&i));
                    assert!(inside || v.to_bits() == POISON, "gemv {tier:?} {ty} rows={rows}: element {i} written outside the rows");
                }
            }
        }
    }
}

#[test]
fn gemv_output_offset_and_large_row_grid() {
    // Workgroups past 65535 use the second grid dimension (70000 rows in the portable tier,
    // 65535 x rows-a-workgroup + 4465 in the subgroup tier); y_off places the rows.
    let Some(mut h) = Harness::new() else { return };
    for tier in gemv_tiers(&h) {
        let rows = 65_535 * rows_per_group(&h, tier) + 4_465;
        let cols = 32usize;
        let mut rng = Rng(7);
        let src = rng.vec(rows * cols, 1.0);
        let wbytes = formats::quantize(GgmlType::Q8_0, &src).unwrap();
        let mut wq = vec![0f32; rows * cols];
        formats::dequantize(GgmlType::Q8_0, &wbytes, &mut wq).unwrap();
        let x = rng.vec(cols, 1.0);
        let ((wbuf, row_bytes), xbuf, ybuf) = (h.weights(GgmlType::Q8_0, cols, &wbytes), h.buf_f32(&x), h.poisoned(rows + 4));
        let p = GemvPush { rows: rows as u32, cols: cols as u32, row_bytes: row_bytes as u32, x_stride: 32, y_stride: 0, y_off: 3 };
        h.run(|rec| rec.gemv_tier(tier, GgmlType::Q8_0, 1, (&wbuf).into(), (&xbuf).into(), (&ybuf).into(), p));
        let got = ybuf.read_f32(0, rows + 4).unwrap();
        assert!(got[..3].iter().all(|v| v.to_bits() == POISON));
        assert!(got[rows + 3].to_bits() == POISON, "{tier:?}: a row past `rows` was written");
        let (want, bar) = gemv_oracle(&wq, &x, rows, cols);
        check(&format!("gemv {tier:?} {rows} rows"), &got[3..rows + 3], &want, &bar).unwrap();
    }
}

#[test]
fn embed_every_format() {
    // The embedding row in the kernel's dequantization equals the reference's within 2 u
    // relative (the same operations in the same order; `precise` blocks fusing).
    let Some(mut h) = Harness::new() else { return };
    let (vocab, cols) = (40usize, 512usize);
    let mut rng = Rng(11);
    for ty in FORMATS {
        let src = rng.vec(vocab * cols, 1.0);
        let wbytes = formats::quantize(ty, &src).unwrap();
        let mut wq = vec![0f32; vocab * cols];
        formats::dequantize(ty, &wbytes, &mut wq).unwrap();
        let tokens = [3u32, 39, 0, 17];
        let meta: Vec<RowMeta> = tokens.iter().map(|&t| RowMeta { token: t, ..Default::default() }).collect();
        let (mbuf, xbuf) = (h.buf_bytes(&RowMeta::words(&meta)), h.poisoned(tokens.len() * cols));
        // Two parts (rows 0..20 and 20..40), as a matrix split past the storage range is bound.
        let grb = wbytes.len() / vocab;
        let ((w0, rb), (w1, _)) = (h.weights(ty, cols, &wbytes[..20 * grb]), h.weights(ty, cols, &wbytes[20 * grb..]));
        h.run(|rec| {
            rec.embed(
                ty,
                tokens.len() as u32,
                (&w0).into(),
                (&mbuf).into(),
                (&xbuf).into(),
                EmbedPush { cols: cols as u32, row_bytes: rb as u32, row_start: 0, part_rows: 20, scale: 1.0 },
            )?;
            rec.embed(
                ty,
                tokens.len() as u32,
                (&w1).into(),
                (&mbuf).into(),
                (&xbuf).into(),
                EmbedPush { cols: cols as u32, row_bytes: rb as u32, row_start: 20, part_rows: 20, scale: 1.0 },
            )
        });
        let got = xbuf.read_f32(0, tokens.len() * cols).unwrap();
        let want: Vec<f64> = tokens.iter().flat_map(|&t| wq[t as usize * cols..(t as usize + 1) * cols].iter().map(|&v| v as f64)).collect();
        let bar: Vec<f64> = want.iter().map(|w| 2.0 * U * w.abs()).collect();
        check(&format!("embed {ty}"), &got, &want, &bar).unwrap();
        // Control: the neighbouring token's row must fail.
        let wrong: Vec<f64> = tokens
            .iter()
            .flat_map(|&t| {
                let t = (t as usize + 1) % vocab;
                wq[t * cols..(t + 1) * cols].iter().map(|&v| v as f64).collect::<Vec<_>>()
            })
            .collect();
        assert!(check("control", &got, &wrong, &bar).is_err());
    }
}

#[test]
fn rmsnorm_plain_and_fused_add() {
    // Bar: (n/2 + 16) u |ref|: the sum of squares is within gamma_n (relative), the square
    // root halves it; division, sqrt and two products add a few ulps.
    let Some(mut h) = Harness::new() else { return };
    // 579: a partial last chunk; 8200: more chunks than the norm's 256 virtual threads.
    for (rows, n) in [(3usize, 579usize), (2, 8200)] {
        let mut rng = Rng(3);
        let x = rng.vec(rows * n, 3.0);
        let a = rng.vec(rows * n, 1.0);
        let w = rng.vec(n, 1.5);
        let eps = 1e-5f32;
        for fused in [false, true] {
            let xb = h.buf_f32(&x);
            let ab = h.buf_f32(&a);
            let wb = h.buf_f32(&w);
            let ob = h.poisoned(rows * n);
            h.run(|rec| {
                let add = if fused { Some(Bind::from(&ab)) } else { None };
                rec.rmsnorm(rows as u32, (&xb).into(), add, (&wb).into(), (&ob).into(), NormPush { n: n as u32, eps })
            });
            let xs: Vec<f32> = if fused { x.iter().zip(&a).map(|(p, q)| p + q).collect() } else { x.clone() };
            let mut want = vec![0f64; rows * n];
            for r in 0..rows {
                let row = &xs[r * n..(r + 1) * n];
                let ss: f64 = row.iter().map(|&v| v as f64 * v as f64).sum();
                let scale = 1.0 / (ss / n as f64 + eps as f64).sqrt();
                for i in 0..n {
                    want[r * n + i] = row[i] as f64 * scale * w[i] as f64;
                }
            }
            let bar: Vec<f64> = want.iter().map(|v| (n as f64 / 2.0 + 16.0) * U * v.abs() + 1e-30).collect();
            let got = ob.read_f32(0, rows * n).unwrap();
            check(&format!("rmsnorm fused={fused}"), &got, &want, &bar).unwrap();
            // The residual sum is written back exactly (one IEEE addition).
            let xg = xb.read_f32(0, rows * n).unwrap();
            assert!(xg.iter().zip(&xs).all(|(p, q)| p.to_bits() == q.to_bits()), "residual write-back");
            // Control: the norm without the fused add (or with it, for the plain form) must fail.
            let other: Vec<f32> = if fused { x.clone() } else { x.iter().zip(&a).map(|(p, q)| p + q).collect() };
            let wrong: Vec<f64> = (0..rows * n)
                .map(|i| {
                    let r = i / n;
                    let row = &other[r * n..(r + 1) * n];
                    let ss: f64 = row.iter().map(|&v| v as f64 * v as f64).sum();
                    row[i % n] as f64 / (ss / n as f64 + eps as f64).sqrt() * w[i % n] as f64
                })
                .collect();
            assert!(check("control", &got, &wrong, &bar).is_err());
        }
    }
}

#[test]
fn rmsnorm_with_fused_rounding_equals_rmsnorm_then_qact() {
    // rmsnorm_q writes out and its 8-bit-block roundings in one dispatch: every value must be
    // bit-equal to rmsnorm (+ fused add) followed by qact32 / qact256 over its output.
    let Some(mut h) = Harness::new() else { return };
    // 9216: more chunks than the norm's 256 virtual threads.
    for (rows, n) in [(3usize, 768usize), (2, 9216)] {
        let mut rng = Rng(0xf05e);
        let x0 = rng.vec(rows * n, 2.0);
        let add = rng.vec(rows * n, 1.0);
        let w = rng.vec(n, 1.5);
        let p = NormPush { n: n as u32, eps: 1e-5 };
        let (ab, wb) = (h.buf_f32(&add), h.buf_f32(&w));
        for fused_add in [false, true] {
            for (m32, m256) in [(true, true), (true, false), (false, true)] {
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<u32>>();
                // Reference: the separate kernels.
                let (xr, outr, r32, r256) = (h.buf_f32(&x0), h.poisoned(rows * n), h.poisoned(rows * n), h.poisoned(rows * n));
                h.run(|rec| {
                    rec.rmsnorm(rows as u32, (&xr).into(), fused_add.then(|| (&ab).into()), (&wb).into(), (&outr).into(), p)?;
                    rec.barrier();
                    rec.qact(32, (rows * n) as u32, (&outr).into(), (&r32).into())?;
                    rec.qact(256, (rows * n) as u32, (&outr).into(), (&r256).into())
                });
                // Fused.
                let (xf, outf, f32b, f256b) = (h.buf_f32(&x0), h.poisoned(rows * n), h.poisoned(rows * n), h.poisoned(rows * n));
                h.run(|rec| {
                    let q32 = m32.then(|| (&f32b).into());
                    let q256 = m256.then(|| (&f256b).into());
                    rec.rmsnorm_q(rows as u32, (&xf).into(), fused_add.then(|| (&ab).into()), (&wb).into(), (&outf).into(), q32, q256, p)
                });
                let what = format!("rmsnorm_q add={fused_add} q32={m32} q256={m256}");
                let rd = |b: &Buffer| b.read_f32(0, rows * n).unwrap();
                assert_eq!(bits(&rd(&xf)), bits(&rd(&xr)), "{what}: x");
                assert_eq!(bits(&rd(&outf)), bits(&rd(&outr)), "{what}: out");
                for (on, got, want) in [(m32, &f32b, &r32), (m256, &f256b, &r256)] {
                    let g = rd(got);
                    if on {
                        assert!(g.iter().all(|v| v.is_finite()), "{what}: a rounded value not written");
                        assert_eq!(bits(&g), bits(&rd(want)), "{what}: rounded values");
                    } else {
                        assert!(g.iter().all(|v| v.to_bits() == POISON), "{what}: an unasked rounding was written");
                    }
                }
                // Control: the rounded values differ from the unrounded output (rounding happened).
                if m32 {
                    assert_ne!(bits(&rd(&f32b)), bits(&rd(&outf)), "{what}: control");
                }
            }
        }
    }
}

#[test]
fn swiglu_matches() {
    // Bar: (32 + 4|g|) u |ref|: Vulkan's exp is within 3 + 2|x| ulp, then a division and a
    // product.
    let Some(mut h) = Harness::new() else { return };
    let n = 3000usize;
    let mut rng = Rng(5);
    let g = rng.vec(n, 8.0);
    let u = rng.vec(n, 2.0);
    let (gb, ub) = (h.buf_f32(&g), h.buf_f32(&u));
    h.run(|rec| rec.swiglu(FfnAct::Silu, n as u32, (&gb).into(), (&ub).into()));
    let got = gb.read_f32(0, n).unwrap();
    let want: Vec<f64> = g.iter().zip(&u).map(|(&a, &b)| a as f64 / (1.0 + (-(a as f64)).exp()) * b as f64).collect();
    let bar: Vec<f64> = want.iter().zip(&g).map(|(w, a)| (32.0 + 4.0 * a.abs() as f64) * U * w.abs() + 1e-30).collect();
    check("swiglu", &got, &want, &bar).unwrap();
    // Control: silu without the up factor's sign must fail.
    let wrong: Vec<f64> = want.iter().map(|w| -w).collect();
    assert!(check("control", &got, &wrong, &bar).is_err());
}

#[test]
fn swiglu_with_fused_rounding_equals_swiglu_then_qact_and_qpack() {
    // swiglu_q / swiglu_p round act(g) * u in one dispatch: every value (word) must be
    // bit-equal to swiglu followed by qact / qpack over its output, and g left as it was; for
    // silu (SwiGLU) and tanh GELU (GeGLU) alike. Packed: blocks of 32 only (the canonical
    // product's input).
    use resin_vulkan::mv::QPack;
    let Some(mut h) = Harness::new() else { return };
    // Not a multiple of a workgroup's 2048 values; one block of 256 with u = 0 (amax 0).
    let n = 3 * 1536usize;
    let mut rng = Rng(0x5e1);
    let g = rng.vec(n, 8.0);
    let mut u = rng.vec(n, 2.0);
    u[512..768].iter_mut().for_each(|v| *v = 0.0);
    let bits = |b: &Buffer, k: usize| b.read_u32(0, k).unwrap();
    let ub = h.buf_f32(&u);
    let l = QPack::new(n as u32).unwrap();
    let w = l.words() as usize;
    for (act, block) in [(FfnAct::Silu, 32u32), (FfnAct::Silu, 256), (FfnAct::GeluTanh, 32), (FfnAct::GeluTanh, 256)] {
        let pack = block == 32;
        // Reference: swiglu in place, then the rounding and the packing of its output.
        let gr = h.buf_f32(&g);
        let (rq, rp) = (h.poisoned(n), h.poisoned(w));
        h.run(|rec| {
            rec.swiglu(act, n as u32, (&gr).into(), (&ub).into())?;
            rec.barrier();
            rec.qact(block, n as u32, (&gr).into(), (&rq).into())?;
            if pack {
                rec.qpack(l, (&gr).into(), (&rp).into())?;
            }
            Ok(())
        });
        // Fused.
        let gf = h.buf_f32(&g);
        let (fq, fp) = (h.poisoned(n), h.poisoned(w));
        h.run(|rec| {
            rec.swiglu_q(act, block, n as u32, (&gf).into(), (&ub).into(), (&fq).into())?;
            if pack {
                rec.swiglu_p(act, l, (&gf).into(), (&ub).into(), (&fp).into())?;
            }
            Ok(())
        });
        let (want_q, want_p) = (bits(&rq, n), bits(&rp, w));
        assert!(want_q.iter().all(|&v| v != POISON), "{act:?} block {block}: the reference left a value unwritten");
        assert!(!pack || want_p.iter().all(|&v| v != POISON), "{act:?} block {block}: the reference left a word unwritten");
        assert_eq!(bits(&fq, n), want_q, "{act:?} block {block}: rounded values");
        assert_eq!(bits(&fp, w), want_p, "{act:?} block {block}: packed words");
        assert_eq!(gf.read_f32(0, n).unwrap(), g, "{act:?} block {block}: g was written");
        // Control: the same kernels with g and u swapped give other values and words.
        let (cq, cp) = (h.poisoned(n), h.poisoned(w));
        let gs = h.buf_f32(&g);
        h.run(|rec| {
            rec.swiglu_q(act, block, n as u32, (&ub).into(), (&gs).into(), (&cq).into())?;
            if pack {
                rec.swiglu_p(act, l, (&ub).into(), (&gs).into(), (&cp).into())?;
            }
            Ok(())
        });
        assert_ne!(bits(&cq, n), want_q, "{act:?} block {block}: control (rounded)");
        if pack {
            assert_ne!(bits(&cp, w), want_p, "{act:?} block {block}: control (packed)");
        }
    }
}

/// GeGLU's product: gelu_tanh(g) * u against f64, within the float error of its exp, tanh
/// written through exp, and three products; saturation at large |g| (no NaN). Control: SiLU's
/// product fails the bar.
#[test]
fn geglu_matches() {
    let Some(mut h) = Harness::new() else { return };
    let n = 3000usize;
    let mut rng = Rng(11);
    let mut g = rng.vec(n, 8.0);
    g[0] = 200.0;
    g[1] = -200.0;
    let u = rng.vec(n, 2.0);
    let (gb, ub) = (h.buf_f32(&g), h.buf_f32(&u));
    h.run(|rec| rec.swiglu(FfnAct::GeluTanh, n as u32, (&gb).into(), (&ub).into()));
    let got = gb.read_f32(0, n).unwrap();
    let gelu = |x: f64| 0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh());
    let want: Vec<f64> = g.iter().zip(&u).map(|(&a, &b)| gelu(a as f64) * b as f64).collect();
    // The tanh's rounding near v = 0 lands on 0.5 x, so the bar is relative to |x u| too.
    let bar: Vec<f64> = want.iter().zip(g.iter().zip(&u)).map(|(w, (a, b))| (64.0 + 8.0 * a.abs() as f64) * U * (w.abs() + (a * b).abs() as f64) + 1e-30).collect();
    assert!(got.iter().all(|v| v.is_finite()), "GeGLU gave a non-finite value");
    check("geglu", &got, &want, &bar).unwrap();
    let silu: Vec<f64> = g.iter().zip(&u).map(|(&a, &b)| a as f64 / (1.0 + (-(a as f64)).exp()) * b as f64).collect();
    assert!(check("control", &got, &silu, &bar).is_err());
}

/// Soft-capping: cap * tanh(x / cap) against f64, saturating at large |x|. Control: the
/// uncapped values fail (the values reach 60, twice the cap).
#[test]
fn softcap_matches() {
    let Some(mut h) = Harness::new() else { return };
    let n = 5000usize;
    let mut rng = Rng(12);
    let mut x = rng.vec(n, 60.0);
    x[0] = 1e6;
    x[1] = -1e6;
    let cap = 30.0f32;
    let xb = h.buf_f32(&x);
    h.run(|rec| rec.softcap(n as u32, cap, (&xb).into()));
    let got = xb.read_f32(0, n).unwrap();
    let want: Vec<f64> = x.iter().map(|&v| cap as f64 * (v as f64 / cap as f64).tanh()).collect();
    // tanh written through exp is 1 - 2 / (exp(2v) + 1): near v = 0 the subtraction leaves a
    // few ulps of 1, an absolute error of a few U * cap, beside the relative one.
    let bar: Vec<f64> = want.iter().zip(&x).map(|(w, v)| (64.0 + 4.0 * (v / cap).abs() as f64) * U * (w.abs() + v.abs() as f64) + 64.0 * U * cap as f64).collect();
    check("softcap", &got, &want, &bar).unwrap();
    let raw: Vec<f64> = x.iter().map(|&v| v as f64).collect();
    assert!(check("control", &got, &raw, &bar).is_err());
}

/// The argmax and the log-sum-exp of each row: ties to the lower index, NaN ignored, -inf
/// skipped in the sum, a row of nothing but -inf and NaN giving -inf; the sums against the
/// host's in f64 within 1e-5 (relative). Control: the planted maxima are where the check looks.
#[test]
fn argmax_rows_with_ties_and_their_log_sum_exp() {
    let Some(mut h) = Harness::new() else { return };
    let (rows, n) = (4usize, 49_999usize);
    let mut rng = Rng(9);
    let mut l = rng.vec(rows * n, 10.0);
    l[7] = 50.0;
    l[40_000] = 50.0; // tie in row 0: the lower index wins
    l[n + n - 1] = 99.0; // row 1: the last element
    l[n + 5] = f32::NEG_INFINITY;
    l[2 * n + 12_345] = 20.0;
    l[2 * n + 3] = f32::NAN; // NaN is ignored
    for (i, v) in l[3 * n..].iter_mut().enumerate() {
        *v = if i % 2 == 0 { f32::NEG_INFINITY } else { f32::NAN };
    }
    let lb = h.buf_f32(&l);
    let ib = h.poisoned(2 * rows);
    let part = h.poisoned(rows * ARGMAX_PART_WORDS as usize);
    let done = h.buf_bytes(&vec![0u8; rows * 4]);
    h.run(|rec| rec.argmax(rows as u32, n as u32, (&lb).into(), (&part).into(), (&ib).into(), (&done).into()));
    let got = ib.read_u32(0, 2 * rows).unwrap();
    assert_eq!(done.read_u32(0, rows).unwrap(), vec![0; rows], "the counters are left zero");
    let ids: Vec<u32> = got.iter().step_by(2).copied().collect();
    assert_eq!(ids, vec![7, n as u32 - 1, 12_345, 0]);
    for r in 0..rows {
        let row = &l[r * n..(r + 1) * n];
        let want = resin_core::log_sum_exp(row);
        let lse = f32::from_bits(got[2 * r + 1]);
        if r == 3 {
            assert_eq!(lse, f32::NEG_INFINITY, "row {r}: nothing to sum");
        } else {
            assert!(((lse - want) / want).abs() < 1e-5, "row {r}: {lse} against {want}");
        }
    }
    // Control: the planted maxima are where the check looks (a wrong id would differ).
    assert_ne!(ids, vec![40_000, n as u32 - 1, 12_345, 0]);
}

/// The row copy a top step reads named logits rows back with: every value of every named row
/// bit for bit, in the order named (a row of a vocabulary not a multiple of the workgroup's
/// span); the slots past the count and a named index past the source's rows copy nothing (their
/// poison stays). Control: the same check against the rows in ascending order fails.
#[test]
fn rows_copy_copies_the_named_rows_in_the_order_named() {
    let Some(mut h) = Harness::new() else { return };
    let (rows, n) = (6usize, 49_999usize);
    let src: Vec<f32> = Rng(0xc0b).vec(rows * n, 8.0);
    let sb = h.buf_f32(&src);
    let slots = rows as u32;
    // Three named rows, out of order, then an index past the rows; the count says four.
    let named = [4u32, 0, 5, rows as u32];
    // The list's words past the count are stale indices (a list naming fewer rows than before).
    let words: Vec<u8> = [rows_copy_list(&named), rows_copy_list(&[1, 2])[4..].to_vec()].concat();
    assert_eq!(words.len() as u64, rows_copy_words(slots) * 4);
    let list = h.buf_bytes(&words);
    let dst = h.poisoned(rows * n);
    h.run(|rec| rec.rows_copy(slots, n as u32, rows as u32, (&sb).into(), (&list).into(), (&dst).into()));
    let got = dst.read_f32(0, rows * n).unwrap();
    let row = |v: &[f32], i: usize| v[i * n..(i + 1) * n].to_vec();
    for (j, &i) in named[..3].iter().enumerate() {
        assert!(bits_equal(&row(&got, j), &row(&src, i as usize)), "slot {j}: row {i}");
    }
    for j in 3..rows {
        assert!(row(&got, j).iter().all(|x| x.is_nan()), "slot {j}: past the named rows, nothing copied");
    }
    // Control: the rows in ascending order are not what the slots hold.
    assert!(!bits_equal(&row(&got, 0), &row(&src, 0)));
    // A list longer than the buffer holds is refused, not dispatched.
    assert!(h.try_run(|rec| rec.rows_copy(slots + 1, n as u32, rows as u32, (&sb).into(), (&list).into(), (&dst).into())).is_err());
}

/// The top-k kernel against the host sampler's order (descending logits, -0.0 after 0.0, ties
/// by id, non-finite logits never), every key of every row: vocabularies of one stage, of two
/// and three (128,256 and 151,936 logits), fewer finite logits than k, planted ties and
/// signed zeros among the best, rows through the selection and rows through the sort.
/// Control: the tie order reversed fails.
#[test]
fn topk_lists_the_largest_logits_in_the_samplers_order() {
    let Some(mut h) = Harness::new() else { return };
    let mut rng = Rng(0x70b);
    // Rows served by the selection (at most TOPK_SPAN candidates) and by the sort.
    let (mut selected, mut sorted_rows) = (0, 0);
    for (n, k) in [(1000usize, 64u32), (2048, 64), (2049, 8), (128_256, 64), (151_936, 64), (151_936, 256), (40, 64)] {
        let rows = 3usize;
        let mut l = rng.vec(rows * n, 4.0);
        for r in 0..rows {
            let row = &mut l[r * n..(r + 1) * n];
            // Ties among the best (the lower id first), a signed zero pair, non-finite values.
            let top = 30.0 + r as f32;
            for (j, &i) in [n / 2, 3, n - 1, n / 3].iter().enumerate() {
                row[i] = if j < 3 { top } else { top - 1.0 };
            }
            if n > 100 {
                row[17] = f32::NAN;
                row[18] = f32::INFINITY;
                row[19] = f32::NEG_INFINITY;
                row[20] = 0.0;
                row[21] = -0.0;
                if r == 2 {
                    // A row whose other logits are very small: the zeros are among its best.
                    for (i, x) in row.iter_mut().enumerate() {
                        if !(17..=21).contains(&i) && *x < 25.0 {
                            *x = -100.0 - (i % 7) as f32;
                        }
                    }
                }
            }
        }
        let key = |i: usize, v: f32| -> Option<(u32, u32)> {
            if !v.is_finite() {
                return None;
            }
            let b = v.to_bits();
            let mono = if b >> 31 == 1 { !b } else { b | 0x8000_0000 };
            Some((!mono, i as u32))
        };
        let lb = h.buf_f32(&l);
        let pairs = topk_scratch_pairs(rows as u32, n as u32, k) as usize;
        let (a, b) = (h.poisoned(2 * pairs), h.poisoned(2 * pairs));
        let out = h.poisoned(2 * rows * k as usize);
        let sel = h.poisoned(topk_sel_words(rows as u32) as usize);
        h.run(|rec| rec.topk(rows as u32, n as u32, k, (&lb).into(), (&a).into(), (&b).into(), (&sel).into(), (&out).into()));
        let got = out.read_u32(0, 2 * rows * k as usize).unwrap();
        // (A top larger than TOPK_SLICES is sorted whole: the counts are not written.)
        for &c in sel.read_u32(0, rows).unwrap().iter().filter(|_| k <= TOPK_SLICES) {
            if c <= TOPK_SPAN {
                selected += 1
            } else {
                sorted_rows += 1
            }
        }
        for r in 0..rows {
            let row = &l[r * n..(r + 1) * n];
            let mut want: Vec<(u32, u32)> = row.iter().enumerate().filter_map(|(i, &v)| key(i, v)).collect();
            want.sort();
            let g: Vec<(u32, u32)> = (0..k as usize).map(|j| (got[2 * (r * k as usize + j)], got[2 * (r * k as usize + j) + 1])).collect();
            for (j, gj) in g.iter().enumerate() {
                let w = want.get(j).copied().unwrap_or((u32::MAX, u32::MAX));
                assert_eq!(*gj, w, "n {n} k {k} row {r}: key {j}");
                if let Some((id, v)) = topk_decode(w.0, w.1) {
                    assert_eq!((id, v.to_bits()), (id, row[id as usize].to_bits()), "n {n} row {r}: key {j} decodes to its logit");
                }
            }
            // The planted ties are among the keys, in id order; control: the other order fails.
            let ties: Vec<u32> = g.iter().take(3).map(|x| x.1).collect();
            let mut sorted = ties.clone();
            sorted.sort();
            if n >= 3 * 4 {
                assert_eq!(ties, sorted, "n {n} row {r}: ties by id");
                let mut rev = g.clone();
                rev[..3].reverse();
                assert_ne!(rev, g, "control: a reversed tie order must differ");
            }
            if n > 100 && r == 2 && (k as usize) > 6 {
                // The zeros: 0.0 before -0.0, right after the planted four.
                assert_eq!((g[4].1, g[5].1), (20, 21), "n {n}: 0.0 then -0.0");
            }
        }
    }
    // Both paths ran: random rows through the selection, rows of many equal logits (row 2's
    // seven values) through the sort.
    assert!(selected > 0 && sorted_rows > 0, "selected {selected}, sorted {sorted_rows}");
}

fn f16_to_f32(h: u16) -> f32 {
    half::f16::from_bits(h).to_f32()
}

#[test]
fn rope_and_store_norm_neox_bias_qknorm_passthrough() {
    // q in place: exact f32 ops of the CPU (bias add, rotation with `precise`); bar 4 u of
    // the rotation's terms. qk-norm adds the norm's (hd/2 + 16) u. Mirror rows: f16 of the
    // same values, clamped to the half range, within one f16 ulp (the device's rounding mode
    // of the conversion may differ), or f32 within the q bar.
    let Some(mut h) = Harness::new() else { return };
    let (n_head, n_head_kv, hd) = (4usize, 2usize, 64usize);
    let (q_dim, kv_dim, n_ctx, rows) = (n_head * hd, n_head_kv * hd, 40usize, 3usize);
    let mut rng = Rng(21);
    for (style, codec, flags, rope_dims) in [
        (resin_model::RopeStyle::Norm, resin_core::KvCodec::F16, 0u32, hd),
        (resin_model::RopeStyle::Neox, resin_core::KvCodec::F16, ROPE_BIAS, hd),
        (resin_model::RopeStyle::Norm, resin_core::KvCodec::F32, ROPE_BIAS | ROPE_QK_NORM, 32),
        (resin_model::RopeStyle::Neox, resin_core::KvCodec::F32, ROPE_QK_NORM, 48),
    ] {
        let mut q = rng.vec(rows * q_dim, 2.0);
        let mut k = rng.vec(rows * kv_dim, 2.0);
        let v = rng.vec(rows * kv_dim, 2.0);
        k[5] = 1e6; // clamps to 65504 in an f16 mirror
        let bias = rng.vec(q_dim + 2 * kv_dim, 0.5);
        let norm = rng.vec(2 * hd, 1.0);
        let table = resin_vulkan::home::rope_table(n_ctx, rope_dims, 10000.0);
        let eps = 1e-6f32;
        // rows: (pos, region base in elements); regions of n_ctx positions.
        let rm = [(7u32, 0u32), (0, (n_ctx * kv_dim) as u32), (39, (2 * n_ctx * kv_dim) as u32)];
        let meta: Vec<RowMeta> = rm.iter().map(|&(pos, kv_base)| RowMeta { token: 0, pos, kv_base, keys: pos + 1 }).collect();
        let mirror_elems = 3 * n_ctx * kv_dim;
        let ebytes = if codec == resin_core::KvCodec::F16 { 2 } else { 4 };
        let qb = h.buf_f32(&q);
        let (kb, vb, bb, nb, tb) = (h.buf_f32(&k), h.buf_f32(&v), h.buf_f32(&bias), h.buf_f32(&norm), h.buf_f32(&table));
        let mb = h.buf_bytes(&RowMeta::words(&meta));
        let mut mk = Buffer::new(&h.gpu, (mirror_elems * ebytes) as u64, Location::Device).unwrap();
        let mut mv = Buffer::new(&h.gpu, (mirror_elems * ebytes) as u64, Location::Device).unwrap();
        mk.fill_u32(POISON).unwrap();
        mv.fill_u32(POISON).unwrap();
        let p = RopePush { n_head: n_head as u32, n_head_kv: n_head_kv as u32, head_dim: hd as u32, rope_dims: rope_dims as u32, flags, eps };
        h.run(|rec| {
            rec.rope_store(
                style,
                codec,
                rows as u32,
                [(&qb).into(), (&kb).into(), (&vb).into(), (&bb).into(), (&nb).into(), (&tb).into(), (&mb).into(), (&mk).into(), (&mv).into()],
                p,
            )
        });

        // Oracle, the CPU home's operations.
        let mut vv = v.clone();
        if flags & ROPE_BIAS != 0 {
            for r in 0..rows {
                q[r * q_dim..(r + 1) * q_dim].iter_mut().zip(&bias[..q_dim]).for_each(|(a, b)| *a += b);
                k[r * kv_dim..(r + 1) * kv_dim].iter_mut().zip(&bias[q_dim..q_dim + kv_dim]).for_each(|(a, b)| *a += b);
                vv[r * kv_dim..(r + 1) * kv_dim].iter_mut().zip(&bias[q_dim + kv_dim..]).for_each(|(a, b)| *a += b);
            }
        }
        let rot = |x: &mut [f32], pos: usize, nw: &[f32]| -> Vec<f64> {
            // returns the bar of each element
            let mut bar = vec![0f64; x.len()];
            for (hh, head) in x.chunks_exact_mut(hd).enumerate() {
                let _ = hh;
                let mut nb = 0.0;
                if flags & ROPE_QK_NORM != 0 {
                    let ss: f32 = head.iter().map(|a| a * a).sum();
                    let sc = 1.0 / (ss / hd as f32 + eps).sqrt();
                    head.iter_mut().zip(nw).for_each(|(a, w)| *a *= sc * w);
                    nb = (hd as f64 / 2.0 + 16.0) * U;
                }
                let half = rope_dims / 2;
                let orig = head.to_vec();
                for i in 0..half {
                    let (c, s) = (table[2 * (pos * half + i)], table[2 * (pos * half + i) + 1]);
                    let (i0, i1) = match style {
                        resin_model::RopeStyle::Norm => (2 * i, 2 * i + 1),
                        resin_model::RopeStyle::Neox => (i, i + half),
                    };
                    let (a, b) = (orig[i0], orig[i1]);
                    head[i0] = a * c - b * s;
                    head[i1] = a * s + b * c;
                    let mag = a.abs() as f64 + b.abs() as f64;
                    bar[hh * hd + i0] = (4.0 * U + nb) * mag + 1e-30;
                    bar[hh * hd + i1] = (4.0 * U + nb) * mag + 1e-30;
                }
                for i in rope_dims..hd {
                    bar[hh * hd + i] = nb * orig[i].abs() as f64 + 1e-30;
                }
            }
            bar
        };
        let mut qbar = Vec::new();
        let mut kbar = Vec::new();
        for (r, &(pos, _)) in rm.iter().enumerate() {
            qbar.extend(rot(&mut q[r * q_dim..(r + 1) * q_dim], pos as usize, &norm[..hd]));
            kbar.extend(rot(&mut k[r * kv_dim..(r + 1) * kv_dim], pos as usize, &norm[hd..]));
        }
        let gq = qb.read_f32(0, rows * q_dim).unwrap();
        let wq: Vec<f64> = q.iter().map(|&a| a as f64).collect();
        check(&format!("rope q {style:?} {codec:?} flags {flags}"), &gq, &wq, &qbar).unwrap();
        // Mirror rows.
        let read_mirror = |b: &Buffer| -> Vec<f32> {
            if ebytes == 4 {
                b.read_f32(0, mirror_elems).unwrap()
            } else {
                let mut raw = vec![0u8; mirror_elems * 2];
                b.read(0, &mut raw).unwrap();
                raw.chunks_exact(2).map(|c| f16_to_f32(u16::from_le_bytes([c[0], c[1]]))).collect()
            }
        };
        let (gk, gv) = (read_mirror(&mk), read_mirror(&mv));
        let mut written = vec![false; mirror_elems];
        for (r, &(pos, base)) in rm.iter().enumerate() {
            let at = base as usize + pos as usize * kv_dim;
            let (wk, wv): (Vec<f64>, Vec<f64>) = if ebytes == 2 {
                (
                    k[r * kv_dim..(r + 1) * kv_dim].iter().map(|&a| a.clamp(-65504.0, 65504.0) as f64).collect(),
                    vv[r * kv_dim..(r + 1) * kv_dim].iter().map(|&a| a.clamp(-65504.0, 65504.0) as f64).collect(),
                )
            } else {
                (k[r * kv_dim..(r + 1) * kv_dim].iter().map(|&a| a as f64).collect(), vv[r * kv_dim..(r + 1) * kv_dim].iter().map(|&a| a as f64).collect())
            };
            let kb: Vec<f64> = if ebytes == 2 { wk.iter().map(|a| 2.0 * U16 * a.abs() + 1e-7).collect() } else { kbar[r * kv_dim..(r + 1) * kv_dim].to_vec() };
            let vbar: Vec<f64> = wv.iter().map(|a| if ebytes == 2 { 2.0 * U16 * a.abs() + 1e-7 } else { U * a.abs() + 1e-30 }).collect();
            check(&format!("mirror K row {r}"), &gk[at..at + kv_dim], &wk, &kb).unwrap();
            check(&format!("mirror V row {r}"), &gv[at..at + kv_dim], &wv, &vbar).unwrap();
            written[at..at + kv_dim].iter_mut().for_each(|w| *w = true);
            // Control: the row one position later must fail (it holds poison).
            let next = at + kv_dim;
            if next + kv_dim <= mirror_elems && !written[next] {
                assert!(check("control", &gk[next..next + kv_dim], &wk, &kb).is_err());
            }
        }
        // Everything else in the mirror is untouched.
        for i in 0..mirror_elems {
            if !written[i] {
                assert!(gk[i].is_nan() && gv[i].is_nan(), "mirror element {i} written outside the rows");
            }
        }
        if ebytes == 2 {
            assert_eq!(gk[rm[0].1 as usize + 7 * kv_dim + 5].abs(), 65504.0, "f16 clamp");
        }
    }
}

/// Decode attention over rows `rr` of (keys, region) against the f64 oracle, for several
/// workgroup counts a head; every count, and each row run alone, must give the same bits.
fn decode_attention_case(h: &mut Harness, n_head: usize, n_head_kv: usize, hd: usize, n_ctx: usize, rr: &[(usize, usize)], seed: u64) {
    // Oracle: softmax(q.k * scale) v in f64 over the same (f16 or f32) mirror values.
    // Bar a head dim: (2 ds + (keys + hd + 32) u) * max|v|, where ds = (hd + 4) u
    // sum_i |q_i k_i| * scale bounds a score's error (exp turns it into a relative error
    // of the weight), the rest the sums and exp's ulps.
    let (kv_dim, q_dim) = (n_head_kv * hd, n_head * hd);
    let mut rng = Rng(seed);
    for codec in [resin_core::KvCodec::F16, resin_core::KvCodec::F32] {
        let regions = 2usize;
        let elems = regions * n_ctx * kv_dim;
        let kvals: Vec<f32> = rng.vec(elems, 2.0).iter().map(|&a| half::f16::from_f32(a).to_f32()).collect();
        let vvals: Vec<f32> = rng.vec(elems, 2.0).iter().map(|&a| half::f16::from_f32(a).to_f32()).collect();
        let bytes = |v: &[f32]| -> Vec<u8> {
            if codec == resin_core::KvCodec::F16 {
                v.iter().flat_map(|&a| half::f16::from_f32(a).to_le_bytes()).collect()
            } else {
                f32_bytes(v)
            }
        };
        let (mk, mv) = (h.buf_bytes(&bytes(&kvals)), h.buf_bytes(&bytes(&vvals)));
        let rows = rr.len();
        let meta: Vec<RowMeta> = rr.iter().map(|&(keys, reg)| RowMeta { token: 0, pos: keys as u32 - 1, kv_base: (reg * n_ctx * kv_dim) as u32, keys: keys as u32 }).collect();
        let q = rng.vec(rows * q_dim, 1.0);
        let scale = 1.0 / (hd as f32).sqrt();
        // Oracle.
        let mut want = vec![0f64; rows * q_dim];
        let mut bar = vec![0f64; rows * q_dim];
        for (r, &(keys, reg)) in rr.iter().enumerate() {
            for hh in 0..n_head {
                let g = hh / (n_head / n_head_kv);
                let qh = &q[r * q_dim + hh * hd..r * q_dim + (hh + 1) * hd];
                let base = reg * n_ctx * kv_dim + g * hd;
                let mut s = vec![0f64; keys];
                let mut ds = 0f64;
                for j in 0..keys {
                    let kr = &kvals[base + j * kv_dim..base + j * kv_dim + hd];
                    s[j] = qh.iter().zip(kr).map(|(a, b)| *a as f64 * *b as f64).sum::<f64>() * scale as f64;
                    ds = f64::max(ds, (hd as f64 + 4.0) * U * qh.iter().zip(kr).map(|(a, b)| (*a as f64 * *b as f64).abs()).sum::<f64>() * scale as f64);
                }
                let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let w: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
                let l: f64 = w.iter().sum();
                let mut vmax = 0f64;
                for d in 0..hd {
                    let mut a = 0f64;
                    for j in 0..keys {
                        let vx = vvals[base + j * kv_dim + d] as f64;
                        a += w[j] * vx;
                        vmax = vmax.max(vx.abs());
                    }
                    want[r * q_dim + hh * hd + d] = a / l;
                }
                for d in 0..hd {
                    bar[r * q_dim + hh * hd + d] = (2.0 * ds + (keys as f64 + hd as f64 + 32.0) * U) * vmax + 1e-30;
                }
            }
        }
        // merge: the attention's last workgroup of a head merges the pieces (twice in one
        // submission: the counters must be back at zero after each), else a combine dispatch.
        let run = |h: &mut Harness, meta: &[RowMeta], q: &[f32], pieces: u32, merge: bool| -> Vec<f32> {
            let n = meta.len();
            let (mb, qb) = (h.buf_bytes(&RowMeta::words(meta)), h.buf_f32(q));
            let part = h.poisoned(attn_part_len(n, n_head, hd, ATTN_SLOTS as usize));
            let ob = h.poisoned(n * q_dim);
            let done = h.buf_f32(&vec![0.0; n * n_head]);
            let p = AttnPush { n_head: n_head as u32, n_head_kv: n_head_kv as u32, head_dim: hd as u32, n_pieces: pieces, scale, key_window: 0 };
            h.run(|rec| {
                if !merge {
                    return rec.attention(
                        codec,
                        n as u32,
                        AttnBinds { q: (&qb).into(), mk: (&mk).into(), mv: (&mv).into(), meta: (&mb).into(), part: (&part).into(), out: (&ob).into() },
                        p,
                    );
                }
                for _ in 0..2 {
                    rec.attention_round(
                        codec,
                        n as u32,
                        AttnBinds { q: (&qb).into(), mk: (&mk).into(), mv: (&mv).into(), meta: (&mb).into(), part: (&part).into(), out: (&ob).into() },
                        None,
                        Some((&done).into()),
                        None,
                        p,
                    )?;
                    rec.barrier();
                }
                Ok(())
            });
            assert!(done.read_u32(0, n * n_head).unwrap().iter().all(|&c| c == 0), "the merge counters are left at zero");
            ob.read_f32(0, n * q_dim).unwrap()
        };
        let first = run(h, &meta, &q, 1, false);
        for pieces in [1u32, 3, 4, 8, 32] {
            let got = run(h, &meta, &q, pieces, false);
            check(&format!("attention hd {hd} {codec:?} pieces {pieces}"), &got, &want, &bar).unwrap();
            assert!(bits_equal(&got, &first), "attention hd {hd} {codec:?}: {pieces} workgroups a head differ from 1");
            let merged = run(h, &meta, &q, pieces, true);
            assert!(bits_equal(&merged, &first), "attention hd {hd} {codec:?}: merged in the attention's last workgroup ({pieces} a head) differs");
            // Control: row 2's output 1% off must fail.
            if pieces == 1 {
                let mut wrong = want.clone();
                let r = 2;
                for x in &mut wrong[r * q_dim..(r + 1) * q_dim] {
                    *x *= 1.01;
                }
                assert!(check("control", &got, &wrong, &bar).is_err());
            }
        }
        // Each row alone, in a 1-row command (32 workgroups a head), gives its bits in the batch.
        for (r, m) in meta.iter().enumerate() {
            let alone = run(h, std::slice::from_ref(m), &q[r * q_dim..(r + 1) * q_dim], 32, true);
            assert!(bits_equal(&alone, &first[r * q_dim..(r + 1) * q_dim]), "attention hd {hd} {codec:?}: row {r} alone differs");
        }
    }
}

#[test]
fn decode_attention_pieces_and_combine() {
    // Keys of one chunk, several chunks, and past ATTN_SLOTS chunks (pieces of 128 keys).
    let Some(mut h) = Harness::new() else { return };
    let rr = [(1usize, 0usize), (300, 1), (77, 0), (129, 1), (2100, 0), (64, 1)];
    decode_attention_case(&mut h, 6, 2, 64, 2200, &rr, 33);
}

#[test]
fn decode_attention_other_head_dims() {
    // Dims past a batch of 32 (80), two dims a thread (128), four (256), no grouping; key rows
    // not 16-byte aligned (36: f16 read word by word, f32 by 16 bytes; 42: both word by word).
    let Some(mut h) = Harness::new() else { return };
    let rr = [(5usize, 1usize), (200, 0), (65, 1)];
    for (n_head, n_head_kv, hd) in [(4usize, 4usize, 80usize), (4, 2, 128), (2, 1, 256), (3, 1, 36), (2, 2, 42)] {
        decode_attention_case(&mut h, n_head, n_head_kv, hd, 256, &rr, 34 + hd as u64);
    }
}

#[test]
fn decode_attention_with_fused_rounding_equals_attention_then_qact_and_qpack() {
    // attention_round's combine writes its output and that output rounded (f32) or packed for
    // the next matrix: every value and word must equal attention, then qact / qpack over its
    // output. Blocks of 32 within a head, and of 256 over 4, 2 or 1 heads.
    use resin_vulkan::mv::QPack;
    let Some(mut h) = Harness::new() else { return };
    let codec = resin_core::KvCodec::F16;
    let n_ctx = 200usize;
    let rr = [(3usize, 0usize), (200, 1), (70, 0)];
    let rows = rr.len();
    for (n_head, n_head_kv, hd) in [(8usize, 2usize, 64usize), (6, 2, 128), (2, 1, 256)] {
        let (kv_dim, q_dim) = (n_head_kv * hd, n_head * hd);
        let count = rows * q_dim;
        let mut rng = Rng(0xa77 + hd as u64);
        let elems = 2 * n_ctx * kv_dim;
        let f16s = |v: Vec<f32>| -> Vec<u8> { v.iter().flat_map(|&a| half::f16::from_f32(a).to_le_bytes()).collect() };
        let (mk, mv) = (h.buf_bytes(&f16s(rng.vec(elems, 2.0))), h.buf_bytes(&f16s(rng.vec(elems, 2.0))));
        let meta: Vec<RowMeta> = rr.iter().map(|&(keys, reg)| RowMeta { token: 0, pos: keys as u32 - 1, kv_base: (reg * n_ctx * kv_dim) as u32, keys: keys as u32 }).collect();
        let (mb, qb) = (h.buf_bytes(&RowMeta::words(&meta)), h.buf_f32(&rng.vec(count, 1.0)));
        let p = AttnPush { n_head: n_head as u32, n_head_kv: n_head_kv as u32, head_dim: hd as u32, n_pieces: 4, scale: 0.125, key_window: 0 };
        let part = h.poisoned(attn_part_len(rows, n_head, hd, ATTN_SLOTS as usize));
        let bits = |b: &Buffer, k: usize| b.read_u32(0, k).unwrap();
        // Reference: the plain combine, then the separate rounding and packing of each block size.
        let outr = h.poisoned(count);
        h.run(|rec| {
            rec.attention(codec, rows as u32, AttnBinds { q: (&qb).into(), mk: (&mk).into(), mv: (&mv).into(), meta: (&mb).into(), part: (&part).into(), out: (&outr).into() }, p)
        });
        let want_out = bits(&outr, count);
        for block in [32u32, 256] {
            let what = format!("hd {hd} x {n_head} heads, block {block}");
            let heads = attn_round_heads(block, hd as u32, n_head as u32).unwrap();
            assert_eq!(heads, (block / hd as u32).max(1), "{what}: heads a workgroup");
            // Packed: blocks of 32 only (the canonical product's input).
            let pack = block == 32;
            let l = QPack::new(count as u32).unwrap();
            let w = l.words() as usize;
            let (rq, rp) = (h.poisoned(count), h.poisoned(w));
            h.run(|rec| {
                rec.qact(block, count as u32, (&outr).into(), (&rq).into())?;
                if pack {
                    rec.qpack(l, (&outr).into(), (&rp).into())?;
                }
                Ok(())
            });
            let (want_q, want_p) = (bits(&rq, count), bits(&rp, w));
            assert!(want_q.iter().all(|&v| v != POISON), "{what}: the reference left a value unwritten");
            assert!(!pack || want_p.iter().all(|&v| v != POISON), "{what}: the reference left a word unwritten");
            // Fused: rounded f32, then packed; by a combine dispatch, then merged in the
            // attention's last workgroup of a head group.
            for merge in [false, true] {
                let what = format!("{what}, merged {merge}");
                let done = h.buf_f32(&vec![0.0; rows * n_head]);
                let (oq, fq, op, fp) = (h.poisoned(count), h.poisoned(count), h.poisoned(count), h.poisoned(w));
                h.run(|rec| {
                    let d = merge.then(|| (&done).into());
                    let round = Some(AttnRound::Rounded { block, y: (&fq).into() });
                    rec.attention_round(
                        codec,
                        rows as u32,
                        AttnBinds { q: (&qb).into(), mk: (&mk).into(), mv: (&mv).into(), meta: (&mb).into(), part: (&part).into(), out: (&oq).into() },
                        round,
                        d,
                        None,
                        p,
                    )?;
                    if !pack {
                        return Ok(());
                    }
                    rec.barrier();
                    let round = Some(AttnRound::Packed { layout: l, out: (&fp).into() });
                    rec.attention_round(
                        codec,
                        rows as u32,
                        AttnBinds { q: (&qb).into(), mk: (&mk).into(), mv: (&mv).into(), meta: (&mb).into(), part: (&part).into(), out: (&op).into() },
                        round,
                        d,
                        None,
                        p,
                    )
                });
                assert_eq!(bits(&oq, count), want_out, "{what}: output (rounding form)");
                assert_eq!(bits(&fq, count), want_q, "{what}: rounded values");
                if pack {
                    assert_eq!(bits(&op, count), want_out, "{what}: output (packing form)");
                    assert_eq!(bits(&fp, w), want_p, "{what}: packed words");
                }
                assert!(bits(&done, rows * n_head).iter().all(|&c| c == 0), "{what}: the merge counters are left at zero");
            }
            // Control: the other block size's rounding of the same output differs.
            let (cq, other) = (h.poisoned(count), 288 - block);
            h.run(|rec| rec.qact(other, count as u32, (&outr).into(), (&cq).into()));
            assert_ne!(bits(&cq, count), want_q, "{what}: control");
        }
    }
    // Shapes a combine cannot round whole blocks of: left to qact / qpack.
    assert_eq!(attn_round_heads(256, 80, 8), None, "head_dim 80, blocks of 256");
    assert_eq!(attn_round_heads(256, 64, 9), None, "9 heads in groups of 4");
    assert_eq!(attn_round_heads(256, 16, 64), None, "16 heads a workgroup");
    assert_eq!(attn_round_heads(32, 80, 8), None, "head_dim 80, blocks of 32");
    assert_eq!(attn_round_heads(32, 96, 8), Some(1));
}

#[test]
fn activation_rounding_matches_the_cpu_blocks() {
    // The CPU home's rounding (acts.rs): d = amax / 127, q = round_ties_even(x * (127 / amax)).
    // Bar: a value may land one step d away where the device's division rounds differently
    // at a tie, else 2 u relative.
    let Some(mut h) = Harness::new() else { return };
    let n = 8 * 576;
    let mut rng = Rng(77);
    let mut x = rng.vec(n, 3.0);
    x[40..72].iter_mut().for_each(|v| *v = 0.0); // an all-zero block
    for block in [32usize, 256] {
        let xb = h.buf_f32(&x[..n / 256 * 256]);
        let m = n / 256 * 256;
        let yb = h.poisoned(m);
        h.run(|rec| rec.qact(block as u32, m as u32, (&xb).into(), (&yb).into()));
        let got = yb.read_f32(0, m).unwrap();
        let mut want = vec![0f64; m];
        let mut bar = vec![0f64; m];
        for b in 0..m / block {
            let xs = &x[b * block..(b + 1) * block];
            let amax = xs.iter().fold(0f32, |a, v| a.max(v.abs()));
            let d = amax / 127.0;
            let id = if amax > 0.0 { 127.0 / amax } else { 0.0 };
            for i in 0..block {
                let q = (xs[i] * id).round_ties_even();
                want[b * block + i] = (q * d) as f64;
                bar[b * block + i] = 2.0 * U * (q * d).abs() as f64 + d as f64 * 1.0001 * if q.abs() < 127.0 { 1.0 } else { 0.0 } + 1e-30;
            }
        }
        check(&format!("qact{block}"), &got, &want, &bar).unwrap();
        let exact = got.iter().zip(&want).filter(|(g, w)| **g as f64 == **w).count();
        eprintln!("qact{block}: {exact} of {m} values bit-equal to the CPU rounding");
        // Control: values 5% off must fail.
        let wrong: Vec<f64> = want.iter().map(|w| w * 1.05 + 0.05).collect();
        assert!(check("control", &got, &wrong, &bar).is_err());
    }
}

/// The fixed cost of a dispatch and a barrier against a norm's: 200 of each chained by
/// barriers in one submission (a swiglu of 64 values, a 2048-value canonical norm with its
/// residual add, a plain norm, a qpack of 2048 values), timed on the host. For the per-stage profile's small
/// stages. `cargo test --release --test kernels -- --ignored --nocapture dispatch_floor`.
#[test]
#[ignore]
fn dispatch_floor() {
    use resin_vulkan::mv::QPack;
    let Some(mut h) = Harness::new() else { return };
    let n = 2048usize;
    let mut rng = Rng(5);
    let (x, a, w) = (h.buf_f32(&rng.vec(n, 1.0)), h.buf_f32(&rng.vec(n, 1.0)), h.buf_f32(&rng.vec(n, 1.0)));
    let (o, p, r) = (h.poisoned(n), h.poisoned(2 * n), h.poisoned(1));
    let g = h.buf_f32(&rng.vec(64, 1.0));
    let layout = QPack::new(n as u32).unwrap();
    let reps = 200;
    let mut time = |name: &str, f: &mut dyn FnMut(&mut resin_vulkan::kernels::Recorder<'_>) -> Result<(), resin_vulkan::VkError>| {
        eprintln!("{name}: {:.2} us a dispatch and barrier", h.time_chained(reps, f));
    };
    time("swiglu of 64 values", &mut |rec| rec.swiglu(FfnAct::Silu, 64, (&g).into(), (&g).into()));
    time("normpack_add of 2048", &mut |rec| rec.normpack(1, n as u32, 1e-5, (&x).into(), Some((&a).into()), (&w).into(), layout, (&p).into(), (&r).into()));
    time("rmsnorm of 2048", &mut |rec| rec.rmsnorm(1, (&x).into(), None, (&w).into(), (&o).into(), NormPush { n: n as u32, eps: 1e-5 }));
    time("qpack of 2048", &mut |rec| rec.qpack(layout, (&x).into(), (&p).into()));
}

/// What a grid-wide barrier inside one dispatch costs (a spin on a global counter, every
/// workgroup resident) against `dispatch_floor`'s dispatch and pipeline barrier: the cost a
/// persistent decode kernel would pay per phase instead. Skipped on CPU devices (lavapipe may
/// not run every workgroup at once). Fails if a phase timed out or saw a stale word.
/// `cargo test --release --test kernels -- --ignored --nocapture grid_sync_floor`.
#[test]
#[ignore]
fn grid_sync_floor() {
    let Some(mut h) = Harness::new() else { return };
    if h.gpu.info.kind == "cpu" {
        eprintln!("grid_sync_floor: skipped on a CPU device");
        return;
    }
    let phases = 200u32;
    for rmw in [false, true] {
        let warm = h.buf_bytes(&[0u8; 12]);
        h.run(|rec| rec.grid_sync(1, 1, rmw, (&warm).into())); // the pipeline, built outside the timing
        for wgs in [32u32, 132, 264, 528] {
            let sync = h.buf_bytes(&vec![0u8; (2 + wgs as usize) * 4]);
            let t = std::time::Instant::now();
            h.run(|rec| rec.grid_sync(phases, wgs, rmw, (&sync).into()));
            let us = t.elapsed().as_secs_f64() * 1e6 / phases as f64;
            let words = sync.read_u32(0, 2).unwrap();
            let poll = if rmw { "atomic polls" } else { "volatile polls" };
            eprintln!("grid barrier, {wgs} workgroups, {poll}: {us:.2} us a phase (arrivals {}, bad {})", words[0], words[1]);
            assert_eq!(words[1], 0, "{wgs} workgroups: phases timed out or saw stale words");
            assert_eq!(words[0], phases * wgs);
        }
    }
    let g = h.buf_f32(&vec![0.5f32; 64]);
    eprintln!("for comparison, swiglu of 64 values: {:.2} us a dispatch and barrier", h.time_chained(phases, &mut |rec| rec.swiglu(FfnAct::Silu, 64, (&g).into(), (&g).into())));
}

/// What a persistent token command would save on its matrix chain (chain_probe.comp, a
/// measurement): the Llama-3.2-1B shape's four products a layer (q/k/v 3072 x 2048,
/// attention-out 2048 x 2048, gate/up 16384 x 2048, down 2048 x 8192; int8 weights) over its
/// 16 layers, as one dispatch a stage chained by pipeline barriers, against one dispatch of
/// every stage with a grid-wide barrier between two (and with each subgroup's next row loaded
/// before it waits). Every form runs the same per-row code, so the chain's outputs must be
/// the same bits, and no wait may time out. Prints each form's time and the weights' GB/s.
/// lavapipe: a chain an eighth the size, one workgroup (its barrier waits for no other).
/// `cargo test --release --test kernels -- --ignored --nocapture persistent_chain_probe`.
#[test]
#[ignore]
fn persistent_chain_probe() {
    let Some(mut h) = Harness::new() else { return };
    let cpu = h.gpu.info.kind == "cpu";
    let (layers, div) = if cpu { (2usize, 8usize) } else { (16, 1) };
    let shapes: Vec<(usize, usize)> = (0..layers).flat_map(|_| [(3072, 2048), (2048, 2048), (16384, 2048), (2048, 8192)]).map(|(r, c)| (r / div, c / div)).collect();
    let xs = shapes.iter().map(|s| s.1).max().unwrap();
    let mut table = Vec::new();
    let mut at = 0usize; // uvec4s
    for &(r, c) in &shapes {
        table.extend([r as u32, c as u32, at as u32, 0]);
        at += r * c / 16;
    }
    let bytes = at * 16;
    let mut rng = Rng(5);
    let wb: Vec<u8> = (0..bytes / 8).flat_map(|_| rng.next_u64().to_le_bytes()).collect();
    let w = h.buf_bytes(&wb);
    drop(wb);
    let st = h.buf_bytes(&table.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>());
    let mut x0 = rng.vec(xs, 1.0);
    x0.resize((shapes.len() + 1) * xs, 0.0);
    let stages = shapes.len() as u32;
    let nsg = 256 / h.gpu.info.subgroup_size;
    let last = (shapes.len() * xs, shapes.last().unwrap().0.min(xs));
    // (form, a dispatch a stage, next rows loaded ahead, workgroups: 0 a subgroup a row)
    let wgs: &[u32] = if cpu { &[1] } else { &[132, 264] };
    let mut forms = vec![("a dispatch a stage", true, false, 0u32)];
    for &n in wgs {
        forms.push(("a dispatch a stage", true, false, n));
        forms.push(("one dispatch", false, false, n));
        forms.push(("one dispatch, next rows loaded ahead", false, true, n));
    }
    let reps = 3u32;
    let mut base: Option<Vec<u32>> = None;
    for (what, chained, ahead, n) in forms {
        let x = h.buf_f32(&x0);
        let syncs: Vec<Buffer> = (0..reps + 1).map(|_| h.buf_bytes(&[0u8; 8])).collect();
        let mut i = 0;
        let us = h.time_chained(reps, &mut |rec| {
            let sync = &syncs[i.min(reps as usize)];
            i += 1;
            if chained {
                for (s, &(r, _)) in shapes.iter().enumerate() {
                    let p = ChainProbePush { lo: s as u32, hi: s as u32 + 1, xs: xs as u32 };
                    let groups = if n == 0 { (r as u32).div_ceil(nsg) } else { n };
                    rec.chain_probe(false, groups, p, [(&w).into(), (&st).into(), (&x).into(), sync.into()])?;
                    rec.barrier();
                }
                Ok(())
            } else {
                rec.chain_probe(ahead, n, ChainProbePush { lo: 0, hi: stages, xs: xs as u32 }, [(&w).into(), (&st).into(), (&x).into(), sync.into()])
            }
        });
        let out: Vec<u32> = x.read_f32(last.0, last.1).unwrap().iter().map(|v| v.to_bits()).collect();
        eprintln!("{what} ({n} workgroups): {us:.0} us for {stages} stages, {:.1} GB/s of weights", bytes as f64 / us / 1e3);
        if !chained {
            for s in &syncs {
                let words = s.read_u32(0, 2).unwrap();
                assert_eq!(words[1], 0, "{what}, {n} workgroups: a wait timed out");
                assert_eq!(words[0], (stages - 1) * n, "{what}, {n} workgroups: arrivals");
            }
        }
        assert!(out.iter().any(|&v| v != 0), "{what}: the chain's last outputs are all zero");
        match &base {
            None => base = Some(out),
            Some(b) => assert!(*b == out, "{what}, {n} workgroups: the outputs differ from a dispatch a stage's"),
        }
    }
}

/// The merged decode attention that ropes and stores its rows' q, k and v itself (attn.comp
/// ROPE_IN) against rope_store, a barrier, then the merged attention: the same mirror bytes
/// and the same outputs, bit for bit, for NORM and NEOX pairs, with and without bias, with and
/// without the QK norm, rope over all dims and over part of them, f16 and f32 mirrors, 1 and
/// 4 workgroups a head, rows of three regions (one key, a few chunks) beside two runs of a
/// peel's rows (each reading its run's earlier keys; one run across a chunk's end). Controls:
/// another rope style, the bias flipped, or the QK norm flipped must move the outputs. (A
/// kernel that read a run's earlier keys from the mirror would race with their stores, so no
/// control runs it: a mutation that did failed the equality here.)
#[test]
fn attention_that_ropes_equals_rope_store_then_attention() {
    let Some(mut h) = Harness::new() else { return };
    let (n_head, n_head_kv, hd) = (6usize, 2usize, 64usize);
    let (q_dim, kv_dim, n_ctx) = (n_head * hd, n_head_kv * hd, 160usize);
    let mut rng = Rng(77);
    // (keys, region) of each row: its newest key at keys - 1. Regions 3 and 4 hold runs of a
    // peel's rows (each row reads the keys of its run's earlier rows; region 4's run crosses
    // a 64-key chunk).
    let rr = [(1usize, 0usize), (77, 1), (150, 2), (64, 3), (65, 3), (66, 3), (128, 4), (129, 4)];
    let rows = rr.len();
    let meta: Vec<RowMeta> = rr.iter().map(|&(keys, reg)| RowMeta { token: 0, pos: keys as u32 - 1, kv_base: (reg * n_ctx * kv_dim) as u32, keys: keys as u32 }).collect();
    let mb = h.buf_bytes(&RowMeta::words(&meta));
    for (style, codec, bias_on, rope_dims, qk) in [
        (resin_model::RopeStyle::Norm, resin_core::KvCodec::F16, false, hd, false),
        (resin_model::RopeStyle::Neox, resin_core::KvCodec::F16, true, hd, true),
        (resin_model::RopeStyle::Norm, resin_core::KvCodec::F32, true, 32, true),
        (resin_model::RopeStyle::Neox, resin_core::KvCodec::F32, false, 48, false),
    ] {
        let what = format!("{style:?} {codec:?} bias {bias_on} rope_dims {rope_dims} qk norm {qk}");
        let elems = 5 * n_ctx * kv_dim;
        let mirror: Vec<u8> = if codec == resin_core::KvCodec::F16 {
            rng.vec(elems, 2.0).iter().flat_map(|&a| half::f16::from_f32(a).to_le_bytes()).collect()
        } else {
            f32_bytes(&rng.vec(elems, 2.0))
        };
        let q = rng.vec(rows * q_dim, 2.0);
        let (k, v) = (rng.vec(rows * kv_dim, 2.0), rng.vec(rows * kv_dim, 2.0));
        let bias = rng.vec(q_dim + 2 * kv_dim, 0.5);
        let table = resin_vulkan::home::rope_table(n_ctx, rope_dims, 10000.0);
        let (kb, vb, bb, tb, nb) = (h.buf_f32(&k), h.buf_f32(&v), h.buf_f32(&bias), h.buf_f32(&table), h.buf_f32(&rng.vec(2 * hd, 1.5)));
        let scale = 1.0 / (hd as f32).sqrt();
        // One path: (outputs, K mirror bytes, V mirror bytes).
        let run = |h: &mut Harness, own: bool, style: resin_model::RopeStyle, bias_on: bool, qk: bool, pieces: u32, reads: u32| -> (Vec<f32>, Vec<u32>, Vec<u32>) {
            let (mk, mv) = (h.buf_bytes(&mirror), h.buf_bytes(&mirror));
            let qb = h.buf_f32(&q);
            let part = h.poisoned(attn_part_len(rows, n_head, hd, ATTN_SLOTS as usize));
            let ob = h.poisoned(rows * q_dim);
            let done = h.buf_f32(&vec![0.0; rows * n_head]);
            let p = AttnPush { n_head: n_head as u32, n_head_kv: n_head_kv as u32, head_dim: hd as u32, n_pieces: pieces, scale, key_window: 0 };
            let binds = AttnBinds { q: (&qb).into(), mk: (&mk).into(), mv: (&mv).into(), meta: (&mb).into(), part: (&part).into(), out: (&ob).into() };
            h.run(|rec| {
                if own {
                    let qk_norm = qk.then(|| ((&nb).into(), 1e-6));
                    let rope = AttnRope { k: (&kb).into(), v: (&vb).into(), bias: (&bb).into(), table: (&tb).into(), rope_dims: rope_dims as u32, style, bias_on, qk_norm, reads };
                    return rec.attention_round(codec, rows as u32, binds, None, Some((&done).into()), Some(rope), p);
                }
                let rp = RopePush {
                    n_head: n_head as u32,
                    n_head_kv: n_head_kv as u32,
                    head_dim: hd as u32,
                    rope_dims: rope_dims as u32,
                    flags: if bias_on { ROPE_BIAS } else { 0 } | if qk { ROPE_QK_NORM } else { 0 },
                    eps: 1e-6,
                };
                rec.rope_store(
                    style,
                    codec,
                    rows as u32,
                    [(&qb).into(), (&kb).into(), (&vb).into(), (&bb).into(), (&nb).into(), (&tb).into(), (&mb).into(), (&mk).into(), (&mv).into()],
                    rp,
                )?;
                rec.barrier();
                rec.attention_round(codec, rows as u32, binds, None, Some((&done).into()), None, p)
            });
            let words = mirror.len() / 4;
            (ob.read_f32(0, rows * q_dim).unwrap(), mk.read_u32(0, words).unwrap(), mv.read_u32(0, words).unwrap())
        };
        // (pieces a head, keys of the pass a row reads at most: the longest run, or more)
        for (pieces, reads) in [(1u32, 8u32), (4, 8), (4, 3)] {
            let (out_a, mk_a, mv_a) = run(&mut h, false, style, bias_on, qk, pieces, 1);
            let (out_b, mk_b, mv_b) = run(&mut h, true, style, bias_on, qk, pieces, reads);
            assert!(mk_a == mk_b, "{what} pieces {pieces}: the K mirror differs ({} words)", mk_a.iter().zip(&mk_b).filter(|(a, b)| a != b).count());
            assert!(mv_a == mv_b, "{what} pieces {pieces}: the V mirror differs");
            assert!(mk_a != words_of(&mirror), "{what}: the newest keys were stored");
            let differ = out_a.iter().zip(&out_b).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
            if differ > 0 {
                for r in 0..rows {
                    let (a, b) = (&out_a[r * q_dim..(r + 1) * q_dim], &out_b[r * q_dim..(r + 1) * q_dim]);
                    let n = a.iter().zip(b).filter(|(x, y)| x.to_bits() != y.to_bits()).count();
                    eprintln!("row {r}: {n} differ; first {:?} vs {:?}", &a[..4], &b[..4]);
                }
            }
            assert!(differ == 0, "{what} pieces {pieces}: {differ} of {} outputs differ", out_a.len());
            assert!(out_a.iter().all(|x| x.is_finite()));
        }
        // Controls: the other pair style; the bias flipped.
        let other = if style == resin_model::RopeStyle::Norm { resin_model::RopeStyle::Neox } else { resin_model::RopeStyle::Norm };
        let (base, _, _) = run(&mut h, true, style, bias_on, qk, 1, 8);
        assert!(!bits_equal(&run(&mut h, true, other, bias_on, qk, 1, 8).0, &base), "control {what}: another rope style must move the outputs");
        assert!(!bits_equal(&run(&mut h, true, style, !bias_on, qk, 1, 8).0, &base), "control {what}: the bias must move the outputs");
        assert!(!bits_equal(&run(&mut h, true, style, bias_on, !qk, 1, 8).0, &base), "control {what}: the QK norm must move the outputs");
    }
}

fn words_of(bytes: &[u8]) -> Vec<u32> {
    bytes.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

/// The copy that measures the device's bandwidth copies every word, through the 4-word body
/// and the tail (a length that is not a multiple of the grid's stride), with fewer workgroups
/// than words need (each invocation strides on). Control: the output was poisoned, and a copy
/// one word short leaves the last word's poison, which the check sees.
#[test]
fn copy16_copies_every_word() {
    let Some(mut h) = Harness::new() else { return };
    let words = 3 * 256 * 4 + 77;
    let src: Vec<f32> = Rng(0xc09).vec(words * 4, 5.0);
    let sb = h.buf_f32(&src);
    let dst = h.poisoned(words * 4);
    h.run(|rec| rec.copy16(words as u32, 2, (&sb).into(), (&dst).into()));
    assert_eq!(dst.read_u32(0, words * 4).unwrap(), src.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
    let short = h.poisoned(words * 4);
    h.run(|rec| rec.copy16(words as u32 - 1, 2, (&sb).into(), (&short).into()));
    assert_ne!(short.read_u32(0, words * 4).unwrap(), src.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), "control: one word short");
}
