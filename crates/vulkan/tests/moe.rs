//! The mixture-of-experts route (moe.comp ROUTE) against the CPU home's `route`, and the
//! grouping kernel (shaders/ops/moe.comp GROUP, `Recorder::moe_group`) against a listing
//! computed on the host: for each expert its offset, the total, then each
//! expert's slots in ascending slot order. Outputs are poisoned before each run and every word
//! is checked, words past the listing included (they must stay poisoned). The shapes reach a
//! whole prefill window of Qwen3-30B-A3B (512 rows, 8 of 128 experts each: 4096 slots), tiles
//! of slots cut short, every slot on one expert, the most experts a router takes, and ids out
//! of range (in no list). Controls: the same listing with each expert's slots in descending
//! order, and the listing of the ids with one changed, must fail the same comparison.

mod common;

use common::*;
use resin_gguf::GgmlType;
use resin_vulkan::buffers::{u32_bytes, Buffer, Location};
use resin_vulkan::kernels::GemvPush;
use resin_vulkan::kernels::{moe_active_entries, moe_group_words, RouterBinds, RouterIn, MOE_MAX_EXPERTS, MOE_NO_EXPERT};
use resin_vulkan::mv::QPack;

/// Words written past the listing's end, which must stay poisoned.
const SPARE: usize = 64;

/// What moe_group writes for `sel` over `n_expert` experts: each expert's offset into the
/// lists, the total, then the lists, each in slot order. Ids out of range are in no list, so
/// the lists are that much shorter than `sel` and the words after them are not written.
fn listing(sel: &[u32], n_expert: u32) -> Vec<u32> {
    let mut lists: Vec<Vec<u32>> = vec![Vec::new(); n_expert as usize];
    for (s, &e) in sel.iter().enumerate() {
        if e < n_expert {
            lists[e as usize].push(s as u32);
        }
    }
    let mut w = Vec::with_capacity(n_expert as usize + 1 + sel.len());
    let mut at = 0u32;
    for l in &lists {
        w.push(at);
        at += l.len() as u32;
    }
    w.push(at);
    w.extend(lists.iter().flatten());
    // Where the lists stop short of every slot (ids of no expert), the words up to the chosen
    // experts are the device's to leave: the host's listing has them as they were.
    w.resize(n_expert as usize + 1 + sel.len(), POISON);
    let chosen = moe_active_entries(n_expert, sel.len() as u32) as usize;
    let mut act: Vec<u32> = (0..n_expert).filter(|&e| !lists[e as usize].is_empty()).collect();
    act.resize(chosen, MOE_NO_EXPERT);
    w.extend(act);
    w
}

/// Rows of `k` distinct experts of `n_expert`, drawn with a skew (the low experts far more
/// often than the high ones, the top eighth never), as a router's choices bunch.
fn routed(rng: &mut Rng, rows: usize, n_expert: u32, k: usize) -> Vec<u32> {
    let mut sel = Vec::with_capacity(rows * k);
    for _ in 0..rows {
        let mut row: Vec<u32> = Vec::with_capacity(k);
        while row.len() < k {
            let u = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
            let e = ((u * u * u) * (n_expert - n_expert / 8) as f64) as u32;
            if !row.contains(&e) {
                row.push(e);
            }
        }
        sel.extend(row);
    }
    sel
}

/// moe_group over `sel` on the device: the listing's words and the SPARE words after them
/// (poisoned before the run).
fn group_on_device(h: &mut Harness, sel: &[u32], n_expert: u32) -> Vec<u32> {
    let words = moe_group_words(n_expert, sel.len() as u32) as usize;
    let selb = h.buf_bytes(&u32_bytes(sel));
    let mut grp = Buffer::new(&h.gpu, ((words + SPARE) * 4) as u64, Location::Device).unwrap();
    grp.fill_u32(POISON).unwrap();
    h.run(|rec| rec.moe_group(sel.len() as u32, n_expert, (&selb).into(), (&grp).into()));
    grp.read_u32(0, words + SPARE).unwrap()
}

/// The device's words against the host's listing, then nothing written past it.
fn check_group(h: &mut Harness, what: &str, sel: &[u32], n_expert: u32) -> Vec<u32> {
    let want = listing(sel, n_expert);
    let got = group_on_device(h, sel, n_expert);
    for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g, w, "{what}: word {i} of {} (offsets 0..={n_expert}, then the lists)", want.len());
    }
    let past = got[want.len()..].iter().position(|&g| g != POISON);
    assert!(past.is_none(), "{what}: word {} past the listing was written", want.len() + past.unwrap_or(0));
    got
}

#[test]
fn group_lists_a_prefill_window_of_128_experts_in_slot_order() {
    let Some(mut h) = Harness::new() else { return };
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let sel = routed(&mut rng, 512, 128, 8);
    assert_eq!(sel.len(), 4096);
    let got = check_group(&mut h, "512 rows, 8 of 128 experts", &sel, 128);
    // The draw must give the test something to catch: long lists, short ones and empty ones.
    let counts: Vec<u32> = (0..128).map(|e| got[e + 1] - got[e]).collect();
    let (longest, empty) = (counts.iter().max().copied().unwrap_or(0), counts.iter().filter(|&&c| c == 0).count());
    eprintln!("4096 slots over 128 experts: longest list {longest}, {empty} experts chose by none");
    assert!(longest >= 256 && empty > 0, "a draw too even to test the lists (longest {longest}, {empty} empty)");

    // Controls: each list in descending slot order, and one slot moved to another expert.
    let mut descending = listing(&sel, 128);
    for e in 0..128 {
        descending[129 + got[e] as usize..129 + got[e + 1] as usize].reverse();
    }
    assert_ne!(got[..descending.len()], descending[..], "control: lists in descending order passed");
    let mut moved = sel.clone();
    moved[2049] = (moved[2049] + 1) % 128;
    let other = listing(&moved, 128);
    assert_ne!(got[..other.len()], other[..], "control: another slot's expert passed");
}

#[test]
fn group_lists_every_shape_of_step() {
    let Some(mut h) = Harness::new() else { return };
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    // Decode steps and windows of each routed family, tiles of slots cut short.
    for (rows, n_expert, k) in [(1usize, 128u32, 8usize), (8, 128, 8), (37, 128, 8), (511, 128, 8), (5, 8, 2), (300, 8, 2), (77, 60, 4), (64, 64, 8)] {
        let sel = routed(&mut rng, rows, n_expert, k);
        check_group(&mut h, &format!("{rows} rows, {k} of {n_expert} experts"), &sel, n_expert);
    }
    // The most experts a router takes, each chosen by some slot.
    let max = MOE_MAX_EXPERTS;
    let sel: Vec<u32> = (0..2048u32).map(|s| (s * 37 + s / 256) % max).collect();
    check_group(&mut h, &format!("2048 slots over {max} experts"), &sel, max);
    // One expert for every slot; one expert in all.
    check_group(&mut h, "4096 slots on one of 128 experts", &[93u32; 4096], 128);
    check_group(&mut h, "1000 slots, one expert", &[0u32; 1000], 1);
    // Ids out of range are in no list: the lists end early, and nothing is written after them.
    let mut sel = routed(&mut rng, 100, 128, 8);
    for s in [0usize, 7, 255, 256, 799] {
        sel[s] = 128 + s as u32;
    }
    let got = check_group(&mut h, "ids out of range", &sel, 128);
    assert_eq!(got[128], 795, "the total counts the listed slots only");
}

/// Microseconds one grouping of a 4096-slot window over 128 experts takes on this device.
#[test]
#[ignore]
fn group_time() {
    let Some(mut h) = Harness::new() else { return };
    let sel = routed(&mut Rng(0x9e37_79b9_7f4a_7c15), 512, 128, 8);
    let words = moe_group_words(128, 4096) as usize;
    let selb = h.buf_bytes(&u32_bytes(&sel));
    let grp = Buffer::new(&h.gpu, (words * 4) as u64, Location::Device).unwrap();
    let us = h.time_chained(50, &mut |rec| rec.moe_group(4096, 128, (&selb).into(), (&grp).into()));
    eprintln!("moe_group, 4096 slots over 128 experts: {us:.1} us on {}", h.gpu.info.name);
}

/// moe_route on the device for `logits` ([rows][n_expert]): each row's k expert ids and weights.
fn route_on_device(h: &mut Harness, logits: &[f32], n_expert: u32, k: u32) -> (Vec<u32>, Vec<f32>) {
    let rows = logits.len() as u32 / n_expert;
    let lb = h.buf_f32(logits);
    let mut sel = Buffer::new(&h.gpu, (rows * k * 4) as u64, Location::Device).unwrap();
    sel.fill_u32(POISON).unwrap();
    let wt = h.poisoned((rows * k) as usize);
    h.run(|rec| rec.moe_route(rows, n_expert, k, (&lb).into(), (&sel).into(), (&wt).into()));
    (sel.read_u32(0, (rows * k) as usize).unwrap(), wt.read_f32(0, (rows * k) as usize).unwrap())
}

/// The route (softmax, top k with ties to the lower index, the weights renormalised) against
/// the CPU home's `route`: the same ids in the same rank order and the weights within 1e-6, on
/// random logits, logits with ties (the top k among equal values), one row all equal, and a
/// NaN (k distinct experts all the same). Control: the device's ids against those of each row
/// ranked from the smallest probability must differ.
#[test]
fn route_picks_the_cpu_homes_experts() {
    let Some(mut h) = Harness::new() else { return };
    let mut rng = Rng(0x5851_f42d_4c95_7f2d);
    for (n_expert, k) in [(128u32, 8u32), (8, 2), (60, 4), (MOE_MAX_EXPERTS, 8)] {
        let rows = 37usize;
        let mut logits = rng.vec(rows * n_expert as usize, 4.0);
        // Row 1: values from a few levels (many ties); row 2: every logit equal; row 3: a NaN.
        for e in 0..n_expert as usize {
            logits[n_expert as usize + e] = (e % 3) as f32;
            logits[2 * n_expert as usize + e] = 0.5;
        }
        logits[3 * n_expert as usize + 5] = f32::NAN;
        let (sel, wt) = route_on_device(&mut h, &logits, n_expert, k);
        let mut reversed_differs = false;
        for r in 0..rows {
            let row = &logits[r * n_expert as usize..(r + 1) * n_expert as usize];
            let got: Vec<u32> = sel[r * k as usize..(r + 1) * k as usize].to_vec();
            let mut distinct = got.clone();
            distinct.sort_unstable();
            distinct.dedup();
            assert!(distinct.len() == k as usize && got.iter().all(|&e| e < n_expert), "{n_expert}/{k} row {r}: ids {got:?}");
            if r == 3 {
                continue; // A NaN row: any k distinct experts.
            }
            let mut want = vec![(0usize, 0f32); k as usize];
            resin_cpu::route(row, &mut want);
            let ids: Vec<u32> = want.iter().map(|w| w.0 as u32).collect();
            assert_eq!(got, ids, "{n_expert}/{k} row {r}: the experts or their rank");
            for (j, w) in want.iter().enumerate() {
                let g = wt[r * k as usize + j];
                assert!((g - w.1).abs() <= 1e-6, "{n_expert}/{k} row {r} rank {j}: weight {g} vs {}", w.1);
            }
            let mut asc: Vec<usize> = (0..n_expert as usize).collect();
            asc.sort_by(|&a, &b| row[a].partial_cmp(&row[b]).unwrap());
            reversed_differs |= asc[..k as usize].iter().map(|&e| e as u32).collect::<Vec<_>>() != got;
        }
        assert!(reversed_differs, "control: the smallest experts passed for {n_expert}/{k}");
    }
}

/// What one moe_router dispatch wrote: the logits, the slots' experts and weights, the lists.
struct Routed {
    logits: Vec<f32>,
    sel: Vec<u32>,
    wt: Vec<f32>,
    grp: Vec<u32>,
}

/// The router's outputs, poisoned, for `rows` rows.
struct RouterOut {
    logits: Buffer,
    sel: Buffer,
    wt: Buffer,
    grp: Buffer,
}

impl RouterOut {
    fn new(h: &Harness, rows: u32, n_expert: u32, k: u32) -> RouterOut {
        let words = moe_group_words(n_expert, rows * k) as usize + SPARE;
        let mut sel = Buffer::new(&h.gpu, (rows * k * 4) as u64, Location::Device).unwrap();
        sel.fill_u32(POISON).unwrap();
        let mut grp = Buffer::new(&h.gpu, (words * 4) as u64, Location::Device).unwrap();
        grp.fill_u32(POISON).unwrap();
        RouterOut { logits: h.poisoned((rows * n_expert) as usize), sel, wt: h.poisoned((rows * k) as usize), grp }
    }

    fn binds<'a>(&'a self, router: &'a Buffer, xn: &'a Buffer, done: &'a Buffer) -> RouterBinds<'a> {
        self.binds_in(router, RouterIn::Normed(xn.into()), done)
    }

    fn binds_in<'a>(&'a self, router: &'a Buffer, input: RouterIn<'a>, done: &'a Buffer) -> RouterBinds<'a> {
        RouterBinds { router: router.into(), input, logits: (&self.logits).into(), sel: (&self.sel).into(), wt: (&self.wt).into(), grp: (&self.grp).into(), done: done.into() }
    }

    fn read(&self, rows: u32, n_expert: u32, k: u32) -> Routed {
        let words = moe_group_words(n_expert, rows * k) as usize + SPARE;
        Routed {
            logits: self.logits.read_f32(0, (rows * n_expert) as usize).unwrap(),
            sel: self.sel.read_u32(0, (rows * k) as usize).unwrap(),
            wt: self.wt.read_f32(0, (rows * k) as usize).unwrap(),
            grp: self.grp.read_u32(0, words).unwrap(),
        }
    }
}

/// The token command's router in one dispatch (moe.comp ROUTER) for every step width 1..=8:
/// each row's logits within 1e-5 of the host's float64 product (relative to the sum of the
/// products' magnitudes), its experts and weights the CPU home's `route` of those logits (ids
/// exact, weights within 1e-6), the slots' lists every word as `moe_group` lists them, nothing
/// past them written; a row's logits, experts and weights the same bits in every width (each
/// row stepped alone against the 8-row step). Two dispatches in one command check the counter
/// is left at zero. Control: the logits against the host's product of the next expert's
/// router row must fail the same bar.
#[test]
fn router_routes_and_groups_each_row_as_alone() {
    let Some(mut h) = Harness::new() else { return };
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    for (n_expert, k, d) in [(128u32, 8u32, 2048u32), (8, 2, 4096), (8, 2, 256), (60, 4, 512), (MOE_MAX_EXPERTS, 8, 256)] {
        let (ne, du) = (n_expert as usize, d as usize);
        let w = rng.vec(ne * du, 1.0 / (du as f32).sqrt());
        let x = rng.vec(8 * du, 1.0);
        let (wb, done) = (h.buf_f32(&w), h.buf_bytes(&[0; 4]));
        // The 8-row step, then a second dispatch in the same command (rows reversed).
        let xr: Vec<f32> = x.chunks(du).rev().flatten().copied().collect();
        let (xb, xrb) = (h.buf_f32(&x), h.buf_f32(&xr));
        let (a, b) = (RouterOut::new(&h, 8, n_expert, k), RouterOut::new(&h, 8, n_expert, k));
        h.run(|rec| {
            rec.moe_router(8, n_expert, k, d, a.binds(&wb, &xb, &done))?;
            rec.barrier();
            rec.moe_router(8, n_expert, k, d, b.binds(&wb, &xrb, &done))
        });
        let (wide, second) = (a.read(8, n_expert, k), b.read(8, n_expert, k));
        assert_eq!(done.read_u32(0, 1).unwrap(), vec![0], "{n_expert}: the counter was left set");
        let mut control_failed = false;
        for r in 0..8usize {
            let (lo, hi) = (r * ne, (r + 1) * ne);
            let xrow = &x[r * du..(r + 1) * du];
            for e in 0..ne {
                let dot = |e: usize| -> (f64, f64) {
                    let row = &w[e * du..(e + 1) * du];
                    (row.iter().zip(xrow).map(|(&a, &b)| a as f64 * b as f64).sum(), row.iter().zip(xrow).map(|(&a, &b)| (a as f64 * b as f64).abs()).sum())
                };
                let ((want, mag), got) = (dot(e), wide.logits[lo + e] as f64);
                assert!((got - want).abs() <= 1e-5 * mag, "{n_expert}/{d} row {r} expert {e}: logit {got} vs {want}");
                let (other, _) = dot((e + 1) % ne);
                control_failed |= (got - other).abs() > 1e-5 * mag;
            }
            let mut want = vec![(0usize, 0f32); k as usize];
            resin_cpu::route(&wide.logits[lo..hi], &mut want);
            let ids: Vec<u32> = want.iter().map(|w| w.0 as u32).collect();
            assert_eq!(&wide.sel[r * k as usize..(r + 1) * k as usize], ids.as_slice(), "{n_expert} row {r}: the experts or their rank");
            for (j, w) in want.iter().enumerate() {
                let g = wide.wt[r * k as usize + j];
                assert!((g - w.1).abs() <= 1e-6, "{n_expert} row {r} rank {j}: weight {g} vs {}", w.1);
            }
            // The second dispatch's row 7 - r is this row.
            let s = 7 - r;
            assert!(bits_equal(&second.logits[s * ne..(s + 1) * ne], &wide.logits[lo..hi]), "{n_expert} row {r}: the second dispatch's logits");
            assert_eq!(second.sel[s * k as usize..(s + 1) * k as usize], wide.sel[r * k as usize..(r + 1) * k as usize], "{n_expert} row {r}: the second dispatch's experts");
        }
        assert!(control_failed, "control: the next expert's logits passed for {n_expert}/{d}");
        let want = listing(&wide.sel, n_expert);
        assert_eq!(&wide.grp[..want.len()], want.as_slice(), "{n_expert}: the 8-row step's lists");
        assert!(wide.grp[want.len()..].iter().all(|&g| g == POISON), "{n_expert}: a word past the lists was written");
        // Every width: each step's rows are the 8-row step's first rows, bit for bit.
        for rows in 1..8u32 {
            let xb = h.buf_f32(&x[..rows as usize * du]);
            let o = RouterOut::new(&h, rows, n_expert, k);
            h.run(|rec| rec.moe_router(rows, n_expert, k, d, o.binds(&wb, &xb, &done)));
            let got = o.read(rows, n_expert, k);
            let (nl, ns) = (rows as usize * ne, (rows * k) as usize);
            assert!(bits_equal(&got.logits, &wide.logits[..nl]), "{n_expert}: {rows} rows' logits against the 8-row step's");
            assert_eq!(got.sel, wide.sel[..ns], "{n_expert}: {rows} rows' experts");
            assert!(bits_equal(&got.wt, &wide.wt[..ns]), "{n_expert}: {rows} rows' weights");
            let want = listing(&got.sel, n_expert);
            assert_eq!(&got.grp[..want.len()], want.as_slice(), "{n_expert}: {rows} rows' lists");
        }
    }
}

/// The router reading the residual rows, their blocks' sums of squares (as `MvOut::AddPack`
/// writes them: each 32 values' squares added left to right, here from the host) and the
/// norm's weights (`RouterIn::Sums`) against the router reading the normed rows normpack
/// writes from the same rows (`normpack_xn`): logits, experts, weights and lists the same
/// bits, for 1, 3 and 8 rows. Control: the sums of squares of the rows in reverse order must
/// change the logits.
#[test]
fn router_over_sums_of_squares_equals_it_over_normpacks_rows() {
    let Some(mut h) = Harness::new() else { return };
    let mut rng = Rng(0x7f4a_7c15_9e37_79b9);
    let eps = 1e-2f32;
    for (n_expert, k, d) in [(128u32, 8u32, 2048u32), (60, 4, 576)] {
        let du = d as usize;
        let (wb, done) = (h.buf_f32(&rng.vec(n_expert as usize * du, 0.05)), h.buf_bytes(&[0; 4]));
        let nw = h.buf_f32(&rng.vec(du, 1.0));
        for rows in [1u32, 3, 8] {
            let ru = rows as usize;
            let x = rng.vec(ru * du, 1.0);
            let xb = h.buf_f32(&x);
            let layout = QPack::new(rows * d).unwrap();
            let (pk, rs, xn) = (h.poisoned(layout.words() as usize), h.poisoned(ru), h.poisoned(ru * du));
            h.run(|rec| rec.normpack_xn(rows, d, eps, (&xb).into(), None, (&nw).into(), layout, ((&pk).into(), (&rs).into()), Some((&xn).into())));
            let ss: Vec<f32> = x.chunks(32).map(|b| b.iter().fold(0f32, |a, v| a + v * v)).collect();
            let control: Vec<f32> = x.chunks(du).rev().flat_map(|row| row.chunks(32).map(|b| b.iter().fold(0f32, |a, v| a + v * v)).collect::<Vec<_>>()).collect();
            let (ssb, ctl) = (h.buf_f32(&ss), h.buf_f32(&control));
            let (a, b, c) = (RouterOut::new(&h, rows, n_expert, k), RouterOut::new(&h, rows, n_expert, k), RouterOut::new(&h, rows, n_expert, k));
            h.run(|rec| {
                rec.moe_router(rows, n_expert, k, d, a.binds(&wb, &xn, &done))?;
                rec.barrier();
                rec.moe_router(rows, n_expert, k, d, b.binds_in(&wb, RouterIn::Sums { x: (&xb).into(), ss: (&ssb).into(), w: (&nw).into(), eps }, &done))?;
                rec.barrier();
                rec.moe_router(rows, n_expert, k, d, c.binds_in(&wb, RouterIn::Sums { x: (&xb).into(), ss: (&ctl).into(), w: (&nw).into(), eps }, &done))
            });
            let (want, got, ctl) = (a.read(rows, n_expert, k), b.read(rows, n_expert, k), c.read(rows, n_expert, k));
            let what = format!("{n_expert}/{d}, {rows} rows");
            assert!(bits_equal(&got.logits, &want.logits), "{what}: the logits differ from those over normpack's rows");
            assert_eq!(got.sel, want.sel, "{what}: the experts");
            assert!(bits_equal(&got.wt, &want.wt), "{what}: the weights");
            assert_eq!(got.grp, want.grp, "{what}: the lists");
            if rows > 1 {
                assert!(!bits_equal(&ctl.logits, &want.logits), "control: {what}: other rows' sums of squares left the logits");
            }
        }
    }
}

/// Microseconds a token command's router takes on this device (Qwen3-30B-A3B's: 128 experts
/// of 2048, 8 a row) at 1 and 8 rows: the one dispatch (`moe_router`, over normed rows and
/// over the sums of squares) beside the three it replaced (the F32 GEMV, `moe_route`,
/// `moe_group`), each chained as a token command chains its stages.
#[test]
#[ignore]
fn router_time() {
    let Some(mut h) = Harness::new() else { return };
    let (ne, k, d) = (128u32, 8u32, 2048u32);
    let mut rng = Rng(0x51f1);
    let (wb, done) = (h.buf_f32(&rng.vec((ne * d) as usize, 0.05)), h.buf_bytes(&[0; 4]));
    let (nw, x) = (h.buf_f32(&rng.vec(d as usize, 1.0)), h.buf_f32(&rng.vec(8 * d as usize, 1.0)));
    let ss = h.buf_f32(&rng.vec(8 * d as usize / 32, 1.0).iter().map(|v| 8.0 + v.abs()).collect::<Vec<_>>());
    for rows in [1u32, 8] {
        let o = RouterOut::new(&h, rows, ne, k);
        let one = h.time_chained(50, &mut |rec| rec.moe_router(rows, ne, k, d, o.binds(&wb, &x, &done)));
        let sums =
            h.time_chained(50, &mut |rec| rec.moe_router(rows, ne, k, d, o.binds_in(&wb, RouterIn::Sums { x: (&x).into(), ss: (&ss).into(), w: (&nw).into(), eps: 1e-6 }, &done)));
        let p = GemvPush { rows: ne, cols: d, row_bytes: d * 4, x_stride: d, y_stride: ne, y_off: 0 };
        let three = h.time_chained(50, &mut |rec| {
            rec.gemv(GgmlType::F32, rows, (&wb).into(), (&x).into(), (&o.logits).into(), p)?;
            rec.barrier();
            rec.moe_route(rows, ne, k, (&o.logits).into(), (&o.sel).into(), (&o.wt).into())?;
            rec.barrier();
            rec.moe_group(rows * k, ne, (&o.sel).into(), (&o.grp).into())
        });
        let route = h.time_chained(50, &mut |rec| rec.moe_route(rows, ne, k, (&o.logits).into(), (&o.sel).into(), (&o.wt).into()));
        eprintln!(
            "router, {rows} rows: one dispatch {one:.1} us (over sums of squares {sums:.1}), GEMV + route + group {three:.1} us (the route alone {route:.1}) on {}",
            h.gpu.info.name
        );
    }
}
