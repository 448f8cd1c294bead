//! Small per-row operations of the forward pass.

use resin_model::{FfnAct, RopeStyle};

/// out = x / rms(x) * w
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let ss: f32 = dot(x, x);
    let scale = 1.0 / (ss / x.len() as f32 + eps).sqrt();
    for ((o, &v), &g) in out.iter_mut().zip(x).zip(w) {
        *o = v * scale * g;
    }
}

/// `rms_norm` of each of `n` rows of `cols` values of `x`, into a new buffer.
pub fn rms_norm_rows(x: &[f32], n: usize, cols: usize, w: &[f32], eps: f32) -> Vec<f32> {
    let mut out = vec![0f32; n * cols];
    for (o, xr) in out.chunks_exact_mut(cols).zip(x[..n * cols].chunks_exact(cols)) {
        rms_norm(xr, w, eps, o);
    }
    out
}

/// In-place RMS norm (qwen3's per-head q/k norm).
pub fn rms_norm_inplace(x: &mut [f32], w: &[f32], eps: f32) {
    let ss: f32 = dot(x, x);
    let scale = 1.0 / (ss / x.len() as f32 + eps).sqrt();
    for (v, &g) in x.iter_mut().zip(w) {
        *v *= scale * g;
    }
}

/// Dot product with eight independent accumulators in a fixed order (so results are
/// reproducible); AVX2+FMA when the CPU has it, the same arithmetic shape otherwise.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if has_avx2_fma() {
        // SAFETY: the CPU supports AVX2 and FMA (checked above).
        return unsafe { x86::dot(a, b) };
    }
    let mut acc = [0f32; 8];
    let n8 = a.len() / 8 * 8;
    for (ca, cb) in a[..n8].chunks_exact(8).zip(b[..n8].chunks_exact(8)) {
        for i in 0..8 {
            acc[i] += ca[i] * cb[i];
        }
    }
    let mut s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for i in n8..a.len() {
        s += a[i] * b[i];
    }
    s
}

/// y += a * x
pub fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if has_avx2_fma() {
        // SAFETY: the CPU supports AVX2 and FMA (checked above).
        return unsafe { x86::axpy(a, x, y) };
    }
    for (o, &v) in y.iter_mut().zip(x) {
        *o += a * v;
    }
}

/// Whether the CPU has AVX2, FMA and F16C: [`dot`] and [`axpy`] take their AVX2 path, and
/// f16 rows convert in registers.
#[cfg(target_arch = "x86_64")]
pub fn has_avx2_fma_f16c() -> bool {
    use std::sync::OnceLock;
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| has_avx2_fma() && is_x86_feature_detected!("f16c"))
}

#[cfg(target_arch = "x86_64")]
fn has_avx2_fma() -> bool {
    use std::sync::OnceLock;
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma"))
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod x86 {
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot(a: &[f32], b: &[f32]) -> f32 {
        let n = a.len().min(b.len());
        let n16 = n / 16 * 16;
        let (mut s0, mut s1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        let mut i = 0;
        while i < n16 {
            s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a.as_ptr().add(i)), _mm256_loadu_ps(b.as_ptr().add(i)), s0);
            s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a.as_ptr().add(i + 8)), _mm256_loadu_ps(b.as_ptr().add(i + 8)), s1);
            i += 16;
        }
        let mut r = dot_reduce(s0, s1);
        for j in n16..n {
            r += a[j] * b[j];
        }
        r
    }

    /// `dot`'s reduction of its two 8-lane accumulators (each 16 values' first and second 8),
    /// in its fixed tree: every row type's dot (f32, the K/V mirror's f16) ends in it, so the
    /// same values give the same bits.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(crate) unsafe fn dot_reduce(s0: __m256, s1: __m256) -> f32 {
        let s = _mm256_add_ps(s0, s1);
        let lo = _mm256_castps256_ps128(s);
        let hi = _mm256_extractf128_ps(s, 1);
        let q = _mm_add_ps(lo, hi);
        let q = _mm_add_ps(q, _mm_movehl_ps(q, q));
        let q = _mm_add_ss(q, _mm_shuffle_ps(q, q, 1));
        _mm_cvtss_f32(q)
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
        let n = x.len().min(y.len());
        let n8 = n / 8 * 8;
        let va = _mm256_set1_ps(a);
        let mut i = 0;
        while i < n8 {
            let p = y.as_mut_ptr().add(i);
            _mm256_storeu_ps(p, _mm256_fmadd_ps(va, _mm256_loadu_ps(x.as_ptr().add(i)), _mm256_loadu_ps(p)));
            i += 8;
        }
        for j in n8..n {
            y[j] += a * x[j];
        }
    }
}

/// gate <- act(gate) * up
pub fn gated(act: FfnAct, gate: &mut [f32], up: &[f32]) {
    match act {
        FfnAct::Silu => {
            for (g, &u) in gate.iter_mut().zip(up) {
                *g = *g / (1.0 + (-*g).exp()) * u;
            }
        }
        FfnAct::GeluTanh => {
            for (g, &u) in gate.iter_mut().zip(up) {
                *g = gelu_tanh(*g) * u;
            }
        }
    }
}

/// GELU with the tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
pub fn gelu_tanh(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (1.0 + 0.044_715 * x * x)).tanh())
}

/// Final logit soft-capping: cap * tanh(logit / cap).
pub fn softcap(logits: &mut [f32], cap: f32) {
    logits.iter_mut().for_each(|v| *v = cap * (*v / cap).tanh());
}

/// Rotary embedding tables for one position: cos and sin of `pos * inv_freq[i]`.
pub struct RopeTables {
    inv_freq: Vec<f64>,
    pub style: RopeStyle,
    pub dims: usize,
}

impl RopeTables {
    pub fn new(base: f32, dims: usize, style: RopeStyle) -> Self {
        let inv_freq = (0..dims / 2).map(|i| (base as f64).powf(-2.0 * i as f64 / dims as f64)).collect();
        RopeTables { inv_freq, style, dims }
    }

    /// Fill `cs` with (cos, sin) pairs for position `pos`.
    pub fn angles(&self, pos: u32, cs: &mut Vec<(f32, f32)>) {
        cs.clear();
        cs.extend(self.inv_freq.iter().map(|&f| {
            let (s, c) = (pos as f64 * f).sin_cos();
            (c as f32, s as f32)
        }));
    }

    /// Rotate every head of `x` ([heads][head_dim]) in place; dims past `dims` pass through.
    pub fn apply(&self, x: &mut [f32], head_dim: usize, cs: &[(f32, f32)]) {
        let half = self.dims / 2;
        for h in x.chunks_exact_mut(head_dim) {
            match self.style {
                RopeStyle::Norm => {
                    for (i, &(c, s)) in cs.iter().enumerate() {
                        let (a, b) = (h[2 * i], h[2 * i + 1]);
                        h[2 * i] = a * c - b * s;
                        h[2 * i + 1] = a * s + b * c;
                    }
                }
                RopeStyle::Neox => {
                    for (i, &(c, s)) in cs.iter().enumerate() {
                        let (a, b) = (h[i], h[i + half]);
                        h[i] = a * c - b * s;
                        h[i + half] = a * s + b * c;
                    }
                }
            }
        }
    }
}
