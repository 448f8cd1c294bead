//! The scalar reference of the canonical matrix product (docs/canonical-order.md, sections
//! 1-5): what every kernel that claims the order is tested against bit for bit. Weights are
//! read as GGUF stores them; activations are quantized in 32-value int8 blocks.

use resin_core::canon::{Cut, BLOCK};
use resin_gguf::GgmlType;

use super::acts::quant_block;
use super::portable::{decode32, decode_k};

/// One activation row in 32-value blocks: quants, each block's `d` and the sum of its quants.
#[derive(Debug, Clone, PartialEq)]
pub struct CanonActs {
    pub q: Vec<i8>,
    pub d: Vec<f32>,
    pub s: Vec<i32>,
}

impl CanonActs {
    /// Quantize `u` (a multiple of 32 values) block by block (section 1).
    pub fn quantize(u: &[f32]) -> CanonActs {
        let nb = u.len() / BLOCK;
        let mut a = CanonActs { q: vec![0; nb * BLOCK], d: vec![0.0; nb], s: vec![0; nb] };
        for b in 0..nb {
            let mut q = [0i8; BLOCK];
            let (d, s) = quant_block(&u[b * BLOCK..(b + 1) * BLOCK], &mut q);
            a.q[b * BLOCK..(b + 1) * BLOCK].copy_from_slice(&q);
            (a.d[b], a.s[b]) = (d, s);
        }
        a
    }
}

/// Whether the canonical product has an expression for `ty` (section 2's table).
pub fn canon_format(ty: GgmlType) -> bool {
    use GgmlType::*;
    matches!(ty, Q8_0 | Q4_0 | Q4_1 | Q5_0 | Q4_K | Q5_K | Q6_K)
}

fn idot(w: &[i8], x: &[i8]) -> i32 {
    w.iter().zip(x).map(|(&a, &b)| a as i32 * b as i32).sum()
}

/// f_b: block `b` of weight row `w` (GGUF bytes) against block `b` of `x` (section 2).
pub fn canon_block(ty: GgmlType, w: &[u8], b: usize, x: &CanonActs) -> f32 {
    let xq = &x.q[b * BLOCK..(b + 1) * BLOCK];
    let (d, sx) = (x.d[b], x.s[b]);
    match ty {
        GgmlType::Q8_0 | GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q4_1 => {
            let bb = ty.block_bytes();
            let (dw, mw, q) = decode32(ty, &w[b * bb..(b + 1) * bb]);
            let t = (dw * d) * idot(&q, xq) as f32;
            if ty == GgmlType::Q4_1 {
                t + (mw * d) * sx as f32
            } else {
                t
            }
        }
        GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K => {
            let bb = ty.block_bytes();
            let (sb, j) = (b / 8, b % 8);
            let (q, sc, mn, dd, dmin) = decode_k(ty, &w[sb * bb..(sb + 1) * bb]);
            let q = &q[32 * j..32 * j + 32];
            if ty == GgmlType::Q6_K {
                let s = sc[2 * j] * idot(&q[..16], &xq[..16]) + sc[2 * j + 1] * idot(&q[16..], &xq[16..]);
                (d * dd) * s as f32
            } else {
                (d * dd) * (sc[2 * j] * idot(q, xq)) as f32 - (d * dmin) * (mn[2 * j] * sx) as f32
            }
        }
        _ => f32::NAN,
    }
}

/// y' = the canonical sum of the blocks of weight row `w` against `x` (sections 3 and 4).
pub fn canon_dot(ty: GgmlType, w: &[u8], x: &CanonActs, cut: &Cut) -> f32 {
    cut.sum(|b| canon_block(ty, w, b, x))
}

/// The sum of squares of `x` in the canonical order: each block's squares left to right from
/// +0.0, then the blocks as a product's blocks are (section 5).
pub fn canon_sumsq(x: &[f32], cut: &Cut) -> f32 {
    cut.sum(|b| {
        let mut s = 0f32;
        for v in &x[b * BLOCK..(b + 1) * BLOCK] {
            s += v * v;
        }
        s
    })
}

/// The folded norm's scale of a row of `k` values whose sum of squares is `ss`.
pub fn canon_rms_scale(ss: f32, k: usize, eps: f32) -> f32 {
    1.0 / (ss / k as f32 + eps).sqrt()
}

#[cfg(test)]
mod tests {
    use super::*;
    use resin_gguf::formats;

    fn rand(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    /// The canonical product is the real dot product of the dequantized weights and the
    /// rounded activations, to float accuracy, for every format it takes.
    #[test]
    fn the_canonical_product_is_the_dot_product() {
        let k = 2048;
        let cut = Cut::of(k).unwrap();
        let x = rand(k, 1);
        let acts = CanonActs::quantize(&x);
        let xr: Vec<f32> = (0..k).map(|i| acts.q[i] as f32 * acts.d[i / 32]).collect();
        for ty in [GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K] {
            assert!(canon_format(ty));
            let w = formats::quantize(ty, &rand(k, 2)).unwrap();
            let mut wd = vec![0f32; k];
            formats::dequantize(ty, &w, &mut wd).unwrap();
            let want: f64 = wd.iter().zip(&xr).map(|(a, b)| *a as f64 * *b as f64).sum();
            let got = canon_dot(ty, &w, &acts, &cut) as f64;
            assert!((got - want).abs() < 1e-3 * want.abs().max(1.0), "{ty}: {got} vs {want}");
        }
        assert!(!canon_format(GgmlType::F16));
    }

    /// The folded norm's pieces: the canonical sum of squares is the sum of squares (to float
    /// accuracy), and r normalizes a row to a mean square of one.
    #[test]
    fn the_folded_norm_scales_to_unit_mean_square() {
        let k = 8192;
        let cut = Cut::of(k).unwrap();
        let x = rand(k, 3);
        let want: f64 = x.iter().map(|v| (*v as f64) * (*v as f64)).sum();
        let ss = canon_sumsq(&x, &cut);
        assert!((ss as f64 - want).abs() < 1e-5 * want, "{ss} vs {want}");
        let r = canon_rms_scale(ss, k, 0.0) as f64;
        assert!((r * r * want / k as f64 - 1.0).abs() < 1e-5);
    }
}
