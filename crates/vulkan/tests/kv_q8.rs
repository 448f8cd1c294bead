//! The q8_0 K/V mirror on the Vulkan home (lavapipe in CI):
//! - rope_store's q8_0 blocks equal the CPU home's quantization (resin_gguf quantize_into, as
//!   crates/cpu/src/kv.rs stores them) of the same roped values bit for bit, every byte of a
//!   poisoned mirror checked, heads whose blocks start mid-word included;
//! - decode and window attention over a q8_0 mirror against the f64 oracle over the
//!   dequantized keys and values, and bit for bit the f32 mirror's attention over those values;
//! - the model (SmolLM2-135M) with the q8_0 mirror on each home: greedy ids equal, logits within
//!   a relative-L2 bar, and a region's snapshot saved on one home loads on the other.

mod common;

use std::sync::Arc;

use common::*;
use resin_core::{Counters, Home, KvCodec, RegionId, Row, Segment, StepAll};
use resin_cpu::{CpuHome, CpuOptions};
use resin_gguf::{formats, GgmlType, GgufFile};
use resin_model::{ModelConfig, RopeStyle, Tokenizer};
use resin_vulkan::attn_window::{WindowTile, WINDOW_PIECES};
use resin_vulkan::buffers::{Buffer, Location};
use resin_vulkan::kernels::*;
use resin_vulkan::{VulkanHome, VulkanOptions, WideMode};

fn q8(v: &[f32]) -> Vec<u8> {
    let mut out = vec![0u8; v.len() / 32 * 34];
    formats::quantize_into(GgmlType::Q8_0, v, &mut out).unwrap();
    out
}

fn dq8(b: &[u8], n: usize) -> Vec<f32> {
    let mut out = vec![0f32; n];
    formats::dequantize(GgmlType::Q8_0, b, &mut out).unwrap();
    out
}

/// The first byte where `got` and `want` differ.
fn first_mismatch(got: &[u8], want: &[u8]) -> Option<usize> {
    if got.len() != want.len() {
        return Some(got.len().min(want.len()));
    }
    got.iter().zip(want).position(|(a, b)| a != b)
}

/// Values that test the quantization's corners, 32 a block: ties of x / d (d = 1 and d = 3),
/// zeros, a scale that is an f16 subnormal, one that is an f32 subnormal, an amax whose scale
/// overflows f16, and random blocks over 2^-40 .. 2^40.
fn corner_blocks(rng: &mut Rng, n_blocks: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(n_blocks * 32);
    for b in 0..n_blocks {
        let mut blk: Vec<f32> = rng.vec(32, 1.0);
        match b % 8 {
            0 => {
                blk[0] = 127.0;
                for (i, x) in blk.iter_mut().enumerate().skip(1) {
                    *x = (i as f32 - 16.0) * 0.5 + if i % 3 == 0 { 0.25 } else { 0.0 };
                }
            }
            1 => {
                blk[0] = -381.0; // d = 3
                for (i, x) in blk.iter_mut().enumerate().skip(1) {
                    *x = 1.5 * (i as f32 - 16.0);
                }
            }
            2 => blk.iter_mut().for_each(|x| *x = 0.0),
            3 => blk.iter_mut().for_each(|x| *x *= 1e-3),
            4 => {
                // amax 6.2e-37: d is an f32 subnormal (and 0 as f16), the values normal.
                for (i, x) in blk.iter_mut().enumerate() {
                    *x = (i as f32 - 15.5) * 4e-38;
                }
            }
            5 => blk.iter_mut().for_each(|x| *x *= 2e7),
            _ => {
                let e = (rng.next_u64() % 81) as i32 - 40;
                blk.iter_mut().for_each(|x| *x *= 2f32.powi(e));
            }
        }
        out.extend(blk);
    }
    out
}

#[test]
fn rope_store_q8_blocks_equal_the_cpu_quantization_bit_for_bit() {
    // The q8_0 form must write exactly formats::quantize_into(Q8_0) of the values the f32 form
    // writes (same rope arithmetic), every byte of the mirror checked: the rows' blocks, and
    // poison left everywhere else. Head dims 64 (two blocks a head: heads start at even
    // blocks, whole words), 32 and 96 (odd block counts: every other head starts in the middle
    // of a 32-bit word shared with a neighbour, merged by atomics), with neighbouring positions
    // of one region in one dispatch and a row next to one written by an earlier dispatch.
    let Some(mut h) = Harness::new() else { return };
    let mut rng = Rng(808);
    for (n_head, n_head_kv, hd, style, flags, rope_dims) in [
        (4usize, 2usize, 64usize, RopeStyle::Norm, 0u32, 64usize),
        (3, 3, 32, RopeStyle::Neox, ROPE_BIAS, 32),
        (2, 1, 96, RopeStyle::Norm, ROPE_QK_NORM, 64),
        (2, 3, 32, RopeStyle::Norm, 0, 16),
    ] {
        let (q_dim, kv_dim, n_ctx) = (n_head * hd, n_head_kv * hd, 24usize);
        // rows: (pos, region); regions of n_ctx positions. Dispatch 1 then dispatch 2.
        let first: Vec<(u32, u32)> = vec![(7, 0), (8, 0), (9, 0), (0, 1), (23, 2)];
        let second: Vec<(u32, u32)> = vec![(6, 0), (10, 0), (1, 1)];
        let mirror_elems = 3 * n_ctx * kv_dim;
        let bias = rng.vec(q_dim + 2 * kv_dim, 0.5);
        let norm = rng.vec(2 * hd, 1.0);
        let table = resin_vulkan::home::rope_table(n_ctx, rope_dims, 10000.0);
        let p = RopePush { n_head: n_head as u32, n_head_kv: n_head_kv as u32, head_dim: hd as u32, rope_dims: rope_dims as u32, flags, eps: 1e-6 };
        let (bb, nb, tb) = (h.buf_f32(&bias), h.buf_f32(&norm), h.buf_f32(&table));
        let mut mk8 = Buffer::new(&h.gpu, (mirror_elems / 32 * 34) as u64, Location::Device).unwrap();
        let mut mv8 = Buffer::new(&h.gpu, (mirror_elems / 32 * 34) as u64, Location::Device).unwrap();
        mk8.fill_u32(POISON).unwrap();
        mv8.fill_u32(POISON).unwrap();
        let total = (mirror_elems / 32 * 34).next_multiple_of(4);
        let mut want_k: Vec<u8> = std::iter::repeat_n(POISON.to_le_bytes(), total / 4).flatten().collect();
        let mut want_v = want_k.clone();
        for rows in [&first, &second] {
            let n = rows.len();
            let q = rng.vec(n * q_dim, 2.0);
            let k = rng.vec(n * kv_dim, 2.0);
            let v = if flags == 0 { corner_blocks(&mut rng, n * kv_dim / 32) } else { rng.vec(n * kv_dim, 2.0) };
            let meta: Vec<RowMeta> = rows.iter().map(|&(pos, reg)| RowMeta { token: 0, pos, kv_base: reg * (n_ctx * kv_dim) as u32, keys: pos + 1 }).collect();
            let mb = h.buf_bytes(&RowMeta::words(&meta));
            let (kb, vb) = (h.buf_f32(&k), h.buf_f32(&v));
            // The f32 form: the exact values the q8_0 form quantizes.
            let q32 = h.buf_f32(&q);
            let mk32 = h.poisoned(mirror_elems);
            let mv32 = h.poisoned(mirror_elems);
            h.run(|rec| {
                rec.rope_store(
                    style,
                    KvCodec::F32,
                    n as u32,
                    [(&q32).into(), (&kb).into(), (&vb).into(), (&bb).into(), (&nb).into(), (&tb).into(), (&mb).into(), (&mk32).into(), (&mv32).into()],
                    p,
                )
            });
            let (gk32, gv32) = (mk32.read_f32(0, mirror_elems).unwrap(), mv32.read_f32(0, mirror_elems).unwrap());
            let q8b = h.buf_f32(&q);
            h.run(|rec| {
                rec.rope_store(
                    style,
                    KvCodec::Q8_0,
                    n as u32,
                    [(&q8b).into(), (&kb).into(), (&vb).into(), (&bb).into(), (&nb).into(), (&tb).into(), (&mb).into(), (&mk8).into(), (&mv8).into()],
                    p,
                )
            });
            // q is roped in place the same way in both forms.
            assert!(bits_equal(&q8b.read_f32(0, n * q_dim).unwrap(), &q32.read_f32(0, n * q_dim).unwrap()), "hd {hd}: q differs between the forms");
            for &(pos, reg) in rows.iter() {
                let at = reg as usize * n_ctx * kv_dim + pos as usize * kv_dim;
                let b = at / 32 * 34;
                want_k[b..b + kv_dim / 32 * 34].copy_from_slice(&q8(&gk32[at..at + kv_dim]));
                want_v[b..b + kv_dim / 32 * 34].copy_from_slice(&q8(&gv32[at..at + kv_dim]));
            }
        }
        let (mut gk, mut gv) = (vec![0u8; total], vec![0u8; total]);
        mk8.read(0, &mut gk).unwrap();
        mv8.read(0, &mut gv).unwrap();
        let what = format!("hd {hd} {style:?} flags {flags}");
        assert_eq!(first_mismatch(&gk, &want_k), None, "{what}: K mirror byte differs from the CPU's quantization");
        assert_eq!(first_mismatch(&gv, &want_v), None, "{what}: V mirror byte differs from the CPU's quantization");
        // Control: one quant of a written block one step off is caught, and so is a d.
        let at = (8 * kv_dim) / 32 * 34;
        let mut wrong = want_k.clone();
        wrong[at + 2 + 5] = wrong[at + 2 + 5].wrapping_add(1);
        assert_eq!(first_mismatch(&gk, &wrong), Some(at + 7), "control: a one-step quant must fail");
        let mut wrong = want_v.clone();
        wrong[at] ^= 1;
        assert_eq!(first_mismatch(&gv, &wrong), Some(at), "control: a one-ulp scale must fail");
        eprintln!("{what}: {} bytes of each mirror equal the CPU quantization", total);
    }
}

/// Keys and values quantized to q8_0 as the CPU home stores them: (bytes, dequantized).
fn q8_mirror(rng: &mut Rng, elems: usize) -> (Vec<u8>, Vec<f32>, Vec<f32>) {
    let raw = rng.vec(elems, 2.0);
    let b = q8(&raw);
    let d = dq8(&b, elems);
    (b, d, raw)
}

/// f64 softmax attention of every row and head over `kv` (keys, values), with the bar of each
/// element: (2 ds + (keys + hd + 32) u) * max|v|, ds = (hd + 4) u max_j sum_i |q_i k_ji| scale
/// (tests/kernels.rs and tests/attn_window.rs: the f32 dot products, sums and exp's ulps).
#[allow(clippy::too_many_arguments)]
fn oracle(n_head: usize, n_head_kv: usize, hd: usize, meta: &[RowMeta], q: &[f32], kvals: &[f32], vvals: &[f32], scale: f32) -> (Vec<f64>, Vec<f64>) {
    let (kv_dim, q_dim) = (n_head_kv * hd, n_head * hd);
    let mut want = vec![0f64; meta.len() * q_dim];
    let mut bar = vec![0f64; meta.len() * q_dim];
    for (r, m) in meta.iter().enumerate() {
        let keys = m.keys as usize;
        for hh in 0..n_head {
            let g = hh / (n_head / n_head_kv);
            let qh = &q[r * q_dim + hh * hd..r * q_dim + (hh + 1) * hd];
            let base = m.kv_base as usize + g * hd;
            let mut s = vec![0f64; keys];
            let mut ds = 0f64;
            for (j, sj) in s.iter_mut().enumerate() {
                let kr = &kvals[base + j * kv_dim..base + j * kv_dim + hd];
                *sj = qh.iter().zip(kr).map(|(a, b)| *a as f64 * *b as f64).sum::<f64>() * scale as f64;
                ds = f64::max(ds, (hd as f64 + 4.0) * U * qh.iter().zip(kr).map(|(a, b)| (*a as f64 * *b as f64).abs()).sum::<f64>() * scale as f64);
            }
            let mx = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let w: Vec<f64> = s.iter().map(|x| (x - mx).exp()).collect();
            let l: f64 = w.iter().sum();
            let mut vmax = 0f64;
            for d in 0..hd {
                let mut a = 0f64;
                for (j, wj) in w.iter().enumerate() {
                    let vx = vvals[base + j * kv_dim + d] as f64;
                    a += wj * vx;
                    vmax = vmax.max(vx.abs());
                }
                want[r * q_dim + hh * hd + d] = a / l;
            }
            for d in 0..hd {
                bar[r * q_dim + hh * hd + d] = (2.0 * ds + (keys as f64 + hd as f64 + 32.0) * U) * vmax + 1e-30;
            }
        }
    }
    (want, bar)
}

#[test]
fn attention_over_a_q8_mirror_matches_the_oracle_over_its_dequantized_values() {
    // Decode (several workgroup counts a head) and window attention (two tiles and the
    // device's pick) over q8_0 keys and values. Bar: the f32 kernels' bar over the exact values
    // the device reads, which are the dequantized ones (d * q in f32, as the CPU's dequantize):
    // the kernels read q8_0 as exact f32 values, so nothing is added for the codec. The q8_0
    // kernels must also equal the f32 mirror's kernels over the dequantized values bit for bit
    // (the same arithmetic after the read). Control: the oracle over the values before
    // quantization (an error of up to amax/254 a value) must fail the bar.
    let Some(mut h) = Harness::new() else { return };
    let mut rng = Rng(909);
    for (n_head, n_head_kv, hd) in [(6usize, 2usize, 64usize), (2, 1, 96)] {
        let (kv_dim, q_dim, n_ctx, regions) = (n_head_kv * hd, n_head * hd, 320usize, 2usize);
        let elems = regions * n_ctx * kv_dim;
        let (kb8, kd, kraw) = q8_mirror(&mut rng, elems);
        let (vb8, vd, vraw) = q8_mirror(&mut rng, elems);
        let (mk8, mv8) = (h.buf_bytes(&kb8), h.buf_bytes(&vb8));
        let (mk32, mv32) = (h.buf_f32(&kd), h.buf_f32(&vd));
        let scale = 1.0 / (hd as f32).sqrt();
        let p = |pieces: u32| AttnPush { n_head: n_head as u32, n_head_kv: n_head_kv as u32, head_dim: hd as u32, n_pieces: pieces, scale, key_window: 0 };
        // Decode: rows (keys, region).
        let rr = [(1usize, 0usize), (300, 1), (77, 0), (129, 1), (64, 0)];
        let meta: Vec<RowMeta> = rr.iter().map(|&(keys, reg)| RowMeta { token: 0, pos: keys as u32 - 1, kv_base: (reg * n_ctx * kv_dim) as u32, keys: keys as u32 }).collect();
        let q = rng.vec(rr.len() * q_dim, 1.0);
        let (want, bar) = oracle(n_head, n_head_kv, hd, &meta, &q, &kd, &vd, scale);
        let (mb, qb) = (h.buf_bytes(&RowMeta::words(&meta)), h.buf_f32(&q));
        let n = rr.len();
        let decode = |h: &mut Harness, codec: KvCodec, pieces: u32| -> Vec<f32> {
            let (mk, mv) = if codec == KvCodec::Q8_0 { (&mk8, &mv8) } else { (&mk32, &mv32) };
            let part = h.poisoned(attn_part_len(n, n_head, hd, ATTN_SLOTS as usize));
            let ob = h.poisoned(n * q_dim);
            h.run(|rec| {
                rec.attention(codec, n as u32, AttnBinds { q: (&qb).into(), mk: mk.into(), mv: mv.into(), meta: (&mb).into(), part: (&part).into(), out: (&ob).into() }, p(pieces))
            });
            ob.read_f32(0, n * q_dim).unwrap()
        };
        let f32_ref = decode(&mut h, KvCodec::F32, 1);
        for pieces in [1u32, 4, 32] {
            let got = decode(&mut h, KvCodec::Q8_0, pieces);
            let r = check(&format!("decode hd {hd} pieces {pieces}"), &got, &want, &bar).unwrap();
            eprintln!("decode over q8_0, hd {hd}, {pieces} workgroups a head: worst err/bar {r:.3}");
            assert!(bits_equal(&got, &f32_ref), "decode hd {hd}: the q8_0 mirror differs from the f32 mirror of its values");
        }
        let (raw_want, _) = oracle(n_head, n_head_kv, hd, &meta, &q, &kraw, &vraw, scale);
        assert!(check("control", &f32_ref, &raw_want, &bar).is_err(), "control: the unquantized oracle must fail the bar");

        // Window: two segments (region, first position, rows) in one window.
        let segs = [(0usize, 0usize, 40usize), (1, 250, 30)];
        let mut wmeta = Vec::new();
        for &(reg, start, len) in &segs {
            for i in 0..len {
                let pos = (start + i) as u32;
                wmeta.push(RowMeta { token: 0, pos, kv_base: (reg * n_ctx * kv_dim) as u32, keys: pos + 1 });
            }
        }
        let rows = wmeta.len();
        let wq = rng.vec(rows * q_dim, 1.0);
        let (want, bar) = oracle(n_head, n_head_kv, hd, &wmeta, &wq, &kd, &vd, scale);
        let (wmb, wqb) = (h.buf_bytes(&RowMeta::words(&wmeta)), h.buf_f32(&wq));
        let window = |h: &mut Harness, codec: KvCodec, tile: Option<WindowTile>| -> Vec<f32> {
            let (mk, mv) = if codec == KvCodec::Q8_0 { (&mk8, &mv8) } else { (&mk32, &mv32) };
            let ob = h.poisoned(rows * q_dim);
            let part = h.poisoned(attn_part_len(rows, n_head, hd, WINDOW_PIECES as usize));
            let done = h.buf_bytes(&vec![0u8; 4 * rows * n_head]);
            let b = AttnBinds { q: (&wqb).into(), mk: mk.into(), mv: mv.into(), meta: (&wmb).into(), part: (&part).into(), out: (&ob).into() };
            h.run(|rec| match tile {
                Some(t) => rec.attention_window_tile(t, codec, rows as u32, b, (&done).into(), p(1)),
                None => rec.attention_window(codec, rows as u32, b, (&done).into(), p(1)),
            });
            ob.read_f32(0, rows * q_dim).unwrap()
        };
        for tile in [None, Some(WindowTile { br: 8, bc: 8 }), Some(WindowTile { br: 4, bc: 4 })] {
            let got = window(&mut h, KvCodec::Q8_0, tile);
            let r = check(&format!("window hd {hd} tile {tile:?}"), &got, &want, &bar).unwrap();
            eprintln!("window over q8_0, hd {hd}, tile {tile:?}: worst err/bar {r:.3}");
            assert!(bits_equal(&got, &window(&mut h, KvCodec::F32, tile)), "window hd {hd} tile {tile:?}: the q8_0 mirror differs from the f32 mirror of its values");
        }
        let (raw_want, _) = oracle(n_head, n_head_kv, hd, &wmeta, &wq, &kraw, &vraw, scale);
        assert!(check("control", &window(&mut h, KvCodec::Q8_0, None), &raw_want, &bar).is_err(), "control: the unquantized oracle must fail the bar");
    }
}

#[test]
fn q8_mirror_head_dims_not_a_multiple_of_32_are_refused() {
    let Some(mut h) = Harness::new() else { return };
    let b = h.poisoned(64);
    let p = AttnPush { n_head: 1, n_head_kv: 1, head_dim: 48, n_pieces: 1, scale: 1.0, key_window: 0 };
    let gpu = h.gpu.clone();
    let mut res = Ok(());
    resin_vulkan::buffers::submit_once(&gpu, |cmd| {
        let mut rec = Recorder::new(&gpu, &mut h.pipes, &mut h.desc, cmd);
        res = rec.attention(KvCodec::Q8_0, 1, AttnBinds { q: (&b).into(), mk: (&b).into(), mv: (&b).into(), meta: (&b).into(), part: (&b).into(), out: (&b).into() }, p);
    })
    .unwrap();
    let e = res.expect_err("head dim 48 over a q8_0 mirror");
    assert!(e.to_string().contains("multiple of 32"), "{e}");
}

const MODEL: &str = "smollm2-135m";

/// Relative-L2 bar of the Vulkan home's logits against the CPU home's, both with the q8_0
/// mirror. Both round activations to 8 bits in different summation orders, so an ulp of
/// difference upstream flips an occasional rounding (a step of amax/127), and the q8_0 mirror
/// adds flips of its own: a K/V value an ulp apart can land on the other side of a quant step
/// (measured on this prompt: the homes' layer-0 K/V 98% equal bytes, relative L2 1e-3, growing
/// to 3.7e-2 by layer 29, against 2e-4 .. 3e-2 for the f16 mirror). Measured on this 50-token
/// prompt: 5.3e-2 (the f16 mirror's homes: 3.6e-2; the CPU home's own q8_0 mirror against its
/// f16 mirror: 4.6e-2; a 1-token prompt: 1.8e-6, where no flip has had room to compound).
/// The flips make the figure chaotic: the tenth session's window attention, whose outputs
/// differ from the old kernel's in summation order only (closer to the CPU home: the f16
/// mirror's 600-token prefill went 1.3e-2 -> 9.2e-3, this test's q8_0 snapshots 2.51e-2 ->
/// 2.46e-2), moved this prompt's logits 5.3e-2 -> 9.95e-2 and a step's 6.3e-2 -> 1.01e-1. The
/// bar is 2e-1, twice the worst measured; greedy ids must be equal too, and the controls sit
/// far past it (measured 0.70 and 1.19).
const Q8_BAR: f64 = 2e-1;

#[test]
fn the_q8_mirror_on_each_home_gives_the_same_ids_and_snapshots_cross_over() {
    let Some(gpu) = common::gpu() else { return };
    let path = resin_hub::ensure(MODEL, false).unwrap_or_else(|e| panic!("fetching {MODEL}: {e}"));
    let file = Arc::new(GgufFile::open(&path).unwrap());
    let cfg = ModelConfig::from_gguf(&file).unwrap();
    let tok = Tokenizer::from_gguf(&file).unwrap();
    let n_ctx = 128;
    let cpu = || {
        CpuHome::new(file.clone(), cfg.clone(), &CpuOptions { n_ctx: Some(n_ctx), regions: 2, codec: KvCodec::Q8_0, threads: None, progress: None }, Arc::new(Counters::default()))
            .unwrap()
    };
    let vopts = VulkanOptions { n_ctx: Some(n_ctx), regions: 2, codec: KvCodec::Q8_0, q8_activations: true, progress: None, wide: WideMode::Lanes, ..VulkanOptions::default() };
    let mut vk = VulkanHome::on(gpu, file.clone(), cfg.clone(), &vopts, Arc::new(Counters::default())).unwrap();
    let mut c = cpu();
    // A counting prompt: wide top-2 margins, so greedy cannot flip on 8-bit noise.
    let prompt = tok.encode("1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15,", true, false).unwrap();
    let n = prompt.len();
    let seg = [Segment { region: RegionId(0), start: 0, tokens: &prompt }];
    let lv = vk.prefill(&seg).unwrap();
    let lc = c.prefill(&seg).unwrap();
    let e = rel_l2(lv.row(0), lc.row(0));
    eprintln!("q8_0 mirror, {n}-token prefill: logits relative L2 {e:.2e} against the CPU home (bar {Q8_BAR:.0e})");
    assert!(e < Q8_BAR, "prefill logits {e} past {Q8_BAR}");
    // Control: the logits of the prompt without its last token fail the bar.
    let lo = cpu().prefill(&[Segment { region: RegionId(0), start: 0, tokens: &prompt[..n - 1] }]).unwrap();
    let control = rel_l2(lv.row(0), lo.row(0));
    eprintln!("control (the prompt without its last token): relative L2 {control:.2e}");
    assert!(control >= Q8_BAR, "control: another prompt's logits must fail the bar");

    // The snapshots after the prompt: the same layout and length. Layer 0's K/V are computed
    // from the same 8-bit activations on both homes, so its bytes are nearly all equal
    // (measured 98%: an ulp apart lands on the other side of a quant step now and then); the
    // later layers' inherit the activation flips (about 35-65% equal bytes, dequantized
    // relative L2 up to 3.7e-2 a layer), so the whole snapshot is held to the logits' bar.
    let sv = vk.save_region(RegionId(0), n).unwrap();
    let sc = c.save_region(RegionId(0), n).unwrap();
    assert_eq!(sv.len(), sc.len());
    let side = n * cfg.kv_dim() / 32 * 34;
    let eq0 = sv[..2 * side].iter().zip(&sc[..2 * side]).filter(|(a, b)| a == b).count() as f64 / (2 * side) as f64;
    let (dv, dc) = (dq8(&sv, sv.len() / 34 * 32), dq8(&sc, sc.len() / 34 * 32));
    let es = rel_l2(&dv, &dc);
    eprintln!("q8_0 snapshots of {n} positions ({} bytes): layer 0 {:.2}% equal bytes, dequantized relative L2 {es:.2e}", sv.len(), 100.0 * eq0);
    assert!(eq0 > 0.95, "layer 0 of the homes' q8_0 snapshots: only {eq0} of the bytes equal");
    assert!(es < Q8_BAR, "the homes' q8_0 snapshots: relative L2 {es}");
    // Cross over: the Vulkan snapshot into a fresh CPU home, the CPU snapshot into the Vulkan
    // home's region 1; then 8 greedy steps on all four (region, home) pairs.
    let mut c2 = cpu();
    c2.load_region(RegionId(0), n, &sv).unwrap();
    vk.load_region(RegionId(1), n, &sc).unwrap();
    let t0 = argmax(lc.row(0));
    assert_eq!(argmax(lv.row(0)), t0);
    let (mut tv, mut tc, mut tc2, mut tv1) = (t0, t0, t0, t0);
    let mut ids = [vec![t0], vec![t0], vec![t0], vec![t0]];
    let mut worst = 0f64;
    let mut first: Option<Vec<f32>> = None;
    for i in 0..8u32 {
        let pos = n as u32 + i;
        let v = vk.step_logits(&[Row { region: RegionId(0), token: tv, pos }, Row { region: RegionId(1), token: tv1, pos }]).unwrap();
        let a = c.step_logits(&[Row { region: RegionId(0), token: tc, pos }]).unwrap();
        let b = c2.step_logits(&[Row { region: RegionId(0), token: tc2, pos }]).unwrap();
        if first.is_none() {
            first = Some(a.row(0).to_vec());
        }
        // Each step's logits against the CPU home's: the Vulkan home on its own K/V, the CPU
        // home on the Vulkan K/V, the Vulkan home on the CPU K/V.
        for (what, x) in [("vulkan", v.row(0)), ("cpu on the vulkan snapshot", b.row(0)), ("vulkan on the cpu snapshot", v.row(1))] {
            let e = rel_l2(x, a.row(0));
            eprintln!("step {i}, {what}: relative L2 {e:.2e}");
            worst = worst.max(e);
            assert!(e < Q8_BAR, "step {i}, {what}: logits relative L2 {e} past {Q8_BAR}");
        }
        (tv, tv1, tc, tc2) = (argmax(v.row(0)), argmax(v.row(1)), argmax(a.row(0)), argmax(b.row(0)));
        for (k, t) in [tv, tc, tc2, tv1].into_iter().enumerate() {
            ids[k].push(t);
        }
    }
    eprintln!("q8_0 mirror: greedy ids vulkan {:?} cpu {:?}; worst step logits relative L2 {worst:.2e}", ids[0], ids[1]);
    assert_eq!(ids[0], ids[1], "vulkan vs cpu greedy ids");
    assert_eq!(ids[2], ids[1], "cpu on the vulkan snapshot vs cpu");
    assert_eq!(ids[3], ids[1], "vulkan on the cpu snapshot vs cpu");
    // Control: a CPU home that loaded no snapshot (zeros at the prompt's positions) fails the
    // bar against the first step's logits.
    let z = cpu().step_logits(&[Row { region: RegionId(0), token: t0, pos: n as u32 }]).unwrap();
    let a0 = first.expect("the first step ran");
    let control = rel_l2(z.row(0), &a0);
    eprintln!("control (a step without the prompt's K/V): relative L2 {control:.2e}");
    assert!(control >= Q8_BAR, "control: logits without the prompt's K/V must fail the bar");
}
