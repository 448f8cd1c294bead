//! The prefill-window attention (`attn_window_*`, src/attn_window.rs) against an f64 oracle and
//! against the decode kernel (`Recorder::attention`, one piece) on the same window.
//!
//! Bar (per head of a row, each element): (2 ds + (keys + hd + 32) u) * max|v| with
//! ds = (hd + 4) u * max_j sum_i |q_i k_ji| * scale. ds bounds a score's error (the f32 dot
//! product and the scale); exp turns a score error into a relative error of that key's weight,
//! and the weights' normalisation cancels the common part, hence 2 ds; the rest is the f32
//! sums over keys (keys u relative to sum |w v| <= l max|v|), the rescales of the online
//! softmax (one per key tile, a few u each) and exp's ulps. It is the decode kernel's bar
//! (tests/kernels.rs). K/V values are exact as stored (f16-rounded for the f16 mirror, full
//! f32 values for the f32 mirror), so the oracle reads exactly what the device reads. Against
//! the decode kernel the bar is 2x (each is within the bar of the oracle).
//!
//! The cooperative-matrix tier (f16 mirror; only where the device has the shape, never on
//! lavapipe) rounds q and the weights to f16: its bar adds U16 to each score's relative error
//! (q's rounding), 2 U16 to the output's (the weights' rounding, and the sum l of the unrounded
//! ones) and keys * 2^-25 (weights below f16's normal range), each times max|v|. Its rows are
//! also the same bits whatever rows share their tiles.

mod common;

use common::*;
use resin_core::KvCodec;
use resin_vulkan::attn_window::{window_piece_keys, WindowTile, WINDOW_PIECES};
use resin_vulkan::buffers::{f32_bytes, Buffer};
use resin_vulkan::kernels::*;

/// A window: segments (region, first position, rows), in order; `window`: a sliding-window
/// layer's keys a row (0: all).
struct Case {
    n_head: usize,
    n_head_kv: usize,
    hd: usize,
    window: usize,
    segs: Vec<(usize, usize, usize)>,
}

struct Setup {
    rows: usize,
    q_dim: usize,
    meta: Vec<RowMeta>,
    q: Vec<f32>,
    kvals: Vec<f32>,
    vvals: Vec<f32>,
    n_ctx: usize,
    kv_dim: usize,
}

fn setup(c: &Case, codec: KvCodec, seed: u64) -> Setup {
    let (kv_dim, q_dim) = (c.n_head_kv * c.hd, c.n_head * c.hd);
    let regions = c.segs.iter().map(|s| s.0).max().unwrap() + 1;
    let n_ctx = c.segs.iter().map(|s| s.1 + s.2).max().unwrap() + 3;
    let mut rng = Rng(seed);
    let round = |v: Vec<f32>| -> Vec<f32> {
        if codec == KvCodec::F16 {
            v.iter().map(|&a| half::f16::from_f32(a).to_f32()).collect()
        } else {
            v
        }
    };
    let kvals = round(rng.vec(regions * n_ctx * kv_dim, 2.0));
    let vvals = round(rng.vec(regions * n_ctx * kv_dim, 2.0));
    let mut meta = Vec::new();
    for &(reg, start, len) in &c.segs {
        for i in 0..len {
            let pos = (start + i) as u32;
            meta.push(RowMeta { token: 0, pos, kv_base: (reg * n_ctx * kv_dim) as u32, keys: pos + 1 });
        }
    }
    let rows = meta.len();
    let q = rng.vec(rows * q_dim, 1.0);
    Setup { rows, q_dim, meta, q, kvals, vvals, n_ctx, kv_dim }
}

/// f64 softmax attention of every row and head, with the bar of each element.
/// `cm`: the cooperative-matrix tier's bar.
fn oracle(c: &Case, s: &Setup, scale: f32, cm: bool) -> (Vec<f64>, Vec<f64>) {
    let score_u = (c.hd as f64 + 4.0) * U + if cm { U16 } else { 0.0 };
    let hd = c.hd;
    let mut want = vec![0f64; s.rows * s.q_dim];
    let mut bar = vec![0f64; s.rows * s.q_dim];
    for (r, m) in s.meta.iter().enumerate() {
        let keys = m.keys as usize;
        // A sliding-window layer's row attends to its last `window` keys only.
        let first = if c.window == 0 || keys <= c.window { 0 } else { keys - c.window };
        for hh in 0..c.n_head {
            let g = hh / (c.n_head / c.n_head_kv);
            let qh = &s.q[r * s.q_dim + hh * hd..r * s.q_dim + (hh + 1) * hd];
            let base = m.kv_base as usize + g * hd;
            let mut sc = vec![f64::NEG_INFINITY; keys];
            let mut ds = 0f64;
            for (j, sj) in sc.iter_mut().enumerate().skip(first) {
                let kr = &s.kvals[base + j * s.kv_dim..base + j * s.kv_dim + hd];
                *sj = qh.iter().zip(kr).map(|(a, b)| *a as f64 * *b as f64).sum::<f64>() * scale as f64;
                ds = f64::max(ds, score_u * qh.iter().zip(kr).map(|(a, b)| (*a as f64 * *b as f64).abs()).sum::<f64>() * scale as f64);
            }
            let mx = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let w: Vec<f64> = sc.iter().map(|x| (x - mx).exp()).collect();
            let l: f64 = w.iter().sum();
            let mut acc = vec![0f64; hd];
            let mut vmax = 0f64;
            for (j, wj) in w.iter().enumerate().skip(first) {
                let vr = &s.vvals[base + j * s.kv_dim..base + j * s.kv_dim + hd];
                for d in 0..hd {
                    acc[d] += wj * vr[d] as f64;
                    vmax = vmax.max((vr[d] as f64).abs());
                }
            }
            for d in 0..hd {
                want[r * s.q_dim + hh * hd + d] = acc[d] / l;
                let weights = if cm { 2.0 * U16 + keys as f64 * 2f64.powi(-25) } else { 0.0 };
                bar[r * s.q_dim + hh * hd + d] = (2.0 * ds + (keys as f64 + hd as f64 + 32.0) * U + weights) * vmax + 1e-30;
            }
        }
    }
    (want, bar)
}

const TAIL: usize = 64;

/// What a window's attention writes besides its outputs: the split rows' partials (poisoned)
/// and the tiles' counters (zero, and left zero: checked after each dispatch).
struct WinScratch {
    part: Buffer,
    done: Buffer,
    words: usize,
}

impl WinScratch {
    fn new(h: &Harness, rows: usize, c: &Case) -> WinScratch {
        let words = rows * c.n_head;
        WinScratch { part: h.poisoned(attn_part_len(rows, c.n_head, c.hd, WINDOW_PIECES as usize)), done: h.buf_bytes(&vec![0u8; 4 * words]), words }
    }

    fn binds<'a>(&'a self, q: &'a Buffer, mk: &'a Buffer, mv: &'a Buffer, meta: &'a Buffer, out: &'a Buffer) -> AttnBinds<'a> {
        AttnBinds { q: q.into(), mk: mk.into(), mv: mv.into(), meta: meta.into(), part: (&self.part).into(), out: out.into() }
    }

    fn check_done(&self, what: &str) {
        assert!(self.done.read_u32(0, self.words).unwrap().iter().all(|&w| w == 0), "{what}: the tiles' counters were not left at zero");
    }
}

/// Runs the case for each tile (None: the device's pick) and the decode kernel; checks all.
/// Returns the worst err/bar seen against the oracle.
fn run_case(h: &mut Harness, what: &str, c: &Case, tiles: &[Option<WindowTile>], decode: bool, seed: u64) -> f64 {
    let mut worst = 0f64;
    for codec in [KvCodec::F16, KvCodec::F32] {
        let s = setup(c, codec, seed);
        let bytes = |v: &[f32]| -> Vec<u8> {
            if codec == KvCodec::F16 {
                v.iter().flat_map(|&a| half::f16::from_f32(a).to_le_bytes()).collect()
            } else {
                f32_bytes(v)
            }
        };
        let (mk, mv) = (h.buf_bytes(&bytes(&s.kvals)), h.buf_bytes(&bytes(&s.vvals)));
        let mb = h.buf_bytes(&RowMeta::words(&s.meta));
        let qb = h.buf_f32(&s.q);
        let scale = 1.0 / (c.hd as f32).sqrt();
        let p = AttnPush { n_head: c.n_head as u32, n_head_kv: c.n_head_kv as u32, head_dim: c.hd as u32, n_pieces: 1, scale, key_window: c.window as u32 };
        let t0 = std::time::Instant::now();
        let (want, bar) = oracle(c, &s, scale, false);
        let t_oracle = t0.elapsed();
        let n = s.rows * s.q_dim;
        let mut firsts = Vec::new();
        for tile in tiles {
            let ob = h.poisoned(n + TAIL);
            let ws = WinScratch::new(h, s.rows, c);
            let b = ws.binds(&qb, &mk, &mv, &mb, &ob);
            let t0 = std::time::Instant::now();
            h.run(|rec| match tile {
                Some(t) => rec.attention_window_tile(*t, codec, s.rows as u32, b, (&ws.done).into(), p),
                // The scalar tier's pick (the device's own pick may be the cooperative-matrix
                // tier, whose bar is wider: tested below).
                None => {
                    let info = &rec.gpu.info;
                    let t = WindowTile::pick(c.hd as u32, info.shared_memory, info.max_workgroup_invocations).unwrap();
                    rec.attention_window_tile(t, codec, s.rows as u32, b, (&ws.done).into(), p)
                }
            });
            let dt = t0.elapsed();
            ws.check_done(what);
            let all = ob.read_f32(0, n + TAIL).unwrap();
            assert!(all[n..].iter().all(|x| x.to_bits() == POISON), "{what}: written past the window's rows");
            let got = all[..n].to_vec();
            let r = check(&format!("{what} {codec:?} tile {tile:?}"), &got, &want, &bar).unwrap();
            eprintln!("{what} {codec:?} tile {tile:?}: {} rows, worst err/bar {r:.4}, device {dt:.2?} (oracle {t_oracle:.2?})", s.rows);
            worst = worst.max(r);
            firsts.push(got);
        }
        // Negative control (perturbed oracle): one row 1% off must fail.
        let mut wrong = want.clone();
        let r = s.rows / 2;
        wrong[r * s.q_dim..(r + 1) * s.q_dim].iter_mut().for_each(|x| *x *= 1.01);
        assert!(check("control", &firsts[0], &wrong, &bar).is_err(), "{what}: a perturbed oracle passed");
        if decode {
            let part = h.poisoned(attn_part_len(s.rows, c.n_head, c.hd, ATTN_SLOTS as usize));
            let ob = h.poisoned(n);
            let t0 = std::time::Instant::now();
            h.run(|rec| {
                rec.attention(
                    codec,
                    s.rows as u32,
                    AttnBinds { q: (&qb).into(), mk: (&mk).into(), mv: (&mv).into(), meta: (&mb).into(), part: (&part).into(), out: (&ob).into() },
                    p,
                )
            });
            let dt = t0.elapsed();
            let dec = ob.read_f32(0, n).unwrap();
            let dec64: Vec<f64> = dec.iter().map(|&x| x as f64).collect();
            let bar2: Vec<f64> = bar.iter().map(|b| 2.0 * b).collect();
            let r = check(&format!("{what} {codec:?} window vs decode"), &firsts[0], &dec64, &bar2).unwrap();
            let same = firsts[0].iter().zip(&dec).filter(|(a, b)| a.to_bits() == b.to_bits()).count();
            eprintln!("{what} {codec:?}: window vs decode kernel worst err/(2 bar) {r:.4}, {same} of {n} bit-equal (decode kernel {dt:.2?})");
        }
    }
    worst
}

fn default_and(extra: &[(u32, u32)]) -> Vec<Option<WindowTile>> {
    std::iter::once(None).chain(extra.iter().map(|&(br, bc)| Some(WindowTile { br, bc }))).collect()
}

#[test]
fn one_segment_from_position_0() {
    let Some(mut h) = Harness::new() else { return };
    let c = Case { n_head: 8, n_head_kv: 2, hd: 64, window: 0, segs: vec![(0, 0, 512)] };
    run_case(&mut h, "512 rows at 0, hd 64, gqa 8/2", &c, &default_and(&[]), true, 1);
}

#[test]
fn continuation_at_position_1000() {
    let Some(mut h) = Harness::new() else { return };
    let c = Case { n_head: 8, n_head_kv: 2, hd: 128, window: 0, segs: vec![(1, 1000, 120)] };
    run_case(&mut h, "120 rows at 1000, hd 128, gqa 8/2", &c, &default_and(&[(16, 32)]), true, 2);
}

#[test]
fn three_segments_unaligned() {
    // Three regions, boundaries at rows 37 and 237 (not multiples of any tile's rows); the
    // second segment continues at position 300, the third at 17.
    let Some(mut h) = Harness::new() else { return };
    let segs = vec![(2, 0, 37), (0, 300, 200), (1, 17, 91)];
    for hd in [64usize, 128] {
        let c = Case { n_head: 8, n_head_kv: 2, hd, window: 0, segs: segs.clone() };
        run_case(&mut h, &format!("segments 37/200/91, hd {hd}"), &c, &default_and(&[(8, 8), (32, 16)]), true, 3 + hd as u64);
    }
    // Many boundaries inside one tile (one row a region, then the same region again), and a
    // head dim of 256 with no GQA.
    let c = Case { n_head: 2, n_head_kv: 2, hd: 256, window: 0, segs: vec![(0, 5, 3), (1, 0, 1), (2, 40, 2), (0, 8, 4), (3, 2, 7), (1, 1, 20)] };
    run_case(&mut h, "6 segments in a tile, hd 256", &c, &default_and(&[(4, 4)]), true, 9);
}

#[test]
fn long_rows_split_their_keys_in_pieces() {
    // The piece size follows the key count alone: 1024 keys up to 4 x 1024, then doubling.
    for (keys, per) in [(1, 1024), (1024, 1024), (4096, 1024), (4097, 2048), (8192, 2048), (8193, 4096), (16_385, 8192)] {
        assert_eq!(window_piece_keys(keys), per, "{keys} keys");
        assert!(keys.div_ceil(per) <= WINDOW_PIECES);
    }
    // Rows of 3 pieces (keys 5001..5040), and rows on both sides of the piece size's step at
    // 4096 keys (one tile takes them as two groups), beside rows of one piece.
    let Some(mut h) = Harness::new() else { return };
    let c = Case { n_head: 4, n_head_kv: 2, hd: 64, window: 0, segs: vec![(0, 5000, 40), (1, 4080, 40), (2, 100, 20)] };
    run_case(&mut h, "split rows, hd 64", &c, &default_and(&[(8, 8)]), true, 21);
    // A row's pieces do not depend on the rows beside it: the straddling segment alone gives
    // the bits it gives beside the others (scalar tier, f16 mirror).
    let s = setup(&c, KvCodec::F16, 22);
    let bytes = |v: &[f32]| -> Vec<u8> { v.iter().flat_map(|&a| half::f16::from_f32(a).to_le_bytes()).collect() };
    let (mk, mv) = (h.buf_bytes(&bytes(&s.kvals)), h.buf_bytes(&bytes(&s.vvals)));
    let p = AttnPush { n_head: c.n_head as u32, n_head_kv: c.n_head_kv as u32, head_dim: c.hd as u32, n_pieces: 1, scale: 0.125, key_window: 0 };
    let tile = WindowTile::pick(c.hd as u32, h.gpu.info.shared_memory, h.gpu.info.max_workgroup_invocations).unwrap();
    let mut run = |meta: &[RowMeta], q: &[f32]| -> Vec<u32> {
        let (qb, mb) = (h.buf_f32(q), h.buf_bytes(&RowMeta::words(meta)));
        let ob = h.poisoned(meta.len() * s.q_dim);
        let ws = WinScratch::new(&h, meta.len(), &c);
        h.run(|rec| rec.attention_window_tile(tile, KvCodec::F16, meta.len() as u32, ws.binds(&qb, &mk, &mv, &mb, &ob), (&ws.done).into(), p));
        ws.check_done("alone");
        ob.read_f32(0, meta.len() * s.q_dim).unwrap().iter().map(|x| x.to_bits()).collect()
    };
    let full = run(&s.meta, &s.q);
    let alone = run(&s.meta[45..80], &s.q[45 * s.q_dim..80 * s.q_dim]);
    assert_eq!(full[45 * s.q_dim..80 * s.q_dim], alone[..], "a split row must not depend on the rows beside it");
    assert_ne!(full[44 * s.q_dim..79 * s.q_dim], alone[..], "control: the rows one before are other values");
}

#[test]
fn sliding_window_rows_split_their_keys() {
    // A sliding-window layer (gemma3's 512 keys) at 5,000 keys: only the last piece holds a
    // row's keys (the others merge in empty); at 4,200 its window straddles two pieces.
    let Some(mut h) = Harness::new() else { return };
    let c = Case { n_head: 4, n_head_kv: 2, hd: 64, window: 512, segs: vec![(0, 5000, 24), (1, 4180, 40), (2, 300, 20)] };
    run_case(&mut h, "sliding window 512, split rows", &c, &default_and(&[(8, 8)]), true, 23);
}

#[test]
fn wrong_region_fails() {
    // Negative control on the device side: one row given another region's kv_base must fail.
    let Some(mut h) = Harness::new() else { return };
    let c = Case { n_head: 4, n_head_kv: 2, hd: 64, window: 0, segs: vec![(0, 0, 40), (1, 10, 30)] };
    let codec = KvCodec::F16;
    let s = setup(&c, codec, 5);
    let scale = 1.0 / (c.hd as f32).sqrt();
    // attention_window runs the tier the device gets (the coopmat one where offered): its bar.
    let cm = resin_vulkan::attn_window::coopmat_ok(&h.gpu.info, codec, c.hd as u32);
    let (want, bar) = oracle(&c, &s, scale, cm);
    let bytes = |v: &[f32]| -> Vec<u8> { v.iter().flat_map(|&a| half::f16::from_f32(a).to_le_bytes()).collect() };
    let (mk, mv) = (h.buf_bytes(&bytes(&s.kvals)), h.buf_bytes(&bytes(&s.vvals)));
    let qb = h.buf_f32(&s.q);
    let p = AttnPush { n_head: c.n_head as u32, n_head_kv: c.n_head_kv as u32, head_dim: c.hd as u32, n_pieces: 1, scale, key_window: 0 };
    let n = s.rows * s.q_dim;
    for bad in [false, true] {
        let mut meta = s.meta.clone();
        if bad {
            meta[45].kv_base = s.meta[0].kv_base; // row 45 is in region 1
        }
        let mb = h.buf_bytes(&RowMeta::words(&meta));
        let ob = h.poisoned(n);
        let ws = WinScratch::new(&h, s.rows, &c);
        h.run(|rec| rec.attention_window(codec, s.rows as u32, ws.binds(&qb, &mk, &mv, &mb, &ob), (&ws.done).into(), p));
        ws.check_done("wrong region");
        let got = ob.read_f32(0, n).unwrap();
        let res = check("wrong region", &got, &want, &bar);
        assert_eq!(res.is_err(), bad, "{res:?}");
    }
    let _ = s.n_ctx;
}

#[test]
fn tile_pick() {
    // Every pick fits (shared memory within the device's limit and the 48 KiB cap, the
    // accumulators within the threads, the threads within the device's limit).
    for shared in [16 * 1024u32, 32 * 1024, 48 * 1024, 64 * 1024] {
        for max_wg in [128u32, 256, 1024] {
            for hd in (2..=256).step_by(2) {
                let t = WindowTile::pick(hd, shared, max_wg).unwrap();
                assert!(t.fits(hd, shared, max_wg) && t.shared_bytes(hd) <= shared.min(48 * 1024) && t.wg(hd) <= max_wg, "{hd} {shared} {t:?}");
            }
        }
    }
    let t = |br, bc| Some(WindowTile { br, bc });
    // lavapipe: 32 KiB, 1024 threads; an H200: 48 KiB, 1024 threads.
    assert_eq!(WindowTile::pick(64, 32 * 1024, 1024), t(32, 32));
    assert_eq!(WindowTile::pick(128, 32 * 1024, 1024), t(32, 16));
    assert_eq!(WindowTile::pick(128, 48 * 1024, 1024), t(32, 32));
    assert_eq!(WindowTile::pick(128, 48 * 1024, 128), t(16, 32));
    assert_eq!(WindowTile::pick(256, 32 * 1024, 1024), t(16, 8));
    assert_eq!(WindowTile { br: 32, bc: 32 }.wg(64), 128);
    assert_eq!(WindowTile { br: 32, bc: 32 }.wg(128), 256);
    // The cooperative-matrix tile (a subgroup a strip of 16 rows): the most strips, then the
    // most keys, whose shared memory fits the device's and the cap; none where none fits.
    use resin_vulkan::attn_window::{coopmat_shared_bytes, coopmat_tile};
    let cm = |br, bc| Some(WindowTile { br, bc });
    assert_eq!(coopmat_tile(64, 48 * 1024), cm(64, 64));
    assert_eq!(coopmat_tile(64, 228 * 1024), cm(64, 64));
    assert_eq!(coopmat_tile(128, 228 * 1024), cm(32, 32));
    assert_eq!(coopmat_tile(256, 48 * 1024), None);
    assert_eq!(coopmat_tile(64, 32 * 1024), cm(32, 32));
    assert_eq!(coopmat_tile(256, 16 * 1024), None);
    for shared in [16 * 1024u32, 32 * 1024, 48 * 1024, 228 * 1024] {
        for hd in (16..=256).step_by(16) {
            if let Some(t) = coopmat_tile(hd, shared) {
                assert!(coopmat_shared_bytes(t, hd) <= shared.min(48 * 1024), "{hd} {shared} {t:?}");
            }
        }
    }
}

/// The cooperative-matrix tier over `meta`'s rows with queries `q` on `s`'s K/V (f16 mirror):
/// the outputs, and that nothing past them was written.
fn coopmat_raw(h: &mut Harness, c: &Case, s: &Setup, meta: &[RowMeta], q: &[f32]) -> Vec<f32> {
    let bytes = |v: &[f32]| -> Vec<u8> { v.iter().flat_map(|&a| half::f16::from_f32(a).to_le_bytes()).collect() };
    let (mk, mv) = (h.buf_bytes(&bytes(&s.kvals)), h.buf_bytes(&bytes(&s.vvals)));
    let mb = h.buf_bytes(&RowMeta::words(meta));
    let qb = h.buf_f32(q);
    let scale = 1.0 / (c.hd as f32).sqrt();
    let p = AttnPush { n_head: c.n_head as u32, n_head_kv: c.n_head_kv as u32, head_dim: c.hd as u32, n_pieces: 1, scale, key_window: 0 };
    let n = meta.len() * s.q_dim;
    let ob = h.poisoned(n + TAIL);
    let ws = WinScratch::new(h, meta.len(), c);
    h.run(|rec| rec.attention_window_coopmat(meta.len() as u32, ws.binds(&qb, &mk, &mv, &mb, &ob), (&ws.done).into(), p));
    ws.check_done("coopmat");
    let all = ob.read_f32(0, n + TAIL).unwrap();
    assert!(all[n..].iter().all(|x| x.to_bits() == POISON), "coopmat: written past the window's rows");
    all[..n].to_vec()
}

/// The cooperative-matrix tier on `c` against the oracle with its bar, and a control.
fn run_coopmat(h: &mut Harness, what: &str, c: &Case, seed: u64) {
    let s = setup(c, KvCodec::F16, seed);
    let scale = 1.0 / (c.hd as f32).sqrt();
    let (want, bar) = oracle(c, &s, scale, true);
    let got = coopmat_raw(h, c, &s, &s.meta, &s.q);
    let r = check(&format!("{what} coopmat"), &got, &want, &bar).unwrap();
    eprintln!("{what} coopmat: {} rows, worst err/bar {r:.4}", s.rows);
    // Control: the kernel with a masking bug (one row's causal span cut to half its keys) fails
    // the bar. (A 1% error of one row's outputs is within the f16 bar: the bar scales with the
    // largest |v|, an output with the average of many.)
    let mut meta = s.meta.clone();
    let rr = s.rows / 2;
    meta[rr].keys = meta[rr].keys.div_ceil(2);
    let bad = coopmat_raw(h, c, &s, &meta, &s.q);
    assert!(check("control", &bad, &want, &bar).is_err(), "{what}: half a row's keys passed the bar");
}

#[test]
fn coopmat_tier_where_offered() {
    let Some(mut h) = Harness::new() else { return };
    if !resin_vulkan::attn_window::coopmat_ok(&h.gpu.info, KvCodec::F16, 64) {
        eprintln!("SKIP: {} has no 16x16x16 f16 x f16 -> f32 cooperative matrix; the coopmat window attention was not run", h.gpu.info.name);
        return;
    }
    run_coopmat(&mut h, "512 rows at 0, hd 64, gqa 8/2", &Case { n_head: 8, n_head_kv: 2, hd: 64, window: 0, segs: vec![(0, 0, 512)] }, 1);
    run_coopmat(&mut h, "120 rows at 1000, hd 128, gqa 8/2", &Case { n_head: 8, n_head_kv: 2, hd: 128, window: 0, segs: vec![(1, 1000, 120)] }, 2);
    // A long walk (three key pieces; the outputs rescaled only on the key tiles where a row's
    // maximum moves).
    run_coopmat(&mut h, "72 rows at 3000, hd 64, gqa 8/2", &Case { n_head: 8, n_head_kv: 2, hd: 64, window: 0, segs: vec![(0, 3000, 72)] }, 4);
    // The middle segment's rows straddle the piece size's step at 4096 keys.
    let c = Case { n_head: 8, n_head_kv: 2, hd: 64, window: 0, segs: vec![(2, 0, 37), (0, 4000, 200), (1, 17, 91)] };
    run_coopmat(&mut h, "segments 37/200/91, hd 64", &c, 3);
    // Tile independence: the middle segment's rows alone (rows 0..200 of their own window: the
    // same queries, K/V and metadata) give the bits they give at rows 37..237 beside the others.
    let s = setup(&c, KvCodec::F16, 3);
    let full = coopmat_raw(&mut h, &c, &s, &s.meta, &s.q);
    let alone = coopmat_raw(&mut h, &c, &s, &s.meta[37..237], &s.q[37 * s.q_dim..237 * s.q_dim]);
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
    assert_eq!(bits(&full[37 * s.q_dim..237 * s.q_dim]), bits(&alone), "a segment's rows must not depend on the rows beside them");
    // Control: the rows one further along are other values.
    assert_ne!(bits(&full[38 * s.q_dim..238 * s.q_dim]), bits(&alone));
}
