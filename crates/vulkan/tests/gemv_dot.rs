//! The int8 dot GEMV tier (src/gemv_dot.rs): the packed activations against `qact`, and every
//! format's GEMV against an f64 oracle over the ROUNDED activations, both ways of taking the
//! integer dot products (bitfieldExtract and OpSDot where the device has the feature).

mod common;

use common::*;
use resin_gguf::{formats, GgmlType};
use resin_vulkan::buffers::{Buffer, Location};
use resin_vulkan::gemv_dot::{dot_ok, DotShape, DotTier, QPack};
use resin_vulkan::kernels::{GemvPush, GemvTier};

/// A poisoned u32 buffer of `words`.
fn poisoned_words(h: &Harness, words: usize) -> Buffer {
    let mut b = Buffer::new(&h.gpu, (words * 4) as u64, Location::Device).unwrap();
    b.fill_u32(POISON).unwrap();
    b
}

/// x through `qact` (f32 rounded values) and through `qpack` (the packed words).
fn round_and_pack(h: &mut Harness, x: &[f32], block: u32) -> (Vec<f32>, Vec<u32>, QPack) {
    let n = x.len();
    let layout = QPack::new(block, n as u32).unwrap();
    let xb = h.buf_f32(x);
    let yr = h.poisoned(n);
    let pk = poisoned_words(h, layout.words() as usize);
    h.run(|rec| {
        rec.qact(block, n as u32, (&xb).into(), (&yr).into())?;
        rec.qpack(layout, (&xb).into(), (&pk).into())
    });
    (yr.read_f32(0, n).unwrap(), pk.read_u32(0, layout.words() as usize).unwrap(), layout)
}

/// The packed words unpacked: (q, d a block, sums a group).
fn unpack(words: &[u32], l: QPack) -> (Vec<i32>, Vec<f32>, Vec<i32>) {
    let n = l.count as usize;
    let q = (0..n).map(|i| ((words[i / 4] >> (8 * (i % 4))) & 0xFF) as u8 as i8 as i32).collect();
    let d = words[l.d_off() as usize..l.s_off() as usize].iter().map(|w| f32::from_bits(*w)).collect();
    let s = words[l.s_off() as usize..l.words() as usize].iter().map(|w| *w as i32).collect();
    (q, d, s)
}

#[test]
fn packed_activations_are_qact_bit_for_bit() {
    let Some(mut h) = Harness::new() else { return };
    let mut rng = Rng(0xd07);
    // 3 x 2048 + 512 values: several workgroups, the last one partial.
    let n = 3 * 2048 + 512;
    let mut x = rng.vec(n, 3.0);
    x[64..96].iter_mut().for_each(|v| *v = 0.0); // an all-zero 32-block
    x[1024..1280].iter_mut().for_each(|v| *v = 0.0); // an all-zero 256-block
    x[300] = 1e-30; // a tiny amax neighbour
    for block in [32u32, 256] {
        let (yr, words, l) = round_and_pack(&mut h, &x, block);
        let (q, d, s) = unpack(&words, l);
        let b = block as usize;
        let g = l.sum_group() as usize;
        assert_eq!(d.len(), n / b);
        assert_eq!(s.len(), n / g);
        for i in 0..n {
            // Bit for bit, except that int8 has no -0: qact writes -0 where a negative value
            // rounds to 0, the packed quant is 0 (the same product in any dot).
            let v = q[i] as f32 * d[i / b];
            let same = v.to_bits() == yr[i].to_bits() || (q[i] == 0 && yr[i].to_bits() == 0x8000_0000);
            assert!(same, "qpack{block}[{i}]: q {} * d {} = {v}, qact {}", q[i], d[i / b], yr[i]);
            assert!(q[i].abs() <= 127);
        }
        for (k, sum) in s.iter().enumerate() {
            assert_eq!(*sum, q[k * g..(k + 1) * g].iter().sum::<i32>(), "qpack{block} sum {k}");
        }
        for k in 0..n / b {
            let amax = q[k * b..(k + 1) * b].iter().map(|v| v.abs()).max().unwrap();
            let zero = x[k * b..(k + 1) * b].iter().all(|v| *v == 0.0);
            assert_eq!(amax, if zero { 0 } else { 127 }, "qpack{block} block {k}: the largest value rounds to +-127");
        }
        // Control: one quant moved by one step no longer reproduces qact.
        let mut bad = words.clone();
        bad[3] ^= 1;
        let (qb, _, _) = unpack(&bad, l);
        assert!((0..n).any(|i| (qb[i] as f32 * d[i / b]).to_bits() != yr[i].to_bits()), "control: a changed quant must differ");
    }
}

const DOT_FORMATS: [GgmlType; 7] = [GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::Q4_0, GgmlType::Q5_K, GgmlType::Q4_1, GgmlType::Q5_0];

/// The per-value offset a format's float part carries beside d * q (ggml's m of Q4_1,
/// dmin * mn of Q4_K/Q5_K; 0 where the offset is taken off exactly in the integer sum).
fn offsets(ty: GgmlType, w: &[u8], rows: usize, cols: usize) -> Vec<f64> {
    let f16 = |o: usize| half_to_f32(u16::from_le_bytes([w[o], w[o + 1]])) as f64;
    let mut off = vec![0f64; rows * cols];
    let bb = ty.block_bytes();
    match ty {
        GgmlType::Q4_1 => {
            for (b, o) in off.chunks_mut(32).enumerate() {
                o.fill(f16(b * bb + 2).abs());
            }
        }
        GgmlType::Q4_K | GgmlType::Q5_K => {
            for (b, o) in off.chunks_mut(256).enumerate() {
                let s = &w[b * bb..(b + 1) * bb];
                let dmin = f16(b * bb + 2).abs();
                for j in 0..8 {
                    // ggml's get_scale_min_k4: the 12 scale bytes start at byte 4.
                    let m = if j < 4 { s[8 + j] & 63 } else { (s[8 + j] >> 4) | ((s[4 + j] >> 6) << 4) };
                    o[32 * j..32 * j + 32].fill(dmin * m as f64);
                }
            }
        }
        _ => {}
    }
    off
}

fn half_to_f32(h: u16) -> f32 {
    let s = (h >> 15) as u32;
    let e = ((h >> 10) & 31) as i32;
    let m = (h & 1023) as f32;
    let v = if e == 0 {
        m * (2f32).powi(-24)
    } else if e == 31 {
        f32::INFINITY
    } else {
        (1.0 + m / 1024.0) * (2f32).powi(e - 15)
    };
    if s == 1 {
        -v
    } else {
        v
    }
}

/// y = W xr in f64 over the rounded activations xr, and the bar of each element:
/// (cols/32 + 64 + 6) * u * A, A = sum_j (|w_j| + 2 |off_j|) |xr_j|.
/// Why: the integer sums are exact (and below 2^24, so exact as f32); each 32-value unit's
/// float part is at most 3 roundings of terms whose magnitudes sum to at most A (|d q| <= |w| +
/// |off|, the offset term <= |off| |xr|); a lane adds at most cols/32 unit terms in order and
/// subgroupAdd at most 64 lanes, each add one rounding of a partial sum <= A; the reference
/// dequantization (the oracle's weights) is itself within 3 u (|w| + |off|) of d q - off.
fn oracle(wq: &[f32], off: &[f64], xr: &[f32], rows: usize, cols: usize) -> (Vec<f64>, Vec<f64>) {
    let mut y = vec![0f64; rows];
    let mut bar = vec![0f64; rows];
    for r in 0..rows {
        let (mut s, mut a) = (0f64, 0f64);
        for j in 0..cols {
            let w = wq[r * cols + j] as f64;
            let x = xr[j] as f64;
            s += w * x;
            a += (w.abs() + 2.0 * off[r * cols + j]) * x.abs();
        }
        y[r] = s;
        bar[r] = ((cols / 32) as f64 + 64.0 + 6.0) * U * a + 1e-30;
    }
    (y, bar)
}

fn tiers(h: &Harness) -> Vec<DotTier> {
    if h.gpu.info.int_dot {
        vec![DotTier::Emulated, DotTier::Hardware]
    } else {
        eprintln!("SKIP: the OpSDot variant (device without the integer dot product feature)");
        vec![DotTier::Emulated]
    }
}

/// The matrix and the 8 activation columns of one case, each column packed alone, for the
/// one-row runs.
struct Case<'a> {
    ty: GgmlType,
    wbuf: &'a Buffer,
    alone: &'a [(Buffer, QPack)],
    p: GemvPush,
}

/// Each of the 8 columns run alone through the one-row form, its rows split over `split`
/// subgroups.
fn one_row_runs(h: &mut Harness, tier: DotTier, case: &Case<'_>, split: u32) -> Vec<Vec<f32>> {
    let rows = case.p.rows as usize;
    (0..8)
        .map(|c| {
            let yb = h.poisoned(rows);
            let (xp, layout) = (&case.alone[c].0, case.alone[c].1);
            h.run(|rec| rec.gemv_dot_tier(tier, Some(DotShape { rows: 1, unroll: 1, split }), case.ty, 1, case.wbuf.into(), xp.into(), (&yb).into(), case.p, layout));
            yb.read_f32(0, rows).unwrap()
        })
        .collect()
}

/// Columns 0..n of an N-row result `got` (8 columns of `rows` long): each within its oracle's
/// bar and bit for bit the column run alone (`one_row`), nothing written past column n.
/// Returns the worst err/bar.
fn check_columns(what: &str, got: &[f32], n: usize, rows: usize, oracles: &[(Vec<f64>, Vec<f64>)], one_row: &[Vec<f32>]) -> f64 {
    let mut worst = 0f64;
    for c in 0..n {
        let g = &got[c * rows..(c + 1) * rows];
        let (want, bar) = &oracles[c];
        let what = format!("{what} col {c}");
        worst = worst.max(check(&what, g, want, bar).unwrap());
        let same = g.iter().zip(&one_row[c]).all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same, "{what}: differs from the one-row form run alone");
    }
    assert!(got[n * rows..].iter().all(|v| v.to_bits() == POISON), "{what}: wrote past its columns");
    worst
}

fn gemv_dot_format(ty: GgmlType) {
    let Some(mut h) = Harness::new() else { return };
    if !dot_ok(&h.gpu.info) {
        eprintln!("SKIP: the dot GEMV needs subgroup arithmetic");
        return;
    }
    let t0 = std::time::Instant::now();
    let block = resin_vulkan::kernels::act_block(ty).unwrap();
    let mut rng = Rng(0xab5 + ty.block_bytes() as u64);
    let mut worst = 0f64;
    for (rows, cols) in [(67usize, 512usize), (130, 512), (67, 2048), (130, 2048)] {
        let src = rng.vec(rows * cols, 1.0);
        let wbytes = formats::quantize(ty, &src).unwrap();
        let mut wq = vec![0f32; rows * cols];
        formats::dequantize(ty, &wbytes, &mut wq).unwrap();
        let off = offsets(ty, &wbytes, rows, cols);
        let (wbuf, row_bytes) = h.weights(ty, cols, &wbytes);
        let xs = rng.vec(8 * cols, 2.0);
        let (xr, words, layout) = round_and_pack(&mut h, &xs, block);
        let pk = h.buf_bytes(&resin_vulkan::buffers::u32_bytes(&words));
        let xrb = h.buf_f32(&xr);
        // Each column packed alone, for the one-row runs.
        let alone: Vec<(Buffer, QPack)> = (0..8)
            .map(|c| {
                let (_, w, l) = round_and_pack(&mut h, &xs[c * cols..(c + 1) * cols], block);
                (h.buf_bytes(&resin_vulkan::buffers::u32_bytes(&w)), l)
            })
            .collect();
        let p = GemvPush { rows: rows as u32, cols: cols as u32, row_bytes: row_bytes as u32, x_stride: cols as u32, y_stride: rows as u32, y_off: 0 };
        let oracles: Vec<(Vec<f64>, Vec<f64>)> = (0..8).map(|c| oracle(&wq, &off, &xr[c * cols..(c + 1) * cols], rows, cols)).collect();
        let case = Case { ty, wbuf: &wbuf, alone: &alone, p };
        let mut by_tier: Vec<Vec<u32>> = Vec::new();
        for tier in tiers(&h) {
            let one_row = one_row_runs(&mut h, tier, &case, 1);
            // Units a lane loaded together must not change a bit either.
            for (sgr, unroll) in [(1u32, 2u32), (1, 4), (2, 2)] {
                let yb = h.poisoned(rows);
                h.run(|rec| rec.gemv_dot_tier(tier, Some(DotShape { rows: sgr, unroll, split: 1 }), ty, 1, (&wbuf).into(), (&alone[0].0).into(), (&yb).into(), p, alone[0].1));
                let same = yb.read_f32(0, rows).unwrap().iter().zip(&one_row[0]).all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "gemv_dot {tier:?} {ty} {rows}x{cols}: {sgr} rows a subgroup, {unroll} units a lane differ from 1 and 1");
            }
            // A row's units split over 2 or 4 subgroups: another order of the sum, so its own
            // one-row runs, which every N-row run must equal bit for bit; all within the bar.
            for split in [2u32, 4] {
                let alone_split = one_row_runs(&mut h, tier, &case, split);
                for n in [1usize, 3, 8] {
                    let ybuf = h.poisoned(8 * rows);
                    let sgr = if n == 3 { 2 } else { 1 };
                    h.run(|rec| rec.gemv_dot_tier(tier, Some(DotShape { rows: sgr, unroll: 2, split }), ty, n as u32, (&wbuf).into(), (&pk).into(), (&ybuf).into(), p, layout));
                    let got = ybuf.read_f32(0, 8 * rows).unwrap();
                    let what = format!("gemv_dot {tier:?} {ty} {rows}x{cols} n={n} split over {split} subgroups,");
                    worst = worst.max(check_columns(&what, &got, n, rows, &oracles, &alone_split));
                }
            }
            let mut all = Vec::new();
            for n in 1..=8usize {
                let ybuf = h.poisoned(8 * rows);
                // 1..4 rows a subgroup across n (the one-row runs take 1): the rows taken
                // together must not change a bit.
                let sgr = 1 + (n as u32 % 4);
                let unroll = if n > 4 { 4 / sgr } else { 1 };
                h.run(|rec| rec.gemv_dot_tier(tier, Some(DotShape { rows: sgr, unroll, split: 1 }), ty, n as u32, (&wbuf).into(), (&pk).into(), (&ybuf).into(), p, layout));
                let got = ybuf.read_f32(0, 8 * rows).unwrap();
                let what = format!("gemv_dot {tier:?} {ty} {rows}x{cols} n={n} ({sgr} rows a subgroup, {unroll} units a lane)");
                worst = worst.max(check_columns(&what, &got, n, rows, &oracles, &one_row));
                all.extend(got[..n * rows].iter().map(|v| v.to_bits()));
            }
            by_tier.push(all);
        }
        if by_tier.len() == 2 {
            assert!(by_tier[0] == by_tier[1], "{ty} {rows}x{cols}: OpSDot and bitfieldExtract differ");
        }
        // The subgroup tier over the same rounded activations: within both bars.
        let ysg = h.poisoned(8 * rows);
        h.run(|rec| rec.gemv_tier(GemvTier::Subgroup, ty, 8, (&wbuf).into(), (&xrb).into(), (&ysg).into(), p));
        let sg = ysg.read_f32(0, 8 * rows).unwrap();
        let yd = h.poisoned(8 * rows);
        h.run(|rec| rec.gemv_dot(ty, 8, (&wbuf).into(), (&pk).into(), (&yd).into(), p, layout));
        let dot = yd.read_f32(0, 8 * rows).unwrap();
        for c in 0..8 {
            let (_, bar) = &oracles[c];
            let sgw: Vec<f64> = sg[c * rows..(c + 1) * rows].iter().map(|v| *v as f64).collect();
            // The subgroup tier's own bar: (cols + 8) u sum |w xr| (tests/kernels.rs), below `bar`.
            let both: Vec<f64> = bar.iter().map(|b| 2.0 * b).collect();
            check(&format!("{ty} {rows}x{cols} col {c}: dot vs subgroup tier"), &dot[c * rows..(c + 1) * rows], &sgw, &both).unwrap();
        }
        // Controls: an unwritten output; the oracle over the UNROUNDED activations (the
        // rounding moves results far past the bar); a perturbed oracle.
        let (want, bar) = &oracles[0];
        let poison = h.poisoned(rows).read_f32(0, rows).unwrap();
        assert!(check("control: poisoned", &poison, want, bar).is_err(), "an unwritten output must fail");
        let g0 = &dot[..rows];
        let (want_raw, _) = oracle(&wq, &off, &xs[..cols], rows, cols);
        assert!(check("control: unrounded", g0, &want_raw, bar).is_err(), "{ty}: the oracle over unrounded activations must fail");
        let mut moved = want.clone();
        moved[5] += (wq[5 * cols + 7].abs() as f64).max(0.01) * 0.5 * xr[7].abs().max(0.1) as f64;
        assert!(check("control: perturbed", g0, &moved, bar).is_err(), "{ty}: a perturbed oracle must fail");
    }
    eprintln!("gemv_dot {ty}: worst err/bar {worst:.4} ({:.1} s)", t0.elapsed().as_secs_f64());
}

#[test]
fn gemv_dot_q8_0() {
    gemv_dot_format(GgmlType::Q8_0);
}
#[test]
fn gemv_dot_q4_k() {
    gemv_dot_format(GgmlType::Q4_K);
}
#[test]
fn gemv_dot_q6_k() {
    gemv_dot_format(GgmlType::Q6_K);
}
#[test]
fn gemv_dot_q4_0() {
    gemv_dot_format(GgmlType::Q4_0);
}
#[test]
fn gemv_dot_q5_k() {
    gemv_dot_format(GgmlType::Q5_K);
}
#[test]
fn gemv_dot_q4_1() {
    gemv_dot_format(GgmlType::Q4_1);
}
#[test]
fn gemv_dot_q5_0() {
    gemv_dot_format(GgmlType::Q5_0);
}

#[test]
fn gemv_dot_refusals() {
    let Some(mut h) = Harness::new() else { return };
    assert!(QPack::new(64, 256).is_err());
    assert!(QPack::new(32, 48).is_err());
    let l = QPack::new(256, 512).unwrap();
    assert_eq!((l.d_off(), l.s_off(), l.words()), (128, 130, 162));
    for ty in DOT_FORMATS {
        assert!(resin_vulkan::gemv_dot::dot_format(ty).is_some(), "{ty}");
    }
    if !dot_ok(&h.gpu.info) {
        return;
    }
    let w = h.buf_bytes(&[0u8; 1024]);
    let x = h.buf_bytes(&[0u8; 4096]);
    let y = h.poisoned(64);
    let p = GemvPush { rows: 1, cols: 256, row_bytes: 144, x_stride: 256, y_stride: 1, y_off: 0 };
    let gpu = h.gpu.clone();
    let mut errs = Vec::new();
    resin_vulkan::buffers::submit_once(&gpu, |cmd| {
        let mut rec = resin_vulkan::kernels::Recorder::new(&gpu, &mut h.pipes, &mut h.desc, cmd);
        // F16 has no dot kernel; Q4_K with 32-blocks; 9 columns; more columns than packed.
        errs.push(rec.gemv_dot(GgmlType::F16, 1, (&w).into(), (&x).into(), (&y).into(), p, l).is_err());
        errs.push(rec.gemv_dot(GgmlType::Q4_K, 1, (&w).into(), (&x).into(), (&y).into(), p, QPack::new(32, 512).unwrap()).is_err());
        errs.push(rec.gemv_dot(GgmlType::Q4_K, 9, (&w).into(), (&x).into(), (&y).into(), p, l).is_err());
        errs.push(rec.gemv_dot_tier(DotTier::Emulated, Some(DotShape { rows: 5, unroll: 1, split: 1 }), GgmlType::Q4_K, 1, (&w).into(), (&x).into(), (&y).into(), p, l).is_err());
        errs.push(rec.gemv_dot_tier(DotTier::Emulated, Some(DotShape { rows: 2, unroll: 4, split: 1 }), GgmlType::Q4_K, 1, (&w).into(), (&x).into(), (&y).into(), p, l).is_err());
        errs.push(rec.gemv_dot_tier(DotTier::Emulated, Some(DotShape { rows: 1, unroll: 1, split: 3 }), GgmlType::Q4_K, 1, (&w).into(), (&x).into(), (&y).into(), p, l).is_err());
        errs.push(rec.gemv_dot(GgmlType::Q4_K, 3, (&w).into(), (&x).into(), (&y).into(), p, l).is_err());
    })
    .unwrap();
    assert!(errs.iter().all(|e| *e), "{errs:?}");
}

/// Wall time of 100 one-row GEMVs in one submission over a weight matrix larger than the
/// H200's L2 (random bytes: timing only), the subgroup tier (f32 activations) against the dot
/// tier both ways (the packing is timed apart). `cargo test --release --test gemv_dot -- --ignored --nocapture`.
#[test]
#[ignore]
fn gemv_dot_speed() {
    let Some(mut h) = Harness::new() else { return };
    if !dot_ok(&h.gpu.info) {
        return;
    }
    let reps = 100u32;
    // The big shapes outrun the L2; 8192x2048 and 2048x8192 are the 1B model's gate and down.
    for (ty, rows, cols) in
        [(GgmlType::Q8_0, 32768usize, 4096usize), (GgmlType::Q8_0, 8192, 2048), (GgmlType::Q8_0, 2048, 8192), (GgmlType::Q4_K, 32768, 8192), (GgmlType::Q6_K, 32768, 8192)]
    {
        let bb = ty.block_bytes();
        let row_bytes = cols / (if resin_vulkan::kernels::act_block(ty) == Some(32) { 32 } else { 256 }) * bb;
        let mut rng = Rng(9);
        let mut wbytes: Vec<u8> = (0..rows * row_bytes / 8).flat_map(|_| rng.next_u64().to_le_bytes()).collect();
        // Finite f16 scales are not needed for timing, but keep NaNs out of the way anyway.
        wbytes.iter_mut().skip(1).step_by(2).for_each(|b| *b &= 0x3B);
        let (wbuf, row_bytes) = h.weights(ty, cols, &wbytes);
        let xs = rng.vec(cols, 1.0);
        let (xr, words, layout) = round_and_pack(&mut h, &xs, resin_vulkan::kernels::act_block(ty).unwrap());
        let xrb = h.buf_f32(&xr);
        let pk = h.buf_bytes(&resin_vulkan::buffers::u32_bytes(&words));
        let xb = h.buf_f32(&xs);
        let y = h.poisoned(rows);
        let (_, words8, layout8) = round_and_pack(&mut h, &rng.vec(8 * cols, 1.0), resin_vulkan::kernels::act_block(ty).unwrap());
        let pk8 = h.buf_bytes(&resin_vulkan::buffers::u32_bytes(&words8));
        let y8 = h.poisoned(8 * rows);
        let p = GemvPush { rows: rows as u32, cols: cols as u32, row_bytes: row_bytes as u32, x_stride: cols as u32, y_stride: rows as u32, y_off: 0 };
        let int_dot = h.gpu.info.int_dot;
        let tier = DotTier::for_device(&h.gpu.info);
        let mut time = |name: &str, f: &mut dyn FnMut(&mut resin_vulkan::kernels::Recorder<'_>) -> Result<(), resin_vulkan::VkError>| {
            let us = h.time_chained(reps, f);
            eprintln!("{ty} {rows}x{cols} {name}: {us:.1} us a GEMV, {:.0} GB/s of weights", wbytes.len() as f64 / us / 1e3);
        };
        time("subgroup f32 x", &mut |rec| rec.gemv_tier(GemvTier::Subgroup, ty, 1, (&wbuf).into(), (&xrb).into(), (&y).into(), p));
        time("dot bitfieldExtract", &mut |rec| rec.gemv_dot_tier(DotTier::Emulated, None, ty, 1, (&wbuf).into(), (&pk).into(), (&y).into(), p, layout));
        if int_dot {
            time("dot OpSDot", &mut |rec| rec.gemv_dot_tier(DotTier::Hardware, None, ty, 1, (&wbuf).into(), (&pk).into(), (&y).into(), p, layout));
        }
        time("dot, 8 rows", &mut |rec| rec.gemv_dot(ty, 8, (&wbuf).into(), (&pk8).into(), (&y8).into(), p, layout8));
        // The 8-row form's shapes (rows a subgroup, units a lane, split), for choosing the default.
        for (sgr, unroll, split) in [(1u32, 1u32, 1u32), (1, 2, 1), (1, 4, 1), (2, 1, 1), (2, 2, 1), (4, 1, 1), (1, 1, 2), (2, 1, 2), (4, 1, 2), (1, 1, 4), (2, 1, 4)] {
            let shape = DotShape { rows: sgr, unroll, split };
            time(&format!("dot, 8 rows, {sgr} rows a subgroup, {unroll} units a lane, split {split}"), &mut |rec| {
                rec.gemv_dot_tier(tier, Some(shape), ty, 8, (&wbuf).into(), (&pk8).into(), (&y8).into(), p, layout8)
            });
        }
        time("qpack alone", &mut |rec| rec.qpack(layout, (&xb).into(), (&pk).into()));
    }
}
