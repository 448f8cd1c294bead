//! The serving rules on the CPU home, on the real SmolLM2: N rows equal each row alone,
//! segments equal each session alone, the peel equals the window chain, a continuation equals
//! a fresh prefill of the whole transcript. All bit-exact: the CPU home fixes the reduction
//! order of every output element, so batching must not change a single bit.

mod common;

use std::sync::atomic::Ordering;
use std::sync::Arc;

use resin_core::{Counters, Home, KvCodec, RegionId, Row, Segment, StepAll};
use resin_cpu::{CpuHome, CpuOptions};
use resin_gguf::GgufFile;
use resin_model::ModelConfig;

fn home(regions: usize, codec: KvCodec) -> CpuHome {
    home_ctx(regions, codec, 1024)
}

fn home_ctx(regions: usize, codec: KvCodec, n_ctx: usize) -> CpuHome {
    let path = resin_hub::ensure("smollm2-135m", false).expect("fetching SmolLM2-135M for the tests");
    let file = Arc::new(GgufFile::open(path).unwrap());
    let cfg = ModelConfig::from_gguf(&file).unwrap();
    let opts = CpuOptions { n_ctx: Some(n_ctx), regions, codec, threads: None, progress: None };
    CpuHome::new(file, cfg, &opts, Arc::new(Counters::default())).unwrap()
}

/// K/V codec bars on the last logits after 42 tokens, against the f32 mirror: this small model
/// amplifies any K/V rounding (activations are 8-bit quantized too), so these are about twice
/// what was measured on 2026-12-02 (f16 3.4e-2, q8_0 2.0e-2; the order between them varies).
const BAR16: f64 = 7e-2;
const BAR8: f64 = 5e-2;

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Deterministic token ids in SmolLM2's ordinary range.
fn tokens(n: usize, salt: u32) -> Vec<u32> {
    (0..n as u32).map(|i| 300 + (i * 7919 + salt * 104_729) % 40_000).collect()
}

fn prefill_one(h: &mut CpuHome, region: u32, toks: &[u32]) -> Vec<f32> {
    h.prefill(&[Segment { region: RegionId(region), start: 0, tokens: toks }]).unwrap().data
}

#[test]
fn n_rows_equal_each_row_alone() {
    let prompts: Vec<Vec<u32>> = (0..5).map(|i| tokens(3 + 4 * i, i as u32)).collect();
    let mut batched = home(5, KvCodec::F16);
    let mut alone = home(5, KvCodec::F16);
    for (r, p) in prompts.iter().enumerate() {
        prefill_one(&mut batched, r as u32, p);
        prefill_one(&mut alone, r as u32, p);
    }
    // Three steps of five rows at different positions.
    for step in 0..3u32 {
        let rows: Vec<Row> = prompts.iter().enumerate().map(|(r, p)| Row { region: RegionId(r as u32), token: 500 + step * 11 + r as u32, pos: p.len() as u32 + step }).collect();
        let together = batched.step_logits(&rows).unwrap();
        for (i, row) in rows.iter().enumerate() {
            let single = alone.step_logits(&[*row]).unwrap();
            assert_eq!(bits(together.row(i)), bits(single.row(0)), "row {i} of step {step} differs from the row alone");
        }
    }
    assert_eq!(batched.counters().nrow_steps.load(Ordering::Relaxed), 3);
}

/// Steps of 16, 33 and 64 rows (issue 29's widths: two activation tiles of 8, tiles of 8, 4
/// and 1, eight of 8) equal each row stepped alone, bit for bit: the canonical product sums
/// every output element in an order fixed by the matrix's shape (the kernel tests' control
/// shows that another order gives other bits).
#[test]
fn steps_of_16_33_and_64_rows_equal_each_row_alone() {
    let n = 64;
    let prompts: Vec<Vec<u32>> = (0..n).map(|i| tokens(2 + i % 5, 100 + i as u32)).collect();
    let mut batched = home_ctx(n, KvCodec::F16, 32);
    let mut alone = home_ctx(n, KvCodec::F16, 32);
    let mut pos: Vec<u32> = prompts.iter().map(|p| p.len() as u32).collect();
    for (r, p) in prompts.iter().enumerate() {
        prefill_one(&mut batched, r as u32, p);
        prefill_one(&mut alone, r as u32, p);
    }
    for (step, width) in [16usize, 33, 64].into_iter().enumerate() {
        let rows: Vec<Row> = (0..width).map(|r| Row { region: RegionId(r as u32), token: 700 + 13 * step as u32 + r as u32, pos: pos[r] }).collect();
        let together = batched.step_logits(&rows).unwrap();
        for (i, row) in rows.iter().enumerate() {
            let single = alone.step_logits(&[*row]).unwrap();
            assert_eq!(bits(together.row(i)), bits(single.row(0)), "row {i} of the {width}-row step differs from the row alone");
            pos[i] += 1;
        }
    }
}

#[test]
fn segments_in_one_window_equal_each_session_alone() {
    let a = tokens(37, 1);
    let b = tokens(90, 2);
    let mut shared = home(2, KvCodec::F16);
    let both = shared.prefill(&[Segment { region: RegionId(0), start: 0, tokens: &a }, Segment { region: RegionId(1), start: 0, tokens: &b }]).unwrap();
    let mut solo = home(2, KvCodec::F16);
    let la = prefill_one(&mut solo, 0, &a);
    let lb = prefill_one(&mut solo, 1, &b);
    assert_eq!(bits(both.row(0)), bits(&la));
    assert_eq!(bits(both.row(1)), bits(&lb));
    let c = shared.counters();
    assert_eq!(c.prefill_windows.load(Ordering::Relaxed), 1, "two sessions took one window");
    assert_eq!(c.prefill_segment_windows.load(Ordering::Relaxed), 1);
    // And the sessions' next steps agree too (their K/V rows were stored in their own regions).
    let row = |r: u32, p: &[u32]| Row { region: RegionId(r), token: 777, pos: p.len() as u32 };
    let s1 = shared.step_logits(&[row(0, &a), row(1, &b)]).unwrap();
    let s2a = solo.step_logits(&[row(0, &a)]).unwrap();
    let s2b = solo.step_logits(&[row(1, &b)]).unwrap();
    assert_eq!(bits(s1.row(0)), bits(s2a.row(0)));
    assert_eq!(bits(s1.row(1)), bits(s2b.row(0)));
}

#[test]
fn window_chain_of_600_rows_equals_a_continuation_and_the_peel() {
    let p = tokens(600, 3);
    let mut chain = home(1, KvCodec::F16);
    let whole = prefill_one(&mut chain, 0, &p);
    assert_eq!(chain.counters().prefill_windows.load(Ordering::Relaxed), 2, "600 rows take two windows");

    // The same prompt as a prefill of 595 rows, then a 5-row continuation through the token
    // command (the peel): the last row's logits equal the window chain's.
    let mut peel = home(1, KvCodec::F16);
    prefill_one(&mut peel, 0, &p[..595]);
    let rows: Vec<Row> = (595..600).map(|i| Row { region: RegionId(0), token: p[i], pos: i as u32 }).collect();
    let l = peel.step_logits(&rows).unwrap();
    assert_eq!(bits(l.row(4)), bits(&whole));

    // And as a continuation through the window chain, starting where the session stopped.
    let mut cont = home(1, KvCodec::F16);
    prefill_one(&mut cont, 0, &p[..300]);
    let l = cont.prefill(&[Segment { region: RegionId(0), start: 300, tokens: &p[300..] }]).unwrap();
    assert_eq!(bits(&l.data), bits(&whole));
}

#[test]
fn codecs_agree_within_their_precision() {
    // Natural text (random ids drive this small model into chaotic activations).
    let path = resin_hub::ensure("smollm2-135m", false).unwrap();
    let tok = resin_model::Tokenizer::from_gguf(&GgufFile::open(path).unwrap()).unwrap();
    let p = tok
        .encode("The quick brown fox jumps over the lazy dog. In the beginning the universe was created. This has made a lot of people very angry and been widely regarded as a bad move. Many were increasingly of the opinion", false, false)
        .unwrap();
    let reference = prefill_one(&mut home(1, KvCodec::F32), 0, &p);
    let rel = |v: &[f32]| {
        let num: f64 = v.iter().zip(&reference).map(|(a, b)| ((a - b) as f64).powi(2)).sum();
        let den: f64 = reference.iter().map(|b| (*b as f64).powi(2)).sum();
        (num / den).sqrt()
    };
    let l16 = prefill_one(&mut home(1, KvCodec::F16), 0, &p);
    let l8 = prefill_one(&mut home(1, KvCodec::Q8_0), 0, &p);
    let f16 = rel(&l16);
    let q8 = rel(&l8);
    eprintln!("logits against the f32 mirror after {} tokens: f16 {f16:.2e}, q8_0 {q8:.2e}", p.len());
    assert!(f16 < BAR16, "f16 mirror: relative L2 {f16:.2e}");
    assert!(q8 < BAR8, "q8_0 mirror: relative L2 {q8:.2e}");
    assert!(f16 > 0.0 && q8 > 0.0, "the codecs must actually round ({f16:.2e}, {q8:.2e})");
    // Same greedy choice on this prompt.
    assert_eq!(common::argmax(&l16), common::argmax(&reference));
    assert_eq!(common::argmax(&l8), common::argmax(&reference));
}

#[test]
fn bad_rows_are_errors_not_panics() {
    let mut h = home(2, KvCodec::F16);
    assert!(h.step_logits(&[]).is_err());
    assert!(h.step_logits(&[Row { region: RegionId(2), token: 1, pos: 0 }]).is_err());
    assert!(h.step_logits(&[Row { region: RegionId(0), token: 1 << 30, pos: 0 }]).is_err());
    assert!(h.step_logits(&[Row { region: RegionId(0), token: 1, pos: 1024 }]).is_err());
    let nine: Vec<Row> = (0..9).map(|i| Row { region: RegionId(0), token: 1, pos: i }).collect();
    assert!(h.step_logits(&nine).is_err());
    let long = tokens(1025, 5);
    assert!(h.prefill(&[Segment { region: RegionId(0), start: 0, tokens: &long }]).is_err());
    assert!(h.prefill(&[Segment { region: RegionId(0), start: 0, tokens: &[] }]).is_err());
}
