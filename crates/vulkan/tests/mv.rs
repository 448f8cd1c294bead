//! The canonical matrix product (src/mv.rs) against the scalar reference of
//! docs/canonical-order.md (`resin_cpu::kernels::canon`): packed activations, every format's
//! product bit for bit for any row count (mv.comp's 1..8 rows and mm.comp's more, one pass
//! over the weights), the residual and folded-norm forms, the SwiGLU epilogue's packed
//! output; every way of taking the integer dot products the device has (dot4, OpSDot, int8
//! tensor-core tiles); the expert form (mm.comp EXPERT) over slots grouped by expert
//! (moe.comp GROUP).

mod common;

use common::*;
use resin_core::canon::Cut;
use resin_cpu::kernels::canon::{canon_dot, canon_rms_scale, canon_sumsq, CanonActs};
use resin_gguf::{formats, GgmlType};
use resin_model::FfnAct;
use resin_vulkan::buffers::{u32_bytes, Buffer, Location};
use resin_vulkan::kernels::{moe_active_entries, NormPush, MOE_NO_EXPERT};
use resin_vulkan::mv::{mv_fits, mv_ok, tiles_ok, Combine, DotTier, Experts, Mv, MvIn, MvOut, MvShape, NormAdd, PackNext, QPack};
use resin_vulkan::pipelines::Bind;

fn poisoned_words(h: &Harness, words: usize) -> Buffer {
    let mut b = Buffer::new(&h.gpu, (words * 4) as u64, Location::Device).unwrap();
    b.fill_u32(POISON).unwrap();
    b
}

/// The f32 rows `xs` (`cols` values each) normed by `nw` in the canonical order (`normpack`):
/// the packed u, its layout and each row's r, the input of a `NormPacked` product.
fn normpacked(h: &mut Harness, xs: &[f32], cols: usize, nw: &Buffer, eps: f32) -> (Buffer, QPack, Buffer) {
    let rows = xs.len() / cols;
    let layout = QPack::new(xs.len() as u32).unwrap();
    let (xb, pk, r) = (h.buf_f32(xs), poisoned_words(h, layout.words() as usize), h.poisoned(rows));
    h.run(|rec| rec.normpack(rows as u32, cols as u32, eps, (&xb).into(), None, nw.into(), layout, (&pk).into(), (&r).into()));
    (pk, layout, r)
}

/// Rows of activations packed on the host, as QPack lays them out.
fn pack_host(rows: &[CanonActs]) -> Vec<u32> {
    let count: usize = rows.iter().map(|a| a.q.len()).sum();
    let l = QPack::new(count as u32).unwrap();
    let mut w = vec![0u32; l.words() as usize];
    let (q, d, s): (Vec<i8>, Vec<f32>, Vec<i32>) =
        (rows.iter().flat_map(|a| a.q.clone()).collect(), rows.iter().flat_map(|a| a.d.clone()).collect(), rows.iter().flat_map(|a| a.s.clone()).collect());
    for (i, v) in q.iter().enumerate() {
        w[i / 4] |= (*v as u8 as u32) << (8 * (i % 4));
    }
    for (b, (dv, sv)) in d.iter().zip(&s).enumerate() {
        w[l.d_off() as usize + b] = dv.to_bits();
        w[l.s_off() as usize + b] = *sv as u32;
    }
    w
}

fn tiers(h: &Harness) -> Vec<DotTier> {
    let mut t = vec![DotTier::Emulated];
    if h.gpu.info.int_dot {
        t.push(DotTier::Hardware);
    } else {
        eprintln!("SKIP: the OpSDot variant (device without the integer dot product feature)");
    }
    if tiles_ok(&h.gpu.info) {
        t.push(DotTier::Tiles);
    } else {
        eprintln!("SKIP: the int8 tensor-core tier (device without 16x16x32 int8 cooperative matrices)");
    }
    t
}

/// Activation rows the format tests take: past one mm.comp tile of 32.
const NA: usize = 40;
/// Row counts of the format tests: mv.comp's forms, and mm.comp's at, past and across tiles.
const NS: [usize; 7] = [1, 3, 8, 9, 16, 33, NA];

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn packed_activations_follow_the_reference() {
    let Some(mut h) = Harness::new() else { return };
    let mut rng = Rng(0xd07);
    let n = 3 * 2048 + 512; // several workgroups, the last one partial
    let mut x = rng.vec(n, 3.0);
    x[64..96].iter_mut().for_each(|v| *v = 0.0); // an all-zero block
    x[300] = 1e-30;
    let l = QPack::new(n as u32).unwrap();
    let (xb, yr, pk) = (h.buf_f32(&x), h.poisoned(n), poisoned_words(&h, l.words() as usize));
    h.run(|rec| {
        rec.qact(32, n as u32, (&xb).into(), (&yr).into())?;
        rec.qpack(l, (&xb).into(), (&pk).into())
    });
    let got = pk.read_u32(0, l.words() as usize).unwrap();
    let want = pack_host(&[CanonActs::quantize(&x)]);
    // Bit for bit where the device divides as IEEE does (lavapipe); elsewhere a quant may
    // round the other way and d move by an ULP, in a few blocks.
    let exact = h.gpu.info.kind == "cpu";
    let differing = (0..n / 32).filter(|b| got[b * 8..b * 8 + 8] != want[b * 8..b * 8 + 8] || got[l.d_off() as usize + b] != want[l.d_off() as usize + b]).count();
    assert!(if exact { got == want } else { differing * 4 <= n / 32 }, "qpack32 differs from the reference's quantization in {differing} blocks");
    // qact's f32 rounding is q * d of the same blocks (int8 has no -0: a negative value that
    // rounds to 0 is -0 there).
    let yr = yr.read_f32(0, n).unwrap();
    for (i, y) in yr.iter().enumerate() {
        let (q, d) = (((got[i / 4] >> (8 * (i % 4))) & 0xFF) as u8 as i8, f32::from_bits(got[l.d_off() as usize + i / 32]));
        let v = q as f32 * d;
        assert!(v.to_bits() == y.to_bits() || (q == 0 && *y == 0.0), "qact32[{i}]: the packed value is not qact's");
    }
    // Control: one quant moved by one step differs.
    let mut bad = want.clone();
    bad[3] ^= 1;
    assert!(bad != got);
    assert!(QPack::new(48).is_err() && QPack::new(0).is_err());
    assert_eq!((l.d_off(), l.s_off()), (n as u32 / 4, n as u32 / 4 + n as u32 / 32));
}

/// One format's product: `n` in 1..=8 rows of packed activations against the reference bit
/// for bit (outputs poisoned first, nothing written past the rows), the residual form, the
/// folded norm, and a control that sums the same blocks left to right and must differ.
fn mv_format(ty: GgmlType) {
    let Some(mut h) = Harness::new() else { return };
    if !mv_ok(&h.gpu.info) {
        eprintln!("SKIP: the canonical product needs subgroup shuffles");
        return;
    }
    let t0 = std::time::Instant::now();
    let mut rng = Rng(0x3a1 + ty.block_bytes() as u64);
    let mut control_differs = false;
    // 576: 3 chunks (4 lanes); 2048: 8; 8192: 32 (past lavapipe's 8-lane subgroups: the tree
    // through shared memory). Row counts off any tile.
    // 16384: chunks of 16 blocks, longer than a pass of lavapipe's 8 lanes.
    let shapes: &[(usize, usize)] = if ty.block_len() == 256 { &[(40, 768), (40, 2048), (20, 8192), (6, 16384)] } else { &[(40, 576), (40, 2048), (20, 8192), (6, 16384)] };
    for &(rows, cols) in shapes {
        let cut = Cut::of(cols).unwrap();
        let wbytes = formats::quantize(ty, &rng.vec(rows * cols, 1.0)).unwrap();
        let rb = wbytes.len() / rows;
        let (wbuf, row_bytes) = h.weights(ty, cols, &wbytes);
        let xs = rng.vec(NA * cols, 2.0);
        let acts: Vec<CanonActs> = (0..NA).map(|c| CanonActs::quantize(&xs[c * cols..(c + 1) * cols])).collect();
        let want: Vec<f32> = (0..NA).flat_map(|c| (0..rows).map(|r| canon_dot(ty, &wbytes[r * rb..(r + 1) * rb], &acts[c], &cut)).collect::<Vec<_>>()).collect();
        let pk = h.buf_bytes(&u32_bytes(&pack_host(&acts)));
        let layout = QPack::new((NA * cols) as u32).unwrap();
        let shape = MvShape { rows: rows as u32, cols: cols as u32, row_bytes: row_bytes as u32, x_stride: cols as u32, y_stride: rows as u32, y_off: 0 };
        for tier in tiers(&h) {
            let what = format!("mv {tier:?} {ty} {rows}x{cols}");
            // Long rows at fewer widths (lavapipe's time): one mm.comp width past a tile.
            let widths: &[usize] = if cols > 2048 { &[1, 3, 8, 33] } else { &NS };
            for &n in widths {
                let y = h.poisoned(NA * rows);
                let input = MvIn::Packed { x: (&pk).into(), layout };
                h.run(|rec| rec.mv_tier(tier, Mv { ty, n: n as u32, w: (&wbuf).into(), input, out: MvOut::Store((&y).into()), shape }));
                let got = y.read_f32(0, NA * rows).unwrap();
                assert!(bits(&got[..n * rows]) == bits(&want[..n * rows]), "{what} n={n}: not the reference's bits");
                assert!(got[n * rows..].iter().all(|v| v.to_bits() == POISON), "{what} n={n}: wrote past its rows");
            }
            // y += W x onto a sum already there, at 8 rows and (short rows) at 33.
            for &n in if cols > 2048 { &[8usize][..] } else { &[8usize, 33][..] } {
                let y0 = rng.vec(n * rows, 5.0);
                let y = h.buf_f32(&y0);
                let input = MvIn::Packed { x: (&pk).into(), layout };
                h.run(|rec| rec.mv_tier(tier, Mv { ty, n: n as u32, w: (&wbuf).into(), input, out: MvOut::Add((&y).into()), shape }));
                let got = y.read_f32(0, n * rows).unwrap();
                let sum: Vec<f32> = want.iter().zip(&y0).map(|(a, b)| a + b).collect();
                assert!(bits(&got) == bits(&sum), "{what} n={n}: the residual form is not y' + y");
            }
        }
        // Control: the same blocks summed left to right over the whole row differ somewhere.
        for c in 0..NA {
            for r in 0..rows {
                let seq: f32 = (0..cut.blocks).fold(0.0, |s, b| s + resin_cpu::kernels::canon::canon_block(ty, &wbytes[r * rb..(r + 1) * rb], b, &acts[c]));
                control_differs |= seq.to_bits() != want[c * rows + r].to_bits();
            }
        }
        // The canonical norm: u = x * w_norm quantized, r from the canonical sum of squares;
        // folded into one-row products, and by normpack ahead of an 8-row product, which must
        // give each row the same bits.
        if !mv_fits(&h.gpu.info, 1, cols as u32, true, false) {
            eprintln!("mv {ty} {rows}x{cols}: no folded norm on this device (shared memory)");
            continue;
        }
        let nw = rng.vec(cols, 1.0);
        let eps = 1e-5f32;
        let nwb = h.buf_f32(&nw);
        let mut folded = Vec::new();
        for c in 0..8 {
            let xb = h.buf_f32(&xs[c * cols..(c + 1) * cols]);
            let y = h.poisoned(rows);
            let input = MvIn::Normed { x: (&xb).into(), w: (&nwb).into(), eps };
            h.run(|rec| rec.mv(Mv { ty, n: 1, w: (&wbuf).into(), input, out: MvOut::Store((&y).into()), shape }));
            folded.extend(y.read_f32(0, rows).unwrap());
        }
        // normpack of 16 rows (the first 8 those folded), then 8- and 16-row products.
        let (pk, l, rsb) = normpacked(&mut h, &xs[..16 * cols], cols, &nwb, eps);
        for n in [8usize, 16] {
            let y = h.poisoned(n * rows);
            let input = MvIn::NormPacked { x: (&pk).into(), layout: l, r: (&rsb).into() };
            h.run(|rec| rec.mv(Mv { ty, n: n as u32, w: (&wbuf).into(), input, out: MvOut::Store((&y).into()), shape }));
            let packed = y.read_f32(0, 8 * rows).unwrap();
            assert!(bits(&packed) == bits(&folded), "{ty} {rows}x{cols}: normpack and a {n}-row product differ from the rows folded one at a time");
        }
        let mut wq = vec![0f32; rows * cols];
        formats::dequantize(ty, &wbytes, &mut wq).unwrap();
        let mut worst = 0f64;
        for c in 0..8 {
            let x = &xs[c * cols..(c + 1) * cols];
            let u: Vec<f32> = x.iter().zip(&nw).map(|(a, b)| a * b).collect();
            let a = CanonActs::quantize(&u);
            let r = canon_rms_scale(canon_sumsq(x, &cut), cols, eps);
            for row in 0..rows {
                let want = r * canon_dot(ty, &wbytes[row * rb..(row + 1) * rb], &a, &cut);
                let got = folded[c * rows + row];
                // The quantization's and r's divisions and sqrt are each device's own (a few
                // ULP: a quant may round the other way): within 1e-4 of sum |w u| r.
                let scale: f64 = wq[row * cols..(row + 1) * cols].iter().zip(&u).map(|(w, u)| (w * u).abs() as f64).sum::<f64>() * r as f64;
                let err = (got - want).abs() as f64 / scale.max(1e-30);
                worst = worst.max(err);
                assert!(err < 1e-4, "{ty} {rows}x{cols} normed row {c}.{row}: {got} vs {want}");
            }
        }
        eprintln!("mv {ty} {rows}x{cols}: folded norm within {worst:.1e} of the reference");
    }
    assert!(control_differs, "{ty}: a left-to-right sum must differ from the canonical one somewhere");
    eprintln!("mv {ty}: {:.1} s", t0.elapsed().as_secs_f64());
}

#[test]
fn mv_q8_0() {
    mv_format(GgmlType::Q8_0);
}
#[test]
fn mv_q4_k() {
    mv_format(GgmlType::Q4_K);
}
#[test]
fn mv_q6_k() {
    mv_format(GgmlType::Q6_K);
}
#[test]
fn mv_q4_0() {
    mv_format(GgmlType::Q4_0);
}
#[test]
fn mv_q5_k() {
    mv_format(GgmlType::Q5_K);
}
#[test]
fn mv_q4_1() {
    mv_format(GgmlType::Q4_1);
}
#[test]
fn mv_q5_0() {
    mv_format(GgmlType::Q5_0);
}

/// The SwiGLU and GeGLU epilogues: gate and up rows in one buffer, act(g) * u packed for the
/// next matrix, against the reference (the exp is each home's: quants within one step);
/// normpack and an 8-row or a 33-row pass give each row the bits of that row folded alone; the
/// two activations' packs differ (the control that the epilogue takes its activation).
#[test]
fn mv_swiglu_packs_the_ffn_product() {
    let Some(mut h) = Harness::new() else { return };
    if !mv_ok(&h.gpu.info) {
        return;
    }
    let mut packs = Vec::new();
    for act in [FfnAct::Silu, FfnAct::GeluTanh] {
        packs.push(glu_packs(&mut h, act));
    }
    assert!(packs[0] != packs[1], "SwiGLU and GeGLU packed the same values");
}

/// One activation's run of `mv_swiglu_packs_the_ffn_product`; returns the 33-row packs.
fn glu_packs(h: &mut Harness, act: FfnAct) -> Vec<Vec<u32>> {
    let mut rng = Rng(0x5e1);
    let mut packs = Vec::new();
    for (ty, rows, cols) in [(GgmlType::Q8_0, 64usize, 576usize), (GgmlType::Q4_K, 96, 1024)] {
        assert!(mv_fits(&h.gpu.info, 1, cols as u32, true, true) && mv_fits(&h.gpu.info, 8, cols as u32, false, true), "{ty} {rows}x{cols}: the test's shape must fit the device");
        let cut = Cut::of(cols).unwrap();
        let gate = formats::quantize(ty, &rng.vec(rows * cols, 1.0)).unwrap();
        let up = formats::quantize(ty, &rng.vec(rows * cols, 1.0)).unwrap();
        let rb = gate.len() / rows;
        let (wbuf, row_bytes) = h.weights(ty, cols, &[gate.clone(), up.clone()].concat());
        const WIDE: usize = 33;
        let xs = rng.vec(WIDE * cols, 2.0);
        let nw = rng.vec(cols, 1.0);
        let nwb = h.buf_f32(&nw);
        let layout = QPack::new((WIDE * rows) as u32).unwrap();
        let shape = MvShape { rows: rows as u32, cols: cols as u32, row_bytes: row_bytes as u32, x_stride: cols as u32, y_stride: rows as u32, y_off: 0 };
        let up_off = (rows * row_bytes) as u32;
        // Each row folded alone, then the 8 rows by normpack and one product.
        let one_layout = QPack::new(rows as u32).unwrap();
        let mut ones = Vec::new();
        for c in 0..8 {
            let xc = h.buf_f32(&xs[c * cols..(c + 1) * cols]);
            let out = poisoned_words(h, one_layout.words() as usize);
            let input = MvIn::Normed { x: (&xc).into(), w: (&nwb).into(), eps: 1e-5 };
            let o = MvOut::SwiGlu { act, up_off, out: (&out).into(), layout: one_layout };
            h.run(|rec| rec.mv(Mv { ty, n: 1, w: (&wbuf).into(), input, out: o, shape }));
            ones.push(out.read_u32(0, one_layout.words() as usize).unwrap());
        }
        let (pk, xl, rsb) = normpacked(h, &xs, cols, &nwb, 1e-5);
        let (qw, nbk) = (rows / 4, rows / 32);
        let (d_off, s_off) = (layout.d_off() as usize, layout.s_off() as usize);
        let (d1, s1) = (one_layout.d_off() as usize, one_layout.s_off() as usize);
        let mut all = Vec::new();
        for n in [8usize, WIDE] {
            let out = poisoned_words(h, layout.words() as usize);
            let input = MvIn::NormPacked { x: (&pk).into(), layout: xl, r: (&rsb).into() };
            h.run(|rec| rec.mv(Mv { ty, n: n as u32, w: (&wbuf).into(), input, out: MvOut::SwiGlu { act, up_off, out: (&out).into(), layout }, shape }));
            all = out.read_u32(0, layout.words() as usize).unwrap();
            for (c, one) in ones.iter().enumerate() {
                let same = one[..qw] == all[c * qw..(c + 1) * qw]
                    && one[d1..d1 + nbk] == all[d_off + c * nbk..d_off + (c + 1) * nbk]
                    && one[s1..s1 + nbk] == all[s_off + c * nbk..s_off + (c + 1) * nbk];
                assert!(same, "{ty} row {c}: normpack and a {n}-row product differ from the row folded alone");
            }
        }
        for c in 0..WIDE {
            let x = &xs[c * cols..(c + 1) * cols];
            let u: Vec<f32> = x.iter().zip(&nw).map(|(a, b)| a * b).collect();
            let a = CanonActs::quantize(&u);
            let r = canon_rms_scale(canon_sumsq(x, &cut), cols, 1e-5);
            let hv: Vec<f32> = (0..rows)
                .map(|i| {
                    let g = r * canon_dot(ty, &gate[i * rb..(i + 1) * rb], &a, &cut);
                    let u = r * canon_dot(ty, &up[i * rb..(i + 1) * rb], &a, &cut);
                    match act {
                        FfnAct::Silu => g / (1.0 + (-g).exp()) * u,
                        FfnAct::GeluTanh => 0.5 * g * (1.0 + (0.797_884_6 * g * (1.0 + 0.044_715 * g * g)).tanh()) * u,
                    }
                })
                .collect();
            let want = CanonActs::quantize(&hv);
            for b in 0..rows / 32 {
                let d = f32::from_bits(all[d_off + c * rows / 32 + b]);
                assert!((d - want.d[b]).abs() <= 1e-5 * want.d[b].abs(), "{ty} col {c} block {b}: d {d} vs {}", want.d[b]);
                let mut s = 0i32;
                for i in 0..32 {
                    let v = c * rows + b * 32 + i;
                    let q = ((all[v / 4] >> (8 * (v % 4))) & 0xFF) as u8 as i8 as i32;
                    s += q;
                    assert!((q - want.q[b * 32 + i] as i32).abs() <= 1, "{ty} col {c} value {}: q {q} vs {}", b * 32 + i, want.q[b * 32 + i]);
                }
                assert_eq!(all[s_off + c * rows / 32 + b] as i32, s, "{ty} col {c} block {b}: the sum of the quants");
            }
        }
        packs.push(all);
    }
    packs
}

/// Experts of the grouped product's tests, chosen a row.
const NE: usize = 8;
const KU: usize = 2;

/// A step's expert ids, slot r * KU + j: every row's first slot expert 0 (40 slots, past one
/// 32-column tile), row 0's second expert 7 (its only slot), the others' spread over 1..=6.
fn expert_ids(n: usize) -> Vec<u32> {
    (0..n).flat_map(|r| [0u32, if r == 0 { 7 } else { 1 + (r as u32 * 3) % 6 }]).collect()
}

/// moe_group's lists on the host: an offset an expert and the total, then each expert's slots
/// in slot order.
fn group_host(sel: &[u32]) -> Vec<u32> {
    let mut w = Vec::new();
    let mut lists = Vec::new();
    for e in 0..NE as u32 {
        w.push(lists.len() as u32);
        lists.extend((0..sel.len() as u32).filter(|&s| sel[s as usize] == e));
    }
    w.push(lists.len() as u32);
    w.extend(lists);
    let mut chosen: Vec<u32> = (0..NE as u32).filter(|e| sel.contains(e)).collect();
    chosen.resize(moe_active_entries(NE as u32, sel.len() as u32) as usize, MOE_NO_EXPERT);
    w.extend(chosen);
    w
}

/// One step of `n` rows of the grouped expert product's test (see there); a left-to-right
/// sum differing from the product's anywhere sets `control_differs`.
fn expert_step(h: &mut Harness, rng: &mut Rng, n: usize, control_differs: &mut bool) {
    let sel = expert_ids(n);
    let slots = n * KU;
    let want_grp = group_host(&sel);
    let selb = h.buf_bytes(&u32_bytes(&sel));
    let grp = poisoned_words(h, want_grp.len());
    h.run(|rec| rec.moe_group(slots as u32, NE as u32, (&selb).into(), (&grp).into()));
    assert_eq!(grp.read_u32(0, want_grp.len()).unwrap(), want_grp, "moe_group's lists are not the slots in slot order");
    for (ty, per, cols) in [(GgmlType::Q8_0, 64usize, 576usize), (GgmlType::Q4_K, 96, 1024), (GgmlType::Q6_K, 32, 2048)] {
        let cut = Cut::of(cols).unwrap();
        let gate = formats::quantize(ty, &rng.vec(NE * per * cols, 1.0)).unwrap();
        let up = formats::quantize(ty, &rng.vec(NE * per * cols, 1.0)).unwrap();
        let rb = gate.len() / (NE * per);
        let (wbuf, row_bytes) = h.weights(ty, cols, &gate);
        let shape = MvShape { rows: per as u32, cols: cols as u32, row_bytes: row_bytes as u32, x_stride: cols as u32, y_stride: per as u32, y_off: 0 };
        let wrow = |s: usize, i: usize| {
            let r = sel[s] as usize * per + i;
            &gate[r * rb..(r + 1) * rb]
        };
        // Gate/up: slot s reads row s / KU; down: slot s its own row.
        for x_div in [KU, 1] {
            let nx = slots / x_div;
            let xs = rng.vec(nx * cols, 2.0);
            let acts: Vec<CanonActs> = (0..nx).map(|c| CanonActs::quantize(&xs[c * cols..(c + 1) * cols])).collect();
            let want: Vec<f32> = (0..slots).flat_map(|s| (0..per).map(|i| canon_dot(ty, wrow(s, i), &acts[s / x_div], &cut)).collect::<Vec<_>>()).collect();
            let pk = h.buf_bytes(&u32_bytes(&pack_host(&acts)));
            let layout = QPack::new((nx * cols) as u32).unwrap();
            for tier in tiers(h) {
                let y = h.poisoned((slots + 1) * per);
                let ex = Experts { n_expert: NE as u32, used: KU as u32, x_div: x_div as u32, groups: (&grp).into(), combine: None };
                let m = Mv { ty, n: n as u32, w: (&wbuf).into(), input: MvIn::Packed { x: (&pk).into(), layout }, out: MvOut::Store((&y).into()), shape };
                h.run(|rec| rec.mv_experts_tier(tier, m, ex));
                let got = y.read_f32(0, (slots + 1) * per).unwrap();
                for (s, e) in sel.iter().enumerate() {
                    let at = s * per..(s + 1) * per;
                    assert!(bits(&got[at.clone()]) == bits(&want[at]), "{tier:?} {ty} x_div {x_div}: slot {s} (expert {e}) is not the reference's bits");
                }
                assert!(got[slots * per..].iter().all(|v| v.to_bits() == POISON), "{tier:?} {ty}: wrote past the slots");
                if x_div == 1 && n <= 8 {
                    check_combine(h, (tier, m, ex), &got[..slots * per], rng, n, per);
                }
            }
            for s in 0..slots {
                for i in 0..per {
                    let seq: f32 = (0..cut.blocks).fold(0.0, |a, b| a + resin_cpu::kernels::canon::canon_block(ty, wrow(s, i), b, &acts[s / x_div]));
                    *control_differs |= seq.to_bits() != want[s * per + i].to_bits();
                }
            }
        }
        // SwiGLU over normpacked rows: each slot's packed block is the plain product's of its
        // row through its expert's gate and up (all n rows at once, an expert at a time).
        let (gubuf, _) = h.weights(ty, cols, &[gate.clone(), up.clone()].concat());
        let up_off = (NE * per * row_bytes) as u32;
        let nwb = h.buf_f32(&rng.vec(cols, 1.0));
        let xs = rng.vec(n * cols, 2.0);
        let (pk, xl, rsb) = normpacked(h, &xs, cols, &nwb, 1e-6);
        let input = MvIn::NormPacked { x: (&pk).into(), layout: xl, r: (&rsb).into() };
        let (ol, pl) = (QPack::new((slots * per) as u32).unwrap(), QPack::new((n * per) as u32).unwrap());
        let out = poisoned_words(h, ol.words() as usize);
        let ex = Experts { n_expert: NE as u32, used: KU as u32, x_div: KU as u32, groups: (&grp).into(), combine: None };
        h.run(|rec| rec.mv_experts(Mv { ty, n: n as u32, w: (&gubuf).into(), input, out: MvOut::SwiGlu { act: FfnAct::Silu, up_off, out: (&out).into(), layout: ol }, shape }, ex));
        let got = out.read_u32(0, ol.words() as usize).unwrap();
        // The same packs with the blocks' sums of squares (what AddPack writes) instead of r
        // (token commands only: up to 8 rows).
        if n <= 8 {
            let ss: Vec<f32> = xs.chunks(32).map(|b| b.iter().fold(0f32, |a, v| a + v * v)).collect();
            let ssb = h.buf_f32(&ss);
            let out_ss = poisoned_words(h, ol.words() as usize);
            let input_ss = MvIn::PackedSs { x: (&pk).into(), layout: xl, ss: (&ssb).into(), eps: 1e-6 };
            h.run(|rec| {
                rec.mv_experts(
                    Mv { ty, n: n as u32, w: (&gubuf).into(), input: input_ss, out: MvOut::SwiGlu { act: FfnAct::Silu, up_off, out: (&out_ss).into(), layout: ol }, shape },
                    ex,
                )
            });
            assert_eq!(out_ss.read_u32(0, ol.words() as usize).unwrap(), got, "{ty}: the experts' SwiGLU over the sums of squares differs from it over normpack's r");
        }
        let mut checked = 0;
        for e in 0..NE {
            let w = Bind { buf: &gubuf, offset: (e * per * row_bytes) as u64, range: gubuf.size - (e * per * row_bytes) as u64 };
            let plain = poisoned_words(h, pl.words() as usize);
            h.run(|rec| rec.mv(Mv { ty, n: n as u32, w, input, out: MvOut::SwiGlu { act: FfnAct::Silu, up_off, out: (&plain).into(), layout: pl }, shape }));
            let plain = plain.read_u32(0, pl.words() as usize).unwrap();
            let (qw, nb) = (per / 4, per / 32);
            for s in (0..slots).filter(|&s| sel[s] as usize == e) {
                let r = s / KU;
                let same = got[s * qw..(s + 1) * qw] == plain[r * qw..(r + 1) * qw]
                    && got[ol.d_off() as usize + s * nb..][..nb] == plain[pl.d_off() as usize + r * nb..][..nb]
                    && got[ol.s_off() as usize + s * nb..][..nb] == plain[pl.s_off() as usize + r * nb..][..nb];
                assert!(same, "{ty}: slot {s}'s SwiGLU (expert {e}) differs from row {r}'s plain product through its expert");
                checked += 1;
            }
        }
        assert_eq!(checked, slots);
    }
}

/// The down of a token command's experts with the slots' sum (`Experts::combine`, mv.comp
/// OUT 3, and OUT 4 adding it to a residual): the same slot rows as the product alone
/// (`slots_y`), and each row's sum the bits moe_combine writes from them and the host's sum
/// in rank order (added to the residual's value: the host's f32 add), nothing written past
/// the rows, the counters left zero. OUT 6 (the add, then the next norm's input packed,
/// `Combine::pack`, where the rows are whole 32-value blocks): the same residual, the packs
/// the bits normpack writes from it, each block's sum of squares x's left to right, the
/// counters left zero; control: normpack of the residual before the add differs.
fn check_combine(h: &mut Harness, (tier, m, ex): (DotTier, Mv<'_>, Experts<'_>), slots_y: &[f32], rng: &mut Rng, n: usize, per: usize) {
    let slots = n * KU;
    let wt: Vec<f32> = rng.vec(slots, 1.0).iter().map(|v| v.abs()).collect();
    let wtb = h.buf_f32(&wt);
    let sums: Vec<f32> = (0..n * per)
        .map(|e| {
            let (r, i) = (e / per, e % per);
            (0..KU).fold(0f32, |a, j| a + wt[r * KU + j] * slots_y[(r * KU + j) * per + i])
        })
        .collect();
    let what = format!("{tier:?} {} n {n}", m.ty);
    let sep = h.poisoned(n * per);
    let y = h.poisoned((slots + 1) * per);
    for add in [false, true] {
        let resid = rng.vec(n * per + 1, 4.0);
        let out = if add { h.buf_f32(&resid) } else { h.poisoned(n * per + 1) };
        let done = h.buf_bytes(&vec![0u8; per * 4]);
        let combine = Combine { wt: (&wtb).into(), out: (&out).into(), done: (&done).into(), add, pack: None };
        h.run(|rec| rec.mv_experts_tier(tier, Mv { out: MvOut::Store((&y).into()), ..m }, Experts { combine: Some(combine), ..ex }));
        assert!(bits(&y.read_f32(0, slots * per).unwrap()) == bits(slots_y), "{what}: the slot rows differ with the sum");
        let got = out.read_f32(0, n * per + 1).unwrap();
        let want: Vec<f32> = if add { sums.iter().zip(&resid).map(|(s, x)| x + s).collect() } else { sums.clone() };
        assert!(bits(&got[..n * per]) == bits(&want), "{what} add {add}: the rows' sums are not the host's in rank order");
        let past = if add { resid[n * per].to_bits() } else { POISON };
        assert_eq!(got[n * per].to_bits(), past, "{what}: wrote past the sums");
        assert!(done.read_u32(0, per).unwrap().iter().all(|&c| c == 0), "{what}: a counter was left set");
    }
    h.run(|rec| rec.moe_combine(n as u32, per as u32, KU as u32, (&wtb).into(), (&y).into(), (&sep).into()));
    assert!(bits(&sep.read_f32(0, n * per).unwrap()) == bits(&sums), "{what}: the sums differ from moe_combine's");
    if !per.is_multiple_of(32) {
        return;
    }
    let resid = rng.vec(n * per, 4.0);
    let want: Vec<f32> = sums.iter().zip(&resid).map(|(s, x)| x + s).collect();
    let nw = h.buf_f32(&rng.vec(per, 1.0));
    let layout = QPack::new((n * per) as u32).unwrap();
    let nb = per / 32;
    let (pk_np, _, _) = normpacked(h, &want, per, &nw, 1e-5);
    let (pk_before, _, _) = normpacked(h, &resid, per, &nw, 1e-5);
    let out = h.buf_f32(&resid);
    let (pk, ss, done) = (poisoned_words(h, layout.words() as usize), h.poisoned(n * nb), h.buf_bytes(&vec![0u8; (per + nb) * 4]));
    let pack = PackNext { norm: (&nw).into(), layout, out: (&pk).into(), ss: (&ss).into() };
    let combine = Combine { wt: (&wtb).into(), out: (&out).into(), done: (&done).into(), add: true, pack: Some(pack) };
    h.run(|rec| rec.mv_experts_tier(tier, Mv { out: MvOut::Store((&y).into()), ..m }, Experts { combine: Some(combine), ..ex }));
    assert!(bits(&out.read_f32(0, n * per).unwrap()) == bits(&want), "{what}: the residual with the pack differs from the add's");
    let words = layout.words() as usize;
    let got = pk.read_u32(0, words).unwrap();
    assert_eq!(got, pk_np.read_u32(0, words).unwrap(), "{what}: the packs differ from normpack's of the sums");
    assert_ne!(got, pk_before.read_u32(0, words).unwrap(), "control: the packs equal normpack's of the residual before the add");
    let ss_host: Vec<f32> = want.chunks(32).map(|b| b.iter().fold(0f32, |a, v| a + v * v)).collect();
    assert!(bits(&ss.read_f32(0, n * nb).unwrap()) == bits(&ss_host), "{what}: the blocks' sums of squares differ");
    assert!(done.read_u32(0, per + nb).unwrap().iter().all(|&c| c == 0), "{what}: a counter was left set");
}

/// The grouped expert product (mv.comp EXPERT for steps of up to 8 rows, mm.comp EXPERT for
/// more) against the reference bit for bit: the slot lists moe_group writes, each slot through its expert's rows with its row's activations
/// (gate/up: a row's slots share it) or its own (down), in every tier, outputs poisoned and
/// nothing written past the slots; the SwiGLU epilogue over normpacked rows gives each slot
/// the bits the plain product gives its row through its expert alone; refusals; a control
/// that sums the blocks left to right must differ.
#[test]
fn mv_experts_group_slots_canonically() {
    let Some(mut h) = Harness::new() else { return };
    if !mv_ok(&h.gpu.info) {
        return;
    }
    let mut rng = Rng(0xe47);
    let mut control_differs = false;
    // One row (each expert one slot or none), 6 (mv.comp: expert 0 takes every row), 40
    // (mm.comp: expert 0's slots past a tile of 32, expert 7's one).
    for n in [1usize, 6, 40] {
        expert_step(&mut h, &mut rng, n, &mut control_differs);
    }
    assert!(control_differs, "a left-to-right sum must differ from the canonical one somewhere");
    // Refusals: x_div neither 1 nor the slots a row; lists too short for the slots.
    let (w, x, y) = (h.buf_bytes(&[0u8; 4096]), h.buf_bytes(&[0u8; 4096]), h.poisoned(64));
    let shape = MvShape { rows: 32, cols: 32, row_bytes: 34, x_stride: 32, y_stride: 32, y_off: 0 };
    let m = Mv { ty: GgmlType::Q8_0, n: 2, w: (&w).into(), input: MvIn::Packed { x: (&x).into(), layout: QPack::new(64).unwrap() }, out: MvOut::Store((&y).into()), shape };
    let short = h.buf_bytes(&[0u8; 8]);
    let grp = h.buf_bytes(&u32_bytes(&group_host(&expert_ids(2))));
    for (x_div, groups) in [(3u32, Bind::from(&grp)), (1, Bind::from(&short))] {
        let ex = Experts { n_expert: NE as u32, used: KU as u32, x_div, groups, combine: None };
        assert!(h.try_run(|rec| rec.mv_experts(m, ex)).is_err(), "x_div {x_div}, {} bytes of lists: refused", groups.range);
    }
}

/// The N-row product that adds into the residual and packs the next norm's input
/// (`MvOut::AddPack`, mv.comp OUT 5), in two parts (the second from row 512), for 2, 5 and 8
/// rows of three formats in every tier: the residual the bits `MvOut::Add` leaves, the packs
/// the bits `normpack` writes from it, the counters left zero; and a product reading them
/// with the blocks' sums of squares (`MvIn::PackedSs`) the bits it gives over `normpack`'s
/// packs and r. Control: the same product with two rows' sums of squares swapped must differ.
#[test]
fn add_pack_writes_what_normpack_would() {
    let Some(mut h) = Harness::new() else { return };
    if !mv_ok(&h.gpu.info) {
        return;
    }
    let mut rng = Rng(0xadd9);
    let (d, k) = (1024usize, 512usize);
    const EPS: f32 = 0.5;
    let mut control_differs = false;
    for (ty, n) in [(GgmlType::Q8_0, 2usize), (GgmlType::Q4_K, 5), (GgmlType::Q6_K, 8)] {
        let wq = formats::quantize(ty, &rng.vec(d * k, 1.0)).unwrap();
        let (wb, row_bytes) = h.weights(ty, k, &wq);
        let xs = rng.vec(n * k, 2.0);
        let acts: Vec<CanonActs> = (0..n).map(|c| CanonActs::quantize(&xs[c * k..(c + 1) * k])).collect();
        let (xl, pkx) = (QPack::new((n * k) as u32).unwrap(), h.buf_bytes(&u32_bytes(&pack_host(&acts))));
        let resid = rng.vec(n * d, 4.0);
        let nw = h.buf_f32(&rng.vec(d, 1.0));
        let layout = QPack::new((n * d) as u32).unwrap();
        let nb = d / 32;
        // The second matrix: K = d, reading the normed residual.
        let w2q = formats::quantize(ty, &rng.vec(256 * d, 1.0)).unwrap();
        let (w2, rb2) = h.weights(ty, d, &w2q);
        let shape2 = MvShape { rows: 256, cols: d as u32, row_bytes: rb2 as u32, x_stride: d as u32, y_stride: 256, y_off: 0 };
        for tier in tiers(&h) {
            let what = format!("{tier:?} {ty} n {n}");
            let parts = |y: &Buffer| [0u32, 512].map(|r0| (Bind { buf: &wb, offset: r0 as u64 * row_bytes as u64, range: wb.size - r0 as u64 * row_bytes as u64 }, r0, y.size));
            let shape = |r0: u32| MvShape { rows: 512, cols: k as u32, row_bytes: row_bytes as u32, x_stride: k as u32, y_stride: d as u32, y_off: r0 };
            let input = MvIn::Packed { x: (&pkx).into(), layout: xl };
            // Add, then normpack of the sums.
            let plain = h.buf_f32(&resid);
            for (w, r0, _) in parts(&plain) {
                h.run(|rec| rec.mv_tier(tier, Mv { ty, n: n as u32, w, input, out: MvOut::Add((&plain).into()), shape: shape(r0) }));
            }
            let sums = plain.read_f32(0, n * d).unwrap();
            // An eps that moves r's bits (the sums' mean square is in the hundreds).
            let (pk_np, _, r_np) = normpacked(&mut h, &sums, d, &nw, EPS);
            // Add and pack.
            let y = h.buf_f32(&resid);
            let (pk, ss, done) = (poisoned_words(&h, layout.words() as usize), h.poisoned(n * nb), h.buf_bytes(&vec![0u8; nb * 4]));
            for (w, r0, _) in parts(&y) {
                let out = MvOut::AddPack { y: (&y).into(), norm: (&nw).into(), layout, out: (&pk).into(), ss: (&ss).into(), done: (&done).into() };
                h.run(|rec| rec.mv_tier(tier, Mv { ty, n: n as u32, w, input, out, shape: shape(r0) }));
            }
            assert!(bits(&y.read_f32(0, n * d).unwrap()) == bits(&sums), "{what}: the residual differs from Add's");
            assert_eq!(pk.read_u32(0, layout.words() as usize).unwrap(), pk_np.read_u32(0, layout.words() as usize).unwrap(), "{what}: the packs differ from normpack's");
            assert!(done.read_u32(0, nb).unwrap().iter().all(|&c| c == 0), "{what}: a counter was left set");
            // The next product over both inputs.
            let next = |h: &mut Harness, input: MvIn<'_>| {
                let out = h.poisoned(n * 256);
                h.run(|rec| rec.mv_tier(tier, Mv { ty, n: n as u32, w: (&w2).into(), input, out: MvOut::Store((&out).into()), shape: shape2 }));
                bits(&out.read_f32(0, n * 256).unwrap())
            };
            let want = next(&mut h, MvIn::NormPacked { x: (&pk_np).into(), layout, r: (&r_np).into() });
            assert!(next(&mut h, MvIn::PackedSs { x: (&pk).into(), layout, ss: (&ss).into(), eps: EPS }) == want, "{what}: the product over the sums of squares differs");
            let mut sw = ss.read_f32(0, n * nb).unwrap();
            let (a, b) = sw.split_at_mut(nb);
            a.swap_with_slice(&mut b[..nb]);
            let swapped = h.buf_f32(&sw);
            control_differs |= next(&mut h, MvIn::PackedSs { x: (&pk).into(), layout, ss: (&swapped).into(), eps: EPS }) != want;
        }
    }
    assert!(control_differs, "control: two rows' sums of squares swapped gave the same products");
}

/// normpack with the residual add: x += add written back, then the packs and r of the sum,
/// the bits normpack gives that sum without the add.
#[test]
fn normpack_adds_the_residual_first() {
    let Some(mut h) = Harness::new() else { return };
    let mut rng = Rng(0x7a2);
    let (rows, cols) = (3usize, 2048usize);
    let (x, add, nw) = (rng.vec(rows * cols, 2.0), rng.vec(rows * cols, 2.0), rng.vec(cols, 1.0));
    let sum: Vec<f32> = x.iter().zip(&add).map(|(a, b)| a + b).collect();
    let layout = QPack::new((rows * cols) as u32).unwrap();
    let nwb = h.buf_f32(&nw);
    let mut runs = Vec::new();
    for fused in [true, false] {
        let xb = h.buf_f32(if fused { &x } else { &sum });
        let ab = h.buf_f32(&add);
        let (pk, rsb) = (poisoned_words(&h, layout.words() as usize), h.poisoned(rows));
        h.run(|rec| rec.normpack(rows as u32, cols as u32, 1e-5, (&xb).into(), fused.then(|| (&ab).into()), (&nwb).into(), layout, (&pk).into(), (&rsb).into()));
        assert!(bits(&xb.read_f32(0, rows * cols).unwrap()) == bits(&sum), "fused {fused}: x is not x + add");
        runs.push((pk.read_u32(0, layout.words() as usize).unwrap(), bits(&rsb.read_f32(0, rows).unwrap())));
    }
    assert!(runs[0] == runs[1], "normpack with the add differs from normpack of the sum");
    // The packs are the reference's quantization of u = x * w (d and the quants within the
    // device's division; r within a few ULP).
    let want: Vec<CanonActs> = (0..rows).map(|c| CanonActs::quantize(&sum[c * cols..(c + 1) * cols].iter().zip(&nw).map(|(a, b)| a * b).collect::<Vec<f32>>())).collect();
    let host = pack_host(&want);
    let differ = runs[0].0.iter().zip(&host).filter(|(a, b)| a != b).count();
    assert!(differ <= runs[0].0.len() / 100, "{differ} of {} packed words differ from the reference", host.len());
    for c in 0..rows {
        let r = canon_rms_scale(canon_sumsq(&sum[c * cols..(c + 1) * cols], &Cut::of(cols).unwrap()), cols, 1e-5);
        let got = f32::from_bits(runs[0].1[c]);
        assert!((got - r).abs() <= 4.0 * f32::EPSILON * r, "row {c}: r {got} vs {r}");
    }
}

/// normpack_xn (a mixture of experts' norm): the packs, r and x of normpack, with and without
/// the residual add, and the normed rows (x * r) * w in f32 with that r, bit for bit.
/// Control: x * (r * w), rounded otherwise, differs somewhere.
#[test]
fn normpack_writes_the_normed_rows_beside_the_packs() {
    let Some(mut h) = Harness::new() else { return };
    let mut rng = Rng(0x7a4);
    let (rows, cols) = (3usize, 2048usize);
    let (x, add, nw) = (rng.vec(rows * cols, 2.0), rng.vec(rows * cols, 2.0), rng.vec(cols, 1.0));
    let sum: Vec<f32> = x.iter().zip(&add).map(|(a, b)| a + b).collect();
    let layout = QPack::new((rows * cols) as u32).unwrap();
    let nwb = h.buf_f32(&nw);
    let mut control_differs = false;
    for fused in [true, false] {
        let mut runs = Vec::new();
        for with_xn in [false, true] {
            let xb = h.buf_f32(if fused { &x } else { &sum });
            let ab = h.buf_f32(&add);
            let (pk, rsb, xn) = (poisoned_words(&h, layout.words() as usize), h.poisoned(rows), h.poisoned(rows * cols));
            let add = fused.then(|| (&ab).into());
            if with_xn {
                h.run(|rec| rec.normpack_xn(rows as u32, cols as u32, 1e-5, (&xb).into(), add, (&nwb).into(), layout, ((&pk).into(), (&rsb).into()), Some((&xn).into())));
            } else {
                h.run(|rec| rec.normpack(rows as u32, cols as u32, 1e-5, (&xb).into(), add, (&nwb).into(), layout, (&pk).into(), (&rsb).into()));
            }
            assert!(bits(&xb.read_f32(0, rows * cols).unwrap()) == bits(&sum), "fused {fused}: x is not x + add");
            let rv = rsb.read_f32(0, rows).unwrap();
            if with_xn {
                let got = xn.read_f32(0, rows * cols).unwrap();
                for (i, g) in got.iter().enumerate() {
                    let (c, k) = (i / cols, i % cols);
                    let want = (sum[i] * rv[c]) * nw[k];
                    assert_eq!(g.to_bits(), want.to_bits(), "fused {fused}: normed value {k} of row {c}: {g} vs {want}");
                    control_differs |= g.to_bits() != (sum[i] * (rv[c] * nw[k])).to_bits();
                }
            }
            runs.push((pk.read_u32(0, layout.words() as usize).unwrap(), bits(&rv)));
        }
        assert!(runs[0] == runs[1], "fused {fused}: normpack_xn's packs or r differ from normpack's");
    }
    assert!(control_differs, "control: x * (r * w) must differ from (x * r) * w somewhere");
}

/// normpack with a post-normed add (gemma3): x += rmsnorm(add) * w_post folded in gives the
/// bits of the post-norm's own dispatch (rmsnorm into a buffer, then normpack with that add):
/// x written back and the packs and r. Control: the add without its post-norm differs.
#[test]
fn normpack_folds_the_post_norm() {
    let Some(mut h) = Harness::new() else { return };
    let mut rng = Rng(0x7a3);
    let (rows, cols) = (3usize, 640usize);
    let (x, add, nw, wp) = (rng.vec(rows * cols, 2.0), rng.vec(rows * cols, 3.0), rng.vec(cols, 1.0), rng.vec(cols, 1.0));
    let layout = QPack::new((rows * cols) as u32).unwrap();
    let (nwb, wpb, ab) = (h.buf_f32(&nw), h.buf_f32(&wp), h.buf_f32(&add));
    let np = NormPush { n: cols as u32, eps: 1e-6 };
    let mut runs = Vec::new();
    for how in ["folded", "dispatch", "control"] {
        let xb = h.buf_f32(&x);
        let spare = h.poisoned(rows * cols);
        let (pk, rsb) = (poisoned_words(&h, layout.words() as usize), h.poisoned(rows));
        h.run(|rec| {
            let add = match how {
                "folded" => NormAdd { y: (&ab).into(), post: Some((&wpb).into()) },
                "dispatch" => {
                    rec.rmsnorm(rows as u32, (&ab).into(), None, (&wpb).into(), (&spare).into(), np)?;
                    rec.barrier();
                    NormAdd::from(&spare)
                }
                _ => NormAdd::from(&ab),
            };
            rec.normpack(rows as u32, cols as u32, np.eps, (&xb).into(), Some(add), (&nwb).into(), layout, (&pk).into(), (&rsb).into())
        });
        runs.push((bits(&xb.read_f32(0, rows * cols).unwrap()), pk.read_u32(0, layout.words() as usize).unwrap(), bits(&rsb.read_f32(0, rows).unwrap())));
    }
    assert!(runs[0] == runs[1], "the folded post-norm differs from its own dispatch");
    assert!(runs[0] != runs[2], "control: the add without its post-norm gave the same bits");
}

#[test]
fn mv_refusals() {
    let Some(mut h) = Harness::new() else { return };
    if !mv_ok(&h.gpu.info) {
        return;
    }
    let w = h.buf_bytes(&[0u8; 1024]);
    let x = h.buf_bytes(&[0u8; 4096]);
    let y = h.poisoned(64);
    let l = QPack::new(512).unwrap();
    let shape = MvShape { rows: 1, cols: 256, row_bytes: 144, x_stride: 256, y_stride: 1, y_off: 0 };
    let packed = MvIn::Packed { x: (&x).into(), layout: l };
    let gpu = h.gpu.clone();
    let mut errs = Vec::new();
    resin_vulkan::buffers::submit_once(&gpu, |cmd| {
        let mut rec = resin_vulkan::kernels::Recorder::new(&gpu, &mut h.pipes, &mut h.desc, cmd);
        let mv = |ty, n, input, out, shape| Mv { ty, n, w: (&w).into(), input, out, shape };
        let store = MvOut::Store((&y).into());
        // F16 has no canonical product; no rows; more rows than packed (at mv.comp's and
        // mm.comp's widths); rows of 48 values; a SwiGLU of 1 row (not whole 32-row blocks).
        errs.push(rec.mv(mv(GgmlType::F16, 1, packed, store, shape)).is_err());
        errs.push(rec.mv(mv(GgmlType::Q4_K, 0, packed, store, shape)).is_err());
        errs.push(rec.mv(mv(GgmlType::Q4_K, 9, packed, store, shape)).is_err());
        errs.push(rec.mv(mv(GgmlType::Q4_K, 3, packed, store, shape)).is_err());
        errs.push(rec.mv(mv(GgmlType::Q8_0, 1, packed, store, MvShape { cols: 48, x_stride: 64, ..shape })).is_err());
        errs.push(rec.mv(mv(GgmlType::Q4_K, 1, packed, MvOut::SwiGlu { act: FfnAct::Silu, up_off: 144, out: (&x).into(), layout: l }, shape)).is_err());
        // A folded norm of 3 rows or of 9 (one row only: more take normpack); a SwiGLU of 9
        // rows of 1 weight row.
        errs.push(rec.mv(mv(GgmlType::Q4_K, 3, MvIn::Normed { x: (&x).into(), w: (&x).into(), eps: 1e-5 }, store, shape)).is_err());
        errs.push(rec.mv(mv(GgmlType::Q4_K, 9, MvIn::Normed { x: (&x).into(), w: (&x).into(), eps: 1e-5 }, store, shape)).is_err());
        let l16 = QPack::new(16 * 256).unwrap();
        let x16 = MvIn::Packed { x: (&x).into(), layout: l16 };
        errs.push(rec.mv(mv(GgmlType::Q4_K, 9, x16, MvOut::SwiGlu { act: FfnAct::Silu, up_off: 144, out: (&x).into(), layout: l16 }, shape)).is_err());
    })
    .unwrap();
    assert!(errs.iter().all(|e| *e), "{errs:?}");
}

/// Wall time of 100 one-row products over matrices larger than the H200's L2 (random bytes:
/// timing only), each as GB/s of weights. `cargo test --release --test mv -- --ignored --nocapture`.
#[test]
#[ignore]
fn mv_speed() {
    let Some(mut h) = Harness::new() else { return };
    if !mv_ok(&h.gpu.info) {
        return;
    }
    let reps = 100u32;
    for (ty, rows, cols) in [
        (GgmlType::Q8_0, 32768usize, 4096usize),
        (GgmlType::Q8_0, 8192, 2048),
        (GgmlType::Q8_0, 2048, 8192),
        (GgmlType::Q4_K, 32768, 8192),
        (GgmlType::Q6_K, 32768, 8192),
        (GgmlType::Q4_K, 8192, 3072),
        (GgmlType::Q4_K, 3072, 8192),
        (GgmlType::Q6_K, 3072, 8192),
    ] {
        let bb = ty.block_bytes();
        let gguf_row = cols / ty.block_len() * bb;
        let mut rng = Rng(9);
        let mut wbytes: Vec<u8> = (0..rows * gguf_row / 8).flat_map(|_| rng.next_u64().to_le_bytes()).collect();
        wbytes.iter_mut().skip(1).step_by(2).for_each(|b| *b &= 0x3B);
        let (wbuf, row_bytes) = h.weights(ty, cols, &wbytes);
        for n in [1u32, 8] {
            let acts: Vec<CanonActs> = (0..n).map(|_| CanonActs::quantize(&rng.vec(cols, 1.0))).collect();
            let pk = h.buf_bytes(&u32_bytes(&pack_host(&acts)));
            let layout = QPack::new(n * cols as u32).unwrap();
            let y = h.poisoned(n as usize * rows);
            let shape = MvShape { rows: rows as u32, cols: cols as u32, row_bytes: row_bytes as u32, x_stride: cols as u32, y_stride: rows as u32, y_off: 0 };
            let input = MvIn::Packed { x: (&pk).into(), layout };
            let us = h.time_chained(reps, &mut |rec| rec.mv(Mv { ty, n, w: (&wbuf).into(), input, out: MvOut::Store((&y).into()), shape }));
            let gbs = (rows * row_bytes) as f64 / us / 1e3;
            eprintln!("mv {ty} {rows}x{cols} n={n}: {us:.1} us, {gbs:.0} GB/s");
            if cols <= 4096 && mv_fits(&h.gpu.info, n, cols as u32, true, false) {
                let (xb, nwb) = (h.buf_f32(&rng.vec(n as usize * cols, 1.0)), h.buf_f32(&rng.vec(cols, 1.0)));
                let input = MvIn::Normed { x: (&xb).into(), w: (&nwb).into(), eps: 1e-5 };
                let us = h.time_chained(reps, &mut |rec| rec.mv(Mv { ty, n, w: (&wbuf).into(), input, out: MvOut::Store((&y).into()), shape }));
                eprintln!("mv {ty} {rows}x{cols} n={n} normed: {us:.1} us, {:.0} GB/s", (rows * row_bytes) as f64 / us / 1e3);
            }
        }
    }
}

/// Where a one-row folded norm and normpack part: the products of the same rows folded
/// (`Normed`, one row), normpacked one row at a time and normpacked eight at once, and
/// normpack's r and packs against the host reference. Prints what differs; fails on any.
#[test]
fn fold_and_normpack_agree() {
    let Some(mut h) = Harness::new() else { return };
    if !mv_ok(&h.gpu.info) {
        return;
    }
    let mut rng = Rng(0x9b3);
    let mut bad = Vec::new();
    for (ty, rows, cols) in [(GgmlType::Q8_0, 64usize, 2048usize), (GgmlType::Q4_K, 64, 3072)] {
        let wbytes = formats::quantize(ty, &rng.vec(rows * cols, 1.0)).unwrap();
        let (wbuf, row_bytes) = h.weights(ty, cols, &wbytes);
        let xs = rng.vec(8 * cols, 2.0);
        let nw = rng.vec(cols, 1.0);
        let nwb = h.buf_f32(&nw);
        let shape = MvShape { rows: rows as u32, cols: cols as u32, row_bytes: row_bytes as u32, x_stride: cols as u32, y_stride: rows as u32, y_off: 0 };
        let l1 = QPack::new(cols as u32).unwrap();
        let (mut fold, mut np1, mut rs1, mut pk1) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for c in 0..8 {
            let xc = h.buf_f32(&xs[c * cols..(c + 1) * cols]);
            let (y, y2) = (h.poisoned(rows), h.poisoned(rows));
            let (pk, rsb) = (poisoned_words(&h, l1.words() as usize), h.poisoned(1));
            h.run(|rec| {
                rec.mv(Mv { ty, n: 1, w: (&wbuf).into(), input: MvIn::Normed { x: (&xc).into(), w: (&nwb).into(), eps: 1e-5 }, out: MvOut::Store((&y).into()), shape })?;
                rec.normpack(1, cols as u32, 1e-5, (&xc).into(), None, (&nwb).into(), l1, (&pk).into(), (&rsb).into())?;
                rec.barrier();
                rec.mv(Mv { ty, n: 1, w: (&wbuf).into(), input: MvIn::NormPacked { x: (&pk).into(), layout: l1, r: (&rsb).into() }, out: MvOut::Store((&y2).into()), shape })
            });
            fold.extend(bits(&y.read_f32(0, rows).unwrap()));
            np1.extend(bits(&y2.read_f32(0, rows).unwrap()));
            rs1.push(rsb.read_f32(0, 1).unwrap()[0]);
            pk1.push(pk.read_u32(0, l1.words() as usize).unwrap());
        }
        let y = h.poisoned(8 * rows);
        let (pk, l8, rsb) = normpacked(&mut h, &xs, cols, &nwb, 1e-5);
        let input = MvIn::NormPacked { x: (&pk).into(), layout: l8, r: (&rsb).into() };
        h.run(|rec| rec.mv(Mv { ty, n: 8, w: (&wbuf).into(), input, out: MvOut::Store((&y).into()), shape }));
        let np8 = bits(&y.read_f32(0, 8 * rows).unwrap());
        let cut = Cut::of(cols).unwrap();
        for c in 0..8 {
            let x = &xs[c * cols..(c + 1) * cols];
            let r_host = canon_rms_scale(canon_sumsq(x, &cut), cols, 1e-5);
            let u: Vec<f32> = x.iter().zip(&nw).map(|(a, b)| a * b).collect();
            let host = pack_host(&[CanonActs::quantize(&u)]);
            let pk_diff = pk1[c].iter().zip(&host).filter(|(a, b)| a != b).count();
            let seg = |v: &[u32]| v[c * rows..(c + 1) * rows].to_vec();
            let line = format!(
                "{ty} row {c}: fold/np1 {} np1/np8 {} r dev-host {} ulp, packs differing from host {pk_diff}",
                seg(&fold) == seg(&np1),
                seg(&np1) == seg(&np8),
                rs1[c].to_bits() as i64 - r_host.to_bits() as i64
            );
            eprintln!("{line}");
            if seg(&fold) != seg(&np1) || seg(&np1) != seg(&np8) {
                bad.push(line);
            }
        }
    }
    assert!(bad.is_empty(), "{bad:#?}");
}

/// Time of the canonical product of many rows in each tier the device has (mr.comp's dot4 and
/// OpSDot, mm.comp's int8 tiles), beside 8-row products once an 8-row group (the lanes, one
/// after another) and the prefill GEMM (f32 rows, no split) over the same weights
/// (`Harness::time_chained`). `cargo test --release --test mv -- --ignored --nocapture wide_speed`.
#[test]
#[ignore]
fn wide_speed() {
    let Some(mut h) = Harness::new() else { return };
    if !mv_ok(&h.gpu.info) {
        return;
    }
    let reps = 20u32;
    for (ty, rows, cols) in [(GgmlType::Q8_0, 8192usize, 2048usize), (GgmlType::Q8_0, 2048, 8192), (GgmlType::Q4_K, 8192, 3072), (GgmlType::Q6_K, 3072, 8192)] {
        let mut rng = Rng(11);
        let wbytes = formats::quantize(ty, &rng.vec(rows * cols, 1.0)).unwrap();
        let (wbuf, row_bytes) = h.weights(ty, cols, &wbytes);
        let gbytes = (rows * row_bytes) as f64;
        for n in [16usize, 64, 256, 512] {
            let xs = rng.vec(n * cols, 1.0);
            let acts: Vec<CanonActs> = (0..n).map(|c| CanonActs::quantize(&xs[c * cols..(c + 1) * cols])).collect();
            let pk = h.buf_bytes(&u32_bytes(&pack_host(&acts)));
            let layout = QPack::new((n * cols) as u32).unwrap();
            let y = h.poisoned(n * rows);
            let shape = MvShape { rows: rows as u32, cols: cols as u32, row_bytes: row_bytes as u32, x_stride: cols as u32, y_stride: rows as u32, y_off: 0 };
            let mut line = format!("{ty} {rows}x{cols} n={n}:");
            let int_dot = h.gpu.info.int_dot;
            for tier in tiers(&h).into_iter().filter(|&t| t != DotTier::Emulated || !int_dot) {
                let input = MvIn::Packed { x: (&pk).into(), layout };
                let us = h.time_chained(reps, &mut |rec| rec.mv_tier(tier, Mv { ty, n: n as u32, w: (&wbuf).into(), input, out: MvOut::Store((&y).into()), shape }));
                line += &format!(" {tier:?} {us:.0} us ({:.0} GB/s, {:.1} TOPS);", gbytes / us / 1e3, 2.0 * (n * rows * cols) as f64 / us / 1e6);
            }
            // What the lanes pay: an 8-row product (mv.comp) once an 8-row group.
            {
                let input = MvIn::Packed { x: (&pk).into(), layout };
                let tier = DotTier::for_device(&h.gpu.info);
                let us = h.time_chained(reps, &mut |rec| rec.mv_tier(tier, Mv { ty, n: 8, w: (&wbuf).into(), input, out: MvOut::Store((&y).into()), shape }));
                line += &format!(" lanes {:.0} us;", us * (n / 8) as f64);
            }
            let xb = h.buf_f32(&xs);
            let us = h.time_chained(reps, &mut |rec| rec.gemm(ty, n as u32, (&wbuf).into(), (&xb).into(), (&y).into(), shape, None));
            line += &format!(" gemm {us:.0} us ({:.1} TOPS)", 2.0 * (n * rows * cols) as f64 / us / 1e6);
            eprintln!("{line}");
        }
    }
}
