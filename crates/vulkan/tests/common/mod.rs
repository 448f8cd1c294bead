//! Shared pieces of the Vulkan tests: the device (or a clear skip), a recorder harness, a
//! deterministic generator and the element-wise checker with per-element bars.
#![allow(dead_code)]

use std::sync::Arc;

use resin_gguf::GgufFile;
use resin_model::{ModelConfig, Tokenizer};
use resin_vulkan::buffers::{submit_once, Buffer, Location};
use resin_vulkan::kernels::Recorder;
use resin_vulkan::pipelines::{Descriptors, Pipelines};
use resin_vulkan::Gpu;

/// f32 unit roundoff.
pub const U: f64 = 1.0 / (1u64 << 24) as f64;
/// f16 unit roundoff.
pub const U16: f64 = 1.0 / 2048.0;
/// A NaN pattern written over outputs before a run, so an element never written fails.
pub const POISON: u32 = 0x7FC0_7FC0; // a NaN as f32 and as each of its two f16 halves

/// A registry model, fetched on first use, with its config and tokenizer.
pub struct Model {
    pub file: Arc<GgufFile>,
    pub cfg: ModelConfig,
    pub tok: Arc<Tokenizer>,
}

/// `RESIN_TEST_GGUF` names a file that stands in for every registry model: the GPU machine
/// receives no file over 64 MiB, so there these tests run on a `resin synth` model.
pub fn model(name: &str) -> Model {
    let path = match std::env::var_os("RESIN_TEST_GGUF") {
        Some(p) => std::path::PathBuf::from(p),
        None => resin_hub::ensure(name, false).unwrap_or_else(|e| panic!("fetching {name}: {e}")),
    };
    open(&path)
}

/// A registry model cut to its first `blocks` transformer blocks (`RESIN_TEST_GGUF` stands in
/// as for [`model`]): for tests of the home's machinery (windows, rows together and alone,
/// snapshots), whose subject does not need the whole depth, at a fraction of lavapipe's time.
pub fn model_cut(name: &str, blocks: usize) -> Model {
    let path = match std::env::var_os("RESIN_TEST_GGUF") {
        Some(p) => std::path::PathBuf::from(p),
        None => resin_hub::ensure_first_blocks(name, blocks, false).unwrap_or_else(|e| panic!("cutting {name} to {blocks} blocks: {e}")),
    };
    open(&path)
}

fn open(path: &std::path::Path) -> Model {
    let file = Arc::new(GgufFile::open(path).unwrap());
    let cfg = ModelConfig::from_gguf(&file).unwrap();
    let tok = Arc::new(Tokenizer::from_gguf(&file).unwrap());
    Model { file, cfg, tok }
}

/// The device, or None with a line saying why (a failure when RESIN_REQUIRE_VULKAN=1).
pub fn gpu() -> Option<Arc<Gpu>> {
    match Gpu::start() {
        Ok(g) => Some(g),
        Err(e) => {
            if std::env::var("RESIN_REQUIRE_VULKAN").as_deref() == Ok("1") {
                panic!("RESIN_REQUIRE_VULKAN=1 but there is no Vulkan device: {e}");
            }
            eprintln!("SKIP: no Vulkan device ({e}); apt-get install mesa-vulkan-drivers libvulkan1");
            None
        }
    }
}

pub struct Harness {
    pub gpu: Arc<Gpu>,
    pub pipes: Pipelines,
    pub desc: Descriptors,
}

impl Harness {
    pub fn new() -> Option<Harness> {
        let gpu = gpu()?;
        Some(Harness { pipes: Pipelines::new(&gpu), desc: Descriptors::new(&gpu), gpu })
    }

    pub fn buf_f32(&self, v: &[f32]) -> Buffer {
        Buffer::with_data(&self.gpu, &resin_vulkan::buffers::f32_bytes(v), Location::Device).unwrap()
    }

    pub fn buf_bytes(&self, v: &[u8]) -> Buffer {
        let mut b = v.to_vec();
        b.resize(v.len().next_multiple_of(4).max(4), 0);
        Buffer::with_data(&self.gpu, &b, Location::Device).unwrap()
    }

    /// Whole GGUF rows of `ty` (`cols` values a row) uploaded as the Vulkan home holds them
    /// (`resin_vulkan::layout`: Q8_0's quants apart from its scales), and the device's bytes a
    /// row (the kernels' `row_bytes`).
    pub fn weights(&self, ty: resin_gguf::GgmlType, cols: usize, gguf: &[u8]) -> (Buffer, usize) {
        let rows = gguf.len() / (cols / ty.block_len() * ty.block_bytes());
        let dev = resin_vulkan::layout::device_rows(ty, cols, gguf);
        (self.buf_bytes(&dev), dev.len() / rows.max(1))
    }

    /// An output buffer of `n` f32 poisoned with NaN.
    pub fn poisoned(&self, n: usize) -> Buffer {
        let mut b = Buffer::new(&self.gpu, (n * 4) as u64, Location::Device).unwrap();
        b.fill_u32(POISON).unwrap();
        b
    }

    /// Record with `f`, submit once, wait.
    pub fn run(&mut self, f: impl FnOnce(&mut Recorder<'_>) -> Result<(), resin_vulkan::VkError>) {
        self.try_run(f).unwrap();
    }

    /// As `run`, returning what recording with `f` returned (an empty submission on an error).
    pub fn try_run(&mut self, f: impl FnOnce(&mut Recorder<'_>) -> Result<(), resin_vulkan::VkError>) -> Result<(), resin_vulkan::VkError> {
        let gpu = self.gpu.clone();
        let mut res = Ok(());
        submit_once(&gpu, |cmd| {
            let mut rec = Recorder::new(&gpu, &mut self.pipes, &mut self.desc, cmd);
            res = f(&mut rec);
        })
        .unwrap();
        res
    }

    /// Microseconds a run of `f` takes when `reps` of them are chained by barriers in one
    /// submission (as in a token command: latency, not overlapped throughput), after one
    /// run that makes the pipelines and warms the caches. For the ignored speed tests. Timed
    /// on the device between two timestamps where it has them, so the host's recording and
    /// the submission are not in it; else the submission's wall time.
    #[allow(dead_code)]
    pub fn time_chained(&mut self, reps: u32, f: &mut dyn FnMut(&mut Recorder<'_>) -> Result<(), resin_vulkan::VkError>) -> f64 {
        self.run(|rec| f(rec));
        let ts = resin_vulkan::buffers::Timestamps::new(&self.gpu, 2).unwrap();
        let t = std::time::Instant::now();
        self.run(|rec| {
            if let Some(ts) = &ts {
                ts.reset(rec.cmd);
                ts.write(rec.cmd, 0);
            }
            for _ in 0..reps {
                f(rec)?;
                rec.barrier();
            }
            if let Some(ts) = &ts {
                ts.write(rec.cmd, 1);
            }
            Ok(())
        });
        let wall = t.elapsed().as_secs_f64() * 1e6;
        let us = match &ts {
            Some(ts) => ts.read(2).map(|v| (v[1] - v[0]) / 1e3).unwrap_or(wall),
            None => wall,
        };
        us / reps as f64
    }
}

/// xorshift64*: deterministic test data.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in [-1, 1).
    pub fn f(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    pub fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.f() * scale).collect()
    }
}

/// Every element of `got` is finite and within `bar[i]` of `want[i]`; Err names the worst.
pub fn check(what: &str, got: &[f32], want: &[f64], bar: &[f64]) -> Result<f64, String> {
    if got.len() != want.len() {
        return Err(format!("{what}: {} values, want {}", got.len(), want.len()));
    }
    let mut worst = (0usize, 0f64); // (index, err / bar)
    for i in 0..got.len() {
        let g = got[i] as f64;
        if !g.is_finite() {
            return Err(format!("{what}[{i}] = {g} (not finite; want {})", want[i]));
        }
        let e = (g - want[i]).abs();
        let r = if bar[i] > 0.0 {
            e / bar[i]
        } else if e == 0.0 {
            0.0
        } else {
            f64::INFINITY
        };
        if r > worst.1 {
            worst = (i, r);
        }
    }
    let i = worst.0;
    if worst.1 > 1.0 {
        return Err(format!("{what}[{i}] = {} want {} (err {:.3e} > bar {:.3e})", got[i], want[i], (got[i] as f64 - want[i]).abs(), bar[i]));
    }
    Ok(worst.1)
}

/// The weight formats every GEMV/GEMM tier serves.
pub const FORMATS: [resin_gguf::GgmlType; 9] = {
    use resin_gguf::GgmlType::*;
    [F32, F16, Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K]
};

/// y = W x in f64 from the reference dequantization, and the bar of each element:
/// (cols + 8) * u * sum_j |w_ij x_j|: any f32 summation order of `cols` products is within
/// gamma_cols of the exact sum, plus a few roundings of the in-kernel dequantization.
pub fn gemv_oracle(wq: &[f32], x: &[f32], rows: usize, cols: usize) -> (Vec<f64>, Vec<f64>) {
    let mut y = vec![0f64; rows];
    let mut bar = vec![0f64; rows];
    for r in 0..rows {
        let (mut s, mut a) = (0f64, 0f64);
        for j in 0..cols {
            let t = wq[r * cols + j] as f64 * x[j] as f64;
            s += t;
            a += t.abs();
        }
        y[r] = s;
        bar[r] = (cols as f64 + 8.0) * U * a + 1e-30;
    }
    (y, bar)
}

/// Relative L2 distance of `a` from `b`.
pub fn rel_l2(a: &[f32], b: &[f32]) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(x, y)| (*x as f64 - *y as f64).powi(2)).sum();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    (num / den).sqrt()
}

/// The index of the largest value (the first of equals).
pub fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best as u32
}

pub fn bits_equal(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}
