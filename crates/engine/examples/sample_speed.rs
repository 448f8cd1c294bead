//! Time a sampled token's host work (penalties off): `Sampler::sample` over a 128k-vocabulary
//! logits row, for a few common settings, and for a top_k of at most 64 the draw from the
//! row's 64 largest logits (what the Vulkan home reads back): the row rebuilt with -inf
//! elsewhere against `Sampler::sample_top` on the list. Speed is measured here, never in a
//! test:
//!   cargo run --release -p resin-engine --example sample_speed
//! The logits: a sum of four uniforms (a bell of width about 20) plus a peak every 9,973 ids,
//! fixed by a seed, so runs compare.
use resin_engine::{Sampler, SamplingParams};
use std::time::Instant;

fn main() {
    let n = 128_256;
    let mut st = 12_345u64;
    let mut rnd = || {
        st ^= st << 13;
        st ^= st >> 7;
        st ^= st << 17;
        (st >> 11) as f64 / (1u64 << 53) as f64
    };
    let base: Vec<f32> = (0..n)
        .map(|i| {
            let s: f64 = (0..4).map(|_| rnd()).sum::<f64>() - 2.0;
            (s * 5.0) as f32 + if i % 9973 == 0 { 12.0 } else { 0.0 }
        })
        .collect();
    println!("vocabulary {n}: median of 9 runs of 20 tokens");
    // The 64 largest (descending, ties by id), as the device lists them.
    let mut top: Vec<(u32, f32)> = base.iter().enumerate().map(|(i, &l)| (i as u32, l)).collect();
    top.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    top.truncate(64);
    // The last: the server's defaults for what a request leaves out (llama.cpp's).
    for (t, p, k, m) in [(0.7f32, 0.9f32, 0usize, 0f32), (1.0, 1.0, 0, 0.0), (0.8, 0.95, 0, 0.0), (1.0, 1.0, 40, 0.0), (0.1, 1.0, 0, 0.0), (0.8, 0.95, 40, 0.05)] {
        let mut s = Sampler::new(SamplingParams { temperature: t, top_p: p, top_k: k, min_p: m, seed: Some(1), ..Default::default() });
        let mut runs: Vec<f64> = (0..9)
            .map(|_| {
                let now = Instant::now();
                for _ in 0..20 {
                    std::hint::black_box(s.sample(&mut base.clone(), &[]));
                }
                now.elapsed().as_secs_f64() / 20.0
            })
            .collect();
        runs.sort_by(f64::total_cmp);
        println!("temperature {t}, top_p {p}, top_k {k}, min_p {m}: {:.0} us a token", runs[4] * 1e6);
        if s.draws_from_top(top.len()) {
            let rebuilt = median_us(|| {
                let mut row = vec![f32::NEG_INFINITY; n];
                for &(id, l) in &top {
                    row[id as usize] = l;
                }
                s.sample(&mut row, &[])
            });
            let listed = median_us(|| s.sample_top(&top).unwrap_or(0));
            println!("  from the top {}: {rebuilt:.0} us a token rebuilt into a row, {listed:.1} us from the list", top.len());
        }
    }
}

/// The median of 9 runs of 20 calls of `f`, in microseconds a call.
fn median_us(mut f: impl FnMut() -> u32) -> f64 {
    let mut runs: Vec<f64> = (0..9)
        .map(|_| {
            let now = Instant::now();
            for _ in 0..20 {
                std::hint::black_box(f());
            }
            now.elapsed().as_secs_f64() / 20.0
        })
        .collect();
    runs.sort_by(f64::total_cmp);
    runs[4] * 1e6
}
