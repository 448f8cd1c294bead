//! Times the CPU home's matrix products on the shapes of SmolLM2-135M (Q4_1, Q8_0 classifier)
//! and Qwen2.5-Coder-0.5B Q4_K_M (Q5_0 where 896 columns rule out K-quants, Q4_K / Q6_K
//! down projections, Q8_0 v and classifier), at n = 1 (decode), 4 and 512 (prefill).
//!
//! Two parts: each shape alone (weights hot in cache), the canonical product over its tiles
//! (what the forward pass runs; the layout's own time too) beside the rounded kernels; then a
//! whole-model sweep of every layer's matrices in tiles (distinct weights, as decode streams
//! them) giving product-only tokens/s.
//!
//! cargo run --release -p resin-cpu --example kernel_bench [-- --simd avx2] [--quick] [--cpu]
//!     [--only Q5_0,Q4_K] [--no-sweep] [--min]

use resin_cpu::kernels::{canon_many_on, matmul_on, Acts, CanonMatrix, CanonRows, Epilogue, QMatrix, Simd};
use resin_gguf::GgmlType;
use std::time::Instant;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

/// Random bytes with sane f16 scales (the timing does not depend on the values, but NaN/inf
/// scales would be unrealistic).
fn weights(ty: GgmlType, rows: usize, cols: usize, rng: &mut Rng) -> Vec<u8> {
    let bytes = rows * cols / ty.block_len() * ty.block_bytes();
    let mut v: Vec<u8> = (0..bytes).map(|_| rng.next() as u8).collect();
    let d = half::f16::from_f32(0.01).to_bits().to_le_bytes();
    let bb = ty.block_bytes();
    let at: &[usize] = match ty {
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => &[0],
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
        GgmlType::Q2_K => &[80, 82],
        GgmlType::Q3_K => &[108],
        GgmlType::Q6_K => &[208],
        _ => &[],
    };
    if ty == GgmlType::F16 || ty == GgmlType::BF16 || ty == GgmlType::F32 {
        v.iter_mut().for_each(|b| *b &= 0x3f);
    }
    for blk in v.chunks_mut(bb) {
        for &o in at {
            blk[o..o + 2].copy_from_slice(&d);
        }
    }
    v
}

#[repr(C)]
struct Timespec {
    sec: i64,
    nsec: i64,
}
extern "C" {
    fn clock_gettime(clock: i32, ts: *mut Timespec) -> i32;
}

/// Seconds of CPU time used by this process (CLOCK_PROCESS_CPUTIME_ID).
fn cpu_now() -> f64 {
    let mut ts = Timespec { sec: 0, nsec: 0 };
    // SAFETY: clock_gettime writes one timespec.
    unsafe { clock_gettime(2, &mut ts) };
    ts.sec as f64 + ts.nsec as f64 * 1e-9
}

static CPU_CLOCK: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Seconds per call: wall time, or with `--cpu` the process CPU time (for a busy machine:
/// run with RAYON_NUM_THREADS=1 and read the rates as per core).
fn time<F: FnMut()>(mut f: F, min_s: f64) -> f64 {
    f();
    let cpu = CPU_CLOCK.load(std::sync::atomic::Ordering::Relaxed);
    let mut reps = 0u32;
    let t = Instant::now();
    let c0 = cpu_now();
    while reps < 3 || t.elapsed().as_secs_f64() < min_s {
        f();
        reps += 1;
    }
    let spent = if cpu { cpu_now() - c0 } else { t.elapsed().as_secs_f64() };
    if MIN_OF.load(std::sync::atomic::Ordering::Relaxed) {
        // The fastest of several short batches (a busy machine only ever slows a batch down).
        let per = spent / reps as f64;
        let batch = ((min_s / 8.0 / per) as u32).max(1);
        let mut best = per;
        for _ in 0..8 {
            let (t1, c1) = (Instant::now(), cpu_now());
            for _ in 0..batch {
                f();
            }
            let s = if cpu { cpu_now() - c1 } else { t1.elapsed().as_secs_f64() };
            best = best.min(s / batch as f64);
        }
        return best;
    }
    spent / reps as f64
}

/// `--min`: report the fastest batch instead of the mean.
static MIN_OF: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

struct Layer {
    name: &'static str,
    ty: GgmlType,
    rows: usize,
    cols: usize,
}

const fn l(name: &'static str, ty: GgmlType, rows: usize, cols: usize) -> Layer {
    Layer { name, ty, rows, cols }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let simd = match args.iter().position(|a| a == "--simd").map(|i| args[i + 1].as_str()) {
        Some("portable") => Simd::Portable,
        Some("avx2") => Simd::Avx2,
        Some("avx512vnni") => Simd::Avx512Vnni,
        _ => Simd::detected(),
    };
    CPU_CLOCK.store(args.iter().any(|a| a == "--cpu"), std::sync::atomic::Ordering::Relaxed);
    MIN_OF.store(args.iter().any(|a| a == "--min"), std::sync::atomic::Ordering::Relaxed);
    // --only Q5_0,Q4_K: just those formats' matrices; --no-sweep: skip the whole-model sweeps.
    let only = args.iter().position(|a| a == "--only").map(|i| args[i + 1].clone());
    let min_s = if quick { 0.1 } else { 0.4 };
    println!("simd {}, {} threads, {} time", simd.name(), rayon::current_num_threads(), if CPU_CLOCK.load(std::sync::atomic::Ordering::Relaxed) { "process CPU" } else { "wall" });
    use GgmlType::*;
    let smol: &[Layer] =
        &[l("attn_q/o", Q4_1, 576, 576), l("attn_k/v", Q4_1, 192, 576), l("ffn_gate/up", Q4_1, 1536, 576), l("ffn_down", Q4_1, 576, 1536), l("classifier", Q8_0, 49152, 576)];
    let qwen: &[Layer] = &[
        l("attn_q/o", Q5_0, 896, 896),
        l("attn_k", Q5_0, 128, 896),
        l("attn_v", Q8_0, 128, 896),
        l("ffn_gate/up", Q5_0, 4864, 896),
        l("ffn_down", Q4_K, 896, 4864),
        l("ffn_down", Q6_K, 896, 4864),
        l("classifier", Q8_0, 151936, 896),
        l("(Q4_K ref)", Q4_K, 1024, 1024),
        l("(Q4_1 ref)", Q4_1, 1024, 1024),
    ];
    let mut rng = Rng(0x1234_5678_9abc_def1);
    println!("{:<12} {:>5} {:>13} {:>5} {:>10} {:>9} {:>9} {:>12}", "matrix", "type", "rows x cols", "n", "canon us", "GFLOP/s", "GB/s", "rounded us");
    for (model, layers) in [("SmolLM2-135M", smol), ("Qwen2.5-0.5B", qwen)] {
        println!("-- {model}");
        for ly in layers {
            if let Some(f) = &only {
                if !f.split(',').any(|t| t == ly.ty.name()) {
                    continue;
                }
            }
            let data = weights(ly.ty, ly.rows, ly.cols, &mut rng);
            let w = QMatrix::new(ly.ty, ly.rows, ly.cols, &data).unwrap();
            let t0 = Instant::now();
            let tiles = CanonMatrix::pack(&w).ok();
            if tiles.is_some() {
                println!("{:<12} {:>5} laid out in tiles at {:.2} GB/s", ly.name, ly.ty.name(), data.len() as f64 / t0.elapsed().as_secs_f64() * 1e-9);
            }
            for n in [1usize, 4, 512] {
                if n > 1 && ly.name == "classifier" {
                    continue; // prefill runs the classifier on segment-last rows only
                }
                let x: Vec<f32> = (0..n * ly.cols).map(|i| ((i * 7919) % 1000) as f32 * 1e-3 - 0.5).collect();
                let mut out = vec![0f32; n * ly.rows];
                let rounded = time(
                    || {
                        let acts = Acts::prepare(&x, n, ly.cols, ly.ty);
                        matmul_on(simd, &w, &acts, &mut out)
                    },
                    min_s,
                );
                let t = match &tiles {
                    Some(tw) => time(
                        || {
                            let acts = CanonRows::pack(&x, n, ly.cols).unwrap();
                            canon_many_on(simd, &mut [(tw, &mut out)], &acts, Epilogue::Store).unwrap()
                        },
                        min_s,
                    ),
                    None => rounded,
                };
                let flops = 2.0 * (ly.rows * ly.cols * n) as f64;
                println!(
                    "{:<12} {:>5} {:>6} x {:<5} {:>5} {:>10.1} {:>9.1} {:>9.1} {:>12.1}",
                    ly.name,
                    ly.ty.name(),
                    ly.rows,
                    ly.cols,
                    n,
                    t * 1e6,
                    flops / t * 1e-9,
                    data.len() as f64 / t * 1e-9,
                    rounded * 1e6
                );
            }
        }
    }

    if args.iter().any(|a| a == "--no-sweep") {
        return;
    }
    // Whole-model sweeps: every layer's own weights (so decode streams them like the model).
    println!("-- whole-model sweeps (products only, incl. activation quantization; the rounded kernels where a format has no tiles)");
    let smol_layer = [(Q4_1, 576, 576), (Q4_1, 192, 576), (Q4_1, 192, 576), (Q4_1, 576, 576), (Q4_1, 1536, 576), (Q4_1, 1536, 576), (Q4_1, 576, 1536)];
    let mut qwen_layers = Vec::new();
    for i in 0..24 {
        let more = i % 3 == 0 || !(3..21).contains(&i); // Q4_K_M gives some layers more bits
        qwen_layers.push(vec![
            (Q5_0, 896, 896),
            (Q5_0, 128, 896),
            (if more { Q8_0 } else { Q5_0 }, 128, 896),
            (Q5_0, 896, 896),
            (Q5_0, 4864, 896),
            (Q5_0, 4864, 896),
            (if more { Q6_K } else { Q4_K }, 896, 4864),
        ]);
    }
    let smol_layers: Vec<Vec<(GgmlType, usize, usize)>> = (0..30).map(|_| smol_layer.to_vec()).collect();
    for (model, layers, classifier) in [("SmolLM2-135M Q4_1", &smol_layers, (Q8_0, 49152usize, 576usize)), ("Qwen2.5-0.5B Q4_K_M", &qwen_layers, (Q8_0, 151936, 896))] {
        let mats: Vec<Vec<Vec<u8>>> = layers.iter().map(|ls| ls.iter().map(|&(ty, r, c)| weights(ty, r, c, &mut rng)).collect()).collect();
        let cls = weights(classifier.0, classifier.1, classifier.2, &mut rng);
        let tiles: Vec<Vec<Option<CanonMatrix>>> =
            layers.iter().zip(&mats).map(|(ls, ms)| ls.iter().zip(ms).map(|(&(ty, r, c), m)| CanonMatrix::pack(&QMatrix::new(ty, r, c, m).unwrap()).ok()).collect()).collect();
        let cls_tiles = CanonMatrix::pack(&QMatrix::new(classifier.0, classifier.1, classifier.2, &cls).unwrap()).ok();
        let total_bytes: usize = mats.iter().flatten().map(|m| m.len()).sum::<usize>() + cls.len();
        for n in [1usize, 4, 512] {
            let xs: Vec<Vec<f32>> = [576usize, 896, 1536, 4864].iter().map(|&c| (0..n * c).map(|i| ((i * 7919) % 1000) as f32 * 1e-3 - 0.5).collect()).collect();
            let pick = |c: usize| &xs[[576usize, 896, 1536, 4864].iter().position(|&v| v == c).unwrap()];
            let mut out = vec![0f32; n * 4864];
            let mut cls_out = vec![0f32; classifier.1];
            let run = |out: &mut Vec<f32>, cls_out: &mut Vec<f32>| {
                let product = |ty: GgmlType, r: usize, c: usize, m: &[u8], tw: &Option<CanonMatrix>, rows: usize, x: &[f32], out: &mut [f32]| match tw {
                    Some(tw) => canon_many_on(simd, &mut [(tw, out)], &CanonRows::pack(x, rows, c).unwrap(), Epilogue::Store).unwrap(),
                    None => matmul_on(simd, &QMatrix::new(ty, r, c, m).unwrap(), &Acts::prepare(x, rows, c, ty), out),
                };
                for ((ls, ms), ts) in layers.iter().zip(&mats).zip(&tiles) {
                    for ((&(ty, r, c), m), tw) in ls.iter().zip(ms).zip(ts) {
                        product(ty, r, c, m, tw, n, pick(c), &mut out[..n * r]);
                    }
                }
                product(classifier.0, classifier.1, classifier.2, &cls, &cls_tiles, 1, &pick(classifier.2)[..classifier.2], cls_out);
            };
            let t = time(|| run(&mut out, &mut cls_out), if quick { 0.3 } else { 1.5 });
            println!("{model:<22} n={n:<4} {:>8.2} ms/pass {:>8.1} tok/s {:>7.1} GB/s of weights", t * 1e3, n as f64 / t, total_bytes as f64 / t * 1e-9);
        }
    }
}
