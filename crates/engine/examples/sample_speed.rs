//! Time a sampled token's host work (penalties off): `Sampler::sample` over a 128k-vocabulary
//! logits row, for a few common settings. Speed is measured here, never in a test:
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
    }
}
