//! Speed of the canonical product against the CPU home's own kernels on model shapes.
//! `cargo run --release -p resin-cpu --example canon_speed`
use resin_cpu::kernels::{canon_many_on, matmul_on, Acts, CanonMatrix, CanonRows, Epilogue, QMatrix, Simd};
use resin_gguf::{formats, GgmlType};
use std::time::Instant;

fn main() {
    // RESIN_SIMD=avx2 times the AVX2 paths on an AVX-512 machine.
    let simd = match std::env::var("RESIN_SIMD").as_deref() {
        Ok("avx2") => Simd::Avx2,
        Ok("portable") => Simd::Portable,
        _ => Simd::detected(),
    };
    let mut seed = 0x1234_5678u64;
    let mut rnd = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5
    };
    for ty in [GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q6_K] {
        for (rows, cols) in [(1536, 576), (8192, 2048), (2048, 8192)] {
            if cols % ty.block_len() != 0 {
                continue;
            }
            let wf: Vec<f32> = (0..rows * cols).map(|_| rnd() * 0.1).collect();
            let data = formats::quantize(ty, &wf).unwrap();
            let w = QMatrix::new(ty, rows, cols, &data).unwrap();
            let t = Instant::now();
            let pw = CanonMatrix::pack(&w).unwrap();
            let pack_us = t.elapsed().as_secs_f64() * 1e6;
            println!("{ty:?} {rows}x{cols}: laid out in {pack_us:.0} us ({:.2} GB/s)", data.len() as f64 / pack_us / 1e3);
            for n in [1usize, 4, 64] {
                let x: Vec<f32> = (0..n * cols).map(|_| rnd()).collect();
                let mut out = vec![0f32; n * rows];
                let reps = (200_000_000 / (data.len() * n.min(8))).clamp(3, 2000);
                let time = |f: &mut dyn FnMut()| {
                    f();
                    let t = Instant::now();
                    for _ in 0..reps {
                        f();
                    }
                    t.elapsed().as_secs_f64() / reps as f64 * 1e6
                };
                let a = time(&mut || {
                    let acts = Acts::prepare(&x, n, cols, ty);
                    matmul_on(simd, &w, &acts, &mut out);
                });
                let b = time(&mut || {
                    let acts = CanonRows::pack(&x, n, cols).unwrap();
                    canon_many_on(simd, &mut [(&pw, &mut out)], &acts, Epilogue::Store).unwrap();
                });
                let gb = |us: f64| data.len() as f64 / us / 1e3;
                println!("{ty:?} {rows}x{cols} n={n}: own {a:.0} us ({:.1} GB/s), canon {b:.0} us ({:.1} GB/s), ratio {:.2}", gb(a), gb(b), b / a);
            }
        }
    }
}
