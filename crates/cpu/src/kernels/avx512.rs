//! The AVX-512 path (F, BW, VL, VNNI; plus F16C and BMI2): 64 values a step.
//!
//! 32-block formats, 16 blocks at a time: the blocks' quant bytes are transposed (128-bit
//! inserts and a 4x4 dword transpose) into the activation layout (acts.rs: one i32 lane per
//! block), so 8 `vpdpbusd` give the 16 block dots, then one cvt and one fma with the 16
//! (weight scale x activation scale) products. Weights are made unsigned (Q8_0: xor 0x80);
//! the offset (8, 16, 128) and the Q4_1/Q5_1 mins go through the per-block correction
//! `sum_b c_b * s_b` (s_b = d_b * sum(a) of the block), one more fma per 16 blocks.
//!
//! K-quants: unsigned values, `vpmaddubsw` then `vpdpwssd` against the sub-block scales (one
//! `vpermw` per 64 values turns the superblock's scales into a per-lane pattern), so a whole
//! superblock accumulates in i32; offsets and mins use the activations' 16-value sums.
//!
//! Each output element is reduced in a fixed order (per step in lanes, one horizontal sum at
//! the end), the same for every tile width K.

// Register tiles are indexed [weight row][activation row] on purpose.
#![allow(clippy::needless_range_loop)]

use super::acts::Prepared;
use super::blocks::{k4_scales, q3_scales};
use resin_gguf::GgmlType;
use std::arch::x86_64::*;

pub(super) const FEATURES: &str = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c,bmi2";

/// Activation rows `i0..i0 + K` against the M weight rows `w`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c,bmi2")]
pub(super) unsafe fn tile<const M: usize, const K: usize>(ty: GgmlType, w: [&[u8]; M], x: &[f32], cols: usize, p: &Prepared, i0: usize, o: &mut [[f32; K]; M]) {
    let _ = FEATURES;
    use GgmlType::*;
    match ty {
        F32 => {
            for m in 0..M {
                float_tile::<K, 0>(w[m], x, cols, i0, &mut o[m])
            }
        }
        F16 => {
            for m in 0..M {
                float_tile::<K, 1>(w[m], x, cols, i0, &mut o[m])
            }
        }
        BF16 => {
            for m in 0..M {
                float_tile::<K, 2>(w[m], x, cols, i0, &mut o[m])
            }
        }
        Q4_0 => pair_tile::<M, K, 0>(w, cols, p, i0, o),
        Q4_1 => pair_tile::<M, K, 1>(w, cols, p, i0, o),
        Q5_0 => pair_tile::<M, K, 2>(w, cols, p, i0, o),
        Q5_1 => pair_tile::<M, K, 3>(w, cols, p, i0, o),
        Q8_0 => pair_tile::<M, K, 4>(w, cols, p, i0, o),
        Q2_K => k_tile::<M, K, 2>(w, cols, p, i0, o),
        Q3_K => k_tile::<M, K, 3>(w, cols, p, i0, o),
        Q4_K => k_tile::<M, K, 4>(w, cols, p, i0, o),
        Q5_K => k_tile::<M, K, 5>(w, cols, p, i0, o),
        Q6_K => k_tile::<M, K, 6>(w, cols, p, i0, o),
        Q8_1 | Q8_K => unreachable!("activation formats"),
    }
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c,bmi2")]
unsafe fn f16_at(p: *const u8) -> f32 {
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128((p as *const u16).read_unaligned() as i32)))
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c,bmi2")]
unsafe fn hsum256(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// i16 lanes 0..16 = a, 16..32 = b.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c,bmi2")]
unsafe fn halves16(a: i16, b: i16) -> __m512i {
    _mm512_inserti64x4::<1>(_mm512_set1_epi16(a), _mm256_set1_epi16(b))
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c,bmi2")]
unsafe fn float_tile<const K: usize, const FT: u8>(w: &[u8], x: &[f32], cols: usize, i0: usize, o: &mut [f32; K]) {
    let wp = w.as_ptr();
    let xp: [*const f32; K] = std::array::from_fn(|j| x.as_ptr().add((i0 + j) * cols));
    let mut acc = [_mm512_setzero_ps(); K];
    let mut c = 0;
    while c < cols {
        let m = (cols - c).min(16);
        let mask: __mmask16 = if m == 16 { 0xFFFF } else { (1u16 << m) - 1 };
        let wv = match FT {
            0 => _mm512_maskz_loadu_ps(mask, wp.add(4 * c) as *const f32),
            1 => _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, wp.add(2 * c) as *const i16)),
            _ => _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, wp.add(2 * c) as *const i16)))),
        };
        for j in 0..K {
            acc[j] = _mm512_fmadd_ps(wv, _mm512_maskz_loadu_ps(mask, xp[j].add(c)), acc[j]);
        }
        c += 16;
    }
    for j in 0..K {
        o[j] = _mm512_reduce_add_ps(acc[j]);
    }
}

/// Lane mask of a group holding only `cnt` blocks.
#[inline(always)]
fn g16_mask(cnt: usize) -> __mmask16 {
    ((1u32 << cnt) - 1) as __mmask16
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c,bmi2")]
unsafe fn ld128<const FULL: bool>(base: *const u8, bb: usize, off: usize, cnt: usize, b: usize) -> __m128i {
    if FULL || b < cnt {
        _mm_loadu_si128(base.add(b * bb + off) as *const __m128i)
    } else {
        _mm_setzero_si128()
    }
}

/// The 16 bytes at `off` of 16 blocks (stride bb), transposed: vector t, lane k = dword t of
/// block k. Blocks >= cnt read as zero. (Row i of the 4x4 transpose holds blocks i, 4+i, 8+i,
/// 12+i, so the transposed lanes come out in block order.)
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c,bmi2")]
unsafe fn transpose16<const FULL: bool>(base: *const u8, bb: usize, off: usize, cnt: usize) -> [__m512i; 4] {
    let mut r = [_mm512_setzero_si512(); 4];
    for (i, v) in r.iter_mut().enumerate() {
        let mut x = _mm512_castsi128_si512(ld128::<FULL>(base, bb, off, cnt, i));
        x = _mm512_inserti32x4::<1>(x, ld128::<FULL>(base, bb, off, cnt, 4 + i));
        x = _mm512_inserti32x4::<2>(x, ld128::<FULL>(base, bb, off, cnt, 8 + i));
        x = _mm512_inserti32x4::<3>(x, ld128::<FULL>(base, bb, off, cnt, 12 + i));
        *v = x;
    }
    let ab_lo = _mm512_unpacklo_epi32(r[0], r[1]);
    let ab_hi = _mm512_unpackhi_epi32(r[0], r[1]);
    let cd_lo = _mm512_unpacklo_epi32(r[2], r[3]);
    let cd_hi = _mm512_unpackhi_epi32(r[2], r[3]);
    [_mm512_unpacklo_epi64(ab_lo, cd_lo), _mm512_unpackhi_epi64(ab_lo, cd_lo), _mm512_unpacklo_epi64(ab_hi, cd_hi), _mm512_unpackhi_epi64(ab_hi, cd_hi)]
}

/// One group of 16 blocks of a 32-block format: the unsigned weights of the 8 steps in the
/// activation layout, the 16 block scales, and the 16 correction factors (offset or min).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c,bmi2")]
unsafe fn group_weights<const F: u8, const FULL: bool>(base: *const u8, cnt: usize) -> ([__m512i; 8], __m512, __m512) {
    let (bb, qh_off, qs_off, has_m, bias): (usize, usize, usize, bool, f32) = match F {
        0 => (18, 0, 2, false, 8.0),
        1 => (20, 0, 4, true, 0.0),
        2 => (22, 2, 6, false, 16.0),
        3 => (24, 4, 8, true, 0.0),
        _ => (34, 0, 2, false, 128.0),
    };
    let zero = _mm512_setzero_si512();
    let mask: __mmask16 = if FULL { 0xFFFF } else { g16_mask(cnt) };
    let gidx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), _mm512_set1_epi32(bb as i32));
    let g0 = _mm512_mask_i32gather_epi32::<1>(zero, mask, gidx, base as *const _);
    let dv = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(g0));
    let cv = if has_m { _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(g0))) } else { _mm512_mul_ps(dv, _mm512_set1_ps(-bias)) };
    let mut u = [zero; 8];
    if F <= 3 {
        let m4 = _mm512_set1_epi8(0x0F);
        let t4 = transpose16::<FULL>(base, bb, qs_off, cnt);
        for t in 0..4 {
            u[t] = _mm512_and_si512(t4[t], m4);
            u[t + 4] = _mm512_and_si512(_mm512_srli_epi16::<4>(t4[t]), m4);
        }
        if F >= 2 {
            let hv = _mm512_mask_i32gather_epi32::<1>(zero, mask, gidx, base.add(qh_off) as *const _);
            // Byte 0 of every dword copied to all four bytes (vpshufb works per 128 bits).
            let (lo, hi) = (0x0404_0404_0000_0000i64, 0x0C0C_0C0C_0808_0808i64);
            let rep = _mm512_set_epi64(hi, lo, hi, lo, hi, lo, hi, lo);
            let pat = _mm512_set1_epi32(0x0804_0201);
            let b16 = _mm512_set1_epi8(16);
            for (t, ut) in u.iter_mut().enumerate() {
                let x = _mm512_srlv_epi32(hv, _mm512_set1_epi32(4 * t as i32));
                let k = _mm512_test_epi8_mask(_mm512_shuffle_epi8(x, rep), pat);
                *ut = _mm512_mask_add_epi8(*ut, k, *ut, b16);
            }
        }
    } else {
        let x80 = _mm512_set1_epi8(-128);
        let lo = transpose16::<FULL>(base, bb, 2, cnt);
        let hi = transpose16::<FULL>(base, bb, 18, cnt);
        for t in 0..4 {
            u[t] = _mm512_xor_si512(lo[t], x80);
            u[t + 4] = _mm512_xor_si512(hi[t], x80);
        }
    }
    (u, dv, cv)
}

/// `transpose16` for a group tail of at most 8 blocks, at 256 bits (lanes = blocks 0..8).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c,bmi2")]
unsafe fn transpose8(base: *const u8, bb: usize, off: usize, cnt: usize) -> [__m256i; 4] {
    let mut r = [_mm256_setzero_si256(); 4];
    for (i, v) in r.iter_mut().enumerate() {
        let x = _mm256_castsi128_si256(ld128::<false>(base, bb, off, cnt, i));
        *v = _mm256_inserti128_si256::<1>(x, ld128::<false>(base, bb, off, cnt, 4 + i));
    }
    let ab_lo = _mm256_unpacklo_epi32(r[0], r[1]);
    let ab_hi = _mm256_unpackhi_epi32(r[0], r[1]);
    let cd_lo = _mm256_unpacklo_epi32(r[2], r[3]);
    let cd_hi = _mm256_unpackhi_epi32(r[2], r[3]);
    [_mm256_unpacklo_epi64(ab_lo, cd_lo), _mm256_unpackhi_epi64(ab_lo, cd_lo), _mm256_unpacklo_epi64(ab_hi, cd_hi), _mm256_unpackhi_epi64(ab_hi, cd_hi)]
}

/// `group_weights` for a group tail of at most 8 blocks, at 256 bits.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c,bmi2")]
unsafe fn group8_weights<const F: u8>(base: *const u8, cnt: usize) -> ([__m256i; 8], __m256, __m256) {
    let (bb, qh_off, qs_off, has_m, bias): (usize, usize, usize, bool, f32) = match F {
        0 => (18, 0, 2, false, 8.0),
        1 => (20, 0, 4, true, 0.0),
        2 => (22, 2, 6, false, 16.0),
        3 => (24, 4, 8, true, 0.0),
        _ => (34, 0, 2, false, 128.0),
    };
    let zero = _mm256_setzero_si256();
    let mask = ((1u32 << cnt) - 1) as __mmask8;
    let gidx = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(bb as i32));
    let g0 = _mm256_mmask_i32gather_epi32::<1>(zero, mask, gidx, base as *const _);
    let dv = _mm256_cvtph_ps(_mm256_cvtepi32_epi16(g0));
    let cv = if has_m { _mm256_cvtph_ps(_mm256_cvtepi32_epi16(_mm256_srli_epi32::<16>(g0))) } else { _mm256_mul_ps(dv, _mm256_set1_ps(-bias)) };
    let mut u = [zero; 8];
    if F <= 3 {
        let m4 = _mm256_set1_epi8(0x0F);
        let t4 = transpose8(base, bb, qs_off, cnt);
        for t in 0..4 {
            u[t] = _mm256_and_si256(t4[t], m4);
            u[t + 4] = _mm256_and_si256(_mm256_srli_epi16::<4>(t4[t]), m4);
        }
        if F >= 2 {
            let hv = _mm256_mmask_i32gather_epi32::<1>(zero, mask, gidx, base.add(qh_off) as *const _);
            let rep = _mm256_setr_epi8(0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12, 0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12);
            let pat = _mm256_set1_epi32(0x0804_0201);
            let b16 = _mm256_set1_epi8(16);
            for (t, ut) in u.iter_mut().enumerate() {
                let x = _mm256_srlv_epi32(hv, _mm256_set1_epi32(4 * t as i32));
                let k = _mm256_test_epi8_mask(_mm256_shuffle_epi8(x, rep), pat);
                *ut = _mm256_mask_add_epi8(*ut, k, *ut, b16);
            }
        }
    } else {
        let x80 = _mm256_set1_epi8(-128);
        let lo = transpose8(base, bb, 2, cnt);
        let hi = transpose8(base, bb, 18, cnt);
        for t in 0..4 {
            u[t] = _mm256_xor_si256(lo[t], x80);
            u[t + 4] = _mm256_xor_si256(hi[t], x80);
        }
    }
    (u, dv, cv)
}

/// 32-block formats. F: 0 Q4_0, 1 Q4_1, 2 Q5_0, 3 Q5_1, 4 Q8_0.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c,bmi2")]
unsafe fn pair_tile<const M: usize, const K: usize, const F: u8>(w: [&[u8]; M], cols: usize, p: &Prepared, i0: usize, o: &mut [[f32; K]; M]) {
    let bb = [18, 20, 22, 24, 34][F as usize];
    let nb = cols / 32;
    let aq: [*const i8; K] = std::array::from_fn(|j| p.qs.as_ptr().add((i0 + j) * p.qs_stride));
    let ad: [*const f32; K] = std::array::from_fn(|j| p.d.as_ptr().add((i0 + j) * p.d_stride));
    let asum: [*const f32; K] = std::array::from_fn(|j| p.s.as_ptr().add((i0 + j) * p.d_stride));
    let mut acc = [[_mm512_setzero_ps(); K]; M];
    for g in 0..nb.div_ceil(16) {
        let cnt = (nb - 16 * g).min(16);
        prefetch_rows(&w, 16 * (g + PF_GROUPS) * bb, 16 * bb);
        if cnt <= 8 {
            for m in 0..M {
                let (u, dv, cv) = group8_weights::<F>(w[m].as_ptr().add(16 * g * bb), cnt);
                for j in 0..K {
                    let a = aq[j].add(512 * g);
                    let mut ai = _mm256_setzero_si256();
                    for (t, ut) in u.iter().enumerate() {
                        ai = _mm256_dpbusd_epi32(ai, *ut, _mm256_loadu_si256(a.add(64 * t) as *const __m256i));
                    }
                    let sa = _mm256_loadu_ps(asum[j].add(16 * g));
                    acc[m][j] = _mm512_fmadd_ps(_mm512_zextps256_ps512(cv), _mm512_zextps256_ps512(sa), acc[m][j]);
                    let sc = _mm256_mul_ps(dv, _mm256_loadu_ps(ad[j].add(16 * g)));
                    acc[m][j] = _mm512_fmadd_ps(_mm512_zextps256_ps512(_mm256_cvtepi32_ps(ai)), _mm512_zextps256_ps512(sc), acc[m][j]);
                }
            }
            continue;
        }
        for m in 0..M {
            let base = w[m].as_ptr().add(16 * g * bb);
            let (u, dv, cv) = if cnt == 16 { group_weights::<F, true>(base, 16) } else { group_weights::<F, false>(base, cnt) };
            for j in 0..K {
                let a = aq[j].add(512 * g);
                let mut ai = _mm512_setzero_si512();
                for (t, ut) in u.iter().enumerate() {
                    ai = _mm512_dpbusd_epi32(ai, *ut, _mm512_loadu_si512(a.add(64 * t) as *const _));
                }
                acc[m][j] = _mm512_fmadd_ps(cv, _mm512_loadu_ps(asum[j].add(16 * g)), acc[m][j]);
                let sc = _mm512_mul_ps(dv, _mm512_loadu_ps(ad[j].add(16 * g)));
                acc[m][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ai), sc, acc[m][j]);
            }
        }
    }
    for m in 0..M {
        for j in 0..K {
            o[m][j] = _mm512_reduce_add_ps(acc[m][j]);
        }
    }
}

/// Groups (of 16 blocks) or superblocks ahead a one-row tile asks the weights of: the
/// hardware's prefetchers do not run far enough ahead of a decode step's streams of weight
/// rows, whose first loads otherwise wait on memory.
const PF_GROUPS: usize = 1;

/// Ask for bytes `off .. off + len` of each weight row (past a row's end: nothing).
#[inline(always)]
unsafe fn prefetch_rows<const M: usize>(w: &[&[u8]; M], off: usize, len: usize) {
    for row in w {
        let end = (off + len).min(row.len());
        let mut o = off;
        while o < end {
            _mm_prefetch::<_MM_HINT_T0>(row.as_ptr().add(o) as *const i8);
            o += 64;
        }
    }
}

/// Scale-pattern indices: for 16-value sub-blocks, group g's i16 lane k takes scale 4g + k/8;
/// for 32-value sub-blocks (Q4_K, Q5_K), scale 2g + k/16.
const fn idx_tables(per: usize) -> [[i16; 32]; 4] {
    let mut t = [[0i16; 32]; 4];
    let mut g = 0;
    while g < 4 {
        let mut k = 0;
        while k < 32 {
            t[g][k] = if per == 16 { (4 * g + k / 8) as i16 } else { (2 * g + k / 16) as i16 };
            k += 1;
        }
        g += 1;
    }
    t
}
static IDX16: [[i16; 32]; 4] = idx_tables(16);
static IDX32: [[i16; 32]; 4] = idx_tables(32);

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c,bmi2")]
unsafe fn pattern(table: &[[i16; 32]; 4], g: usize, sc: __m512i) -> __m512i {
    _mm512_permutexvar_epi16(_mm512_loadu_si512(table[g].as_ptr() as *const _), sc)
}

struct KActs<const K: usize> {
    q: [*const i8; K],
    d: [*const f32; K],
    bsums: [*const i16; K],
}

impl<const K: usize> KActs<K> {
    #[inline(always)]
    unsafe fn new(p: &Prepared, i0: usize) -> Self {
        KActs {
            q: std::array::from_fn(|j| p.qs.as_ptr().add((i0 + j) * p.qs_stride)),
            d: std::array::from_fn(|j| p.d.as_ptr().add((i0 + j) * p.d_stride)),
            bsums: std::array::from_fn(|j| p.bsums.as_ptr().add((i0 + j) * p.d_stride * 16)),
        }
    }
}

/// One K-quant superblock's scales: d, dmin, the sub-block scales as i16 (for `vpermw`), the
/// per-16 mins (Q2_K, Q4_K, Q5_K) and the per-16 offset correction (-offset * scale; Q3_K, Q6_K).
#[derive(Clone, Copy)]
struct KHead {
    d: f32,
    dmin: f32,
    sc: __m512i,
    mn16: __m256i,
    corr: __m512i,
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c,bmi2")]
unsafe fn k_head<const T: u8>(blk: *const u8) -> KHead {
    let z256 = _mm256_setzero_si256();
    match T {
        2 => {
            let raw = _mm_loadu_si128(blk as *const __m128i);
            let m4 = _mm_set1_epi8(0x0F);
            KHead {
                d: f16_at(blk.add(80)),
                dmin: f16_at(blk.add(82)),
                sc: _mm512_castsi256_si512(_mm256_cvtepu8_epi16(_mm_and_si128(raw, m4))),
                mn16: _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16::<4>(raw), m4)),
                corr: _mm512_setzero_si512(),
            }
        }
        3 => {
            let s = q3_scales(std::slice::from_raw_parts(blk.add(96), 12));
            let sc = _mm256_cvtepi8_epi16(_mm_loadu_si128(s.as_ptr() as *const __m128i));
            KHead {
                d: f16_at(blk.add(108)),
                dmin: 0.0,
                sc: _mm512_castsi256_si512(sc),
                mn16: z256,
                corr: _mm512_zextsi256_si512(_mm256_sub_epi16(z256, _mm256_slli_epi16::<2>(sc))),
            }
        }
        4 | 5 => {
            let (sc, mn) = k4_scales(std::slice::from_raw_parts(blk.add(4), 12));
            let mn8 = _mm_cvtepu8_epi16(_mm_loadl_epi64(mn.as_ptr() as *const __m128i));
            KHead {
                d: f16_at(blk),
                dmin: f16_at(blk.add(2)),
                sc: _mm512_castsi128_si512(_mm_cvtepu8_epi16(_mm_loadl_epi64(sc.as_ptr() as *const __m128i))),
                mn16: _mm256_set_m128i(_mm_unpackhi_epi16(mn8, mn8), _mm_unpacklo_epi16(mn8, mn8)),
                corr: _mm512_setzero_si512(),
            }
        }
        _ => {
            let sc = _mm256_cvtepi8_epi16(_mm_loadu_si128(blk.add(192) as *const __m128i));
            KHead {
                d: f16_at(blk.add(208)),
                dmin: 0.0,
                sc: _mm512_castsi256_si512(sc),
                mn16: z256,
                corr: _mm512_zextsi256_si512(_mm256_sub_epi16(z256, _mm256_slli_epi16::<5>(sc))),
            }
        }
    }
}

/// The 64 unsigned values of group g (values 64g..64g+64) of a superblock, natural order.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c,bmi2")]
unsafe fn k_unpack<const T: u8>(blk: *const u8, g: usize) -> __m512i {
    let one = _mm512_set1_epi8(1);
    let three = _mm512_set1_epi8(3);
    let m4 = _mm512_set1_epi8(0x0F);
    let bcast = |off: usize| _mm512_broadcast_i64x4(_mm256_loadu_si256(blk.add(off) as *const __m256i));
    match T {
        2 | 3 => {
            let (h, jj) = ((g / 2) as i16, (2 * (g % 2)) as i16);
            let q = bcast(if T == 2 { 16 } else { 32 } + 32 * (g / 2));
            let lo = _mm512_and_si512(_mm512_srlv_epi16(q, halves16(2 * jj, 2 * jj + 2)), three);
            if T == 3 {
                let hb = _mm512_and_si512(_mm512_srlv_epi16(bcast(0), halves16(4 * h + jj, 4 * h + jj + 1)), one);
                _mm512_or_si512(lo, _mm512_slli_epi16::<2>(hb))
            } else {
                lo
            }
        }
        4 | 5 => {
            let q = bcast(if T == 5 { 48 } else { 16 } + 32 * g);
            let u = _mm512_and_si512(_mm512_srlv_epi16(q, halves16(0, 4)), m4);
            if T == 5 {
                let hb = _mm512_and_si512(_mm512_srlv_epi16(bcast(16), halves16(2 * g as i16, 2 * g as i16 + 1)), one);
                _mm512_or_si512(u, _mm512_slli_epi16::<4>(hb))
            } else {
                u
            }
        }
        _ => {
            let (h, t) = (g / 2, g % 2);
            let ql = _mm512_loadu_si512(blk.add(64 * h) as *const _);
            let nib = if t == 0 { _mm512_and_si512(ql, m4) } else { _mm512_and_si512(_mm512_srli_epi16::<4>(ql), m4) };
            let shifts = if t == 0 { halves16(0, 2) } else { halves16(4, 6) };
            let hb = _mm512_and_si512(_mm512_srlv_epi16(bcast(128 + 32 * h), shifts), three);
            _mm512_or_si512(nib, _mm512_slli_epi16::<4>(hb))
        }
    }
}

/// K-quants. T: 2 Q2_K, 3 Q3_K, 4 Q4_K, 5 Q5_K, 6 Q6_K.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c,bmi2")]
unsafe fn k_tile<const M: usize, const K: usize, const T: u8>(w: [&[u8]; M], cols: usize, p: &Prepared, i0: usize, o: &mut [[f32; K]; M]) {
    let bb = match T {
        2 => 84,
        3 => 110,
        4 => 144,
        5 => 176,
        _ => 210,
    };
    let has_min = matches!(T, 2 | 4 | 5);
    let table = if matches!(T, 4 | 5) { &IDX32 } else { &IDX16 };
    let a = KActs::<K>::new(p, i0);
    let mut acc = [[_mm512_setzero_ps(); K]; M];
    let mut accm = [[_mm256_setzero_ps(); K]; M];
    for sb in 0..cols / 256 {
        prefetch_rows(&w, (sb + PF_GROUPS) * bb, bb);
        let blk: [*const u8; M] = std::array::from_fn(|m| w[m].as_ptr().add(sb * bb));
        let head: [KHead; M] = std::array::from_fn(|m| k_head::<T>(blk[m]));
        let mut ai = [[_mm512_setzero_si512(); K]; M];
        for g in 0..4 {
            let u: [__m512i; M] = std::array::from_fn(|m| k_unpack::<T>(blk[m], g));
            let sp: [__m512i; M] = std::array::from_fn(|m| pattern(table, g, head[m].sc));
            for j in 0..K {
                let av = _mm512_loadu_si512(a.q[j].add(sb * 256 + 64 * g) as *const _);
                for m in 0..M {
                    ai[m][j] = _mm512_dpwssd_epi32(ai[m][j], _mm512_maddubs_epi16(u[m], av), sp[m]);
                }
            }
        }
        for j in 0..K {
            let da = *a.d[j].add(sb);
            let bs = _mm256_loadu_si256(a.bsums[j].add(sb * 16) as *const __m256i);
            for m in 0..M {
                let h = &head[m];
                if has_min {
                    acc[m][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ai[m][j]), _mm512_set1_ps(h.d * da), acc[m][j]);
                    let mi = _mm256_cvtepi32_ps(_mm256_madd_epi16(h.mn16, bs));
                    accm[m][j] = _mm256_fmadd_ps(mi, _mm256_set1_ps(-h.dmin * da), accm[m][j]);
                } else {
                    let v = _mm512_dpwssd_epi32(ai[m][j], h.corr, _mm512_zextsi256_si512(bs));
                    acc[m][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(v), _mm512_set1_ps(h.d * da), acc[m][j]);
                }
            }
        }
    }
    for m in 0..M {
        for j in 0..K {
            o[m][j] = _mm512_reduce_add_ps(acc[m][j]);
            if has_min {
                o[m][j] += hsum256(accm[m][j]);
            }
        }
    }
}

// ---- Prefill: weights unpacked once per chunk, then reused by every activation tile. ----
//
// The packed values are exactly what `group_weights` / `group8_weights` (pair formats) return,
// and the tiles below run the same per-block arithmetic in the same order as `pair_tile`, so
// every output element is bit-identical to the unpacked path (and so to n = 1).

/// Bytes of one packed group of 16 blocks: 8 steps of 64 bytes, then 16 f32 scales (dv) and
/// 16 f32 corrections (cv). A group of at most 8 blocks uses the low halves (256-bit values).
const PG: usize = 640;

/// Whether `packed_rows` handles the format.
pub(super) fn packs(ty: GgmlType) -> bool {
    use GgmlType::*;
    matches!(ty, Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q2_K | Q3_K | Q4_K | Q5_K | Q6_K)
}

/// Packed bytes of one weight row of `cols` columns.
pub(super) fn packed_row_bytes(ty: GgmlType, cols: usize) -> usize {
    if ty.block_len() == 256 {
        cols / 256 * PG
    } else {
        (cols / 32).div_ceil(16) * PG
    }
}

/// Unpacks one weight row into `dst` (`packed_row_bytes` long).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c,bmi2")]
pub(super) unsafe fn pack_row(ty: GgmlType, w: &[u8], cols: usize, dst: &mut [u8]) {
    use GgmlType::*;
    match ty {
        Q4_0 => pack_pair::<0>(w, cols, dst),
        Q4_1 => pack_pair::<1>(w, cols, dst),
        Q5_0 => pack_pair::<2>(w, cols, dst),
        Q5_1 => pack_pair::<3>(w, cols, dst),
        Q8_0 => pack_pair::<4>(w, cols, dst),
        Q2_K => pack_k::<2>(w, cols, dst),
        Q3_K => pack_k::<3>(w, cols, dst),
        Q4_K => pack_k::<4>(w, cols, dst),
        Q5_K => pack_k::<5>(w, cols, dst),
        Q6_K => pack_k::<6>(w, cols, dst),
        _ => unreachable!("no packed layout for {ty}"),
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c,bmi2")]
unsafe fn pack_pair<const F: u8>(w: &[u8], cols: usize, dst: &mut [u8]) {
    let bb = [18, 20, 22, 24, 34][F as usize];
    let nb = cols / 32;
    assert!(dst.len() >= nb.div_ceil(16) * PG);
    for g in 0..nb.div_ceil(16) {
        let cnt = (nb - 16 * g).min(16);
        let base = w.as_ptr().add(16 * g * bb);
        let d = dst.as_mut_ptr().add(g * PG);
        if cnt <= 8 {
            let (u, dv, cv) = group8_weights::<F>(base, cnt);
            for (t, ut) in u.iter().enumerate() {
                _mm256_storeu_si256(d.add(64 * t) as *mut __m256i, *ut);
            }
            _mm256_storeu_ps(d.add(512) as *mut f32, dv);
            _mm256_storeu_ps(d.add(576) as *mut f32, cv);
        } else {
            let (u, dv, cv) = if cnt == 16 { group_weights::<F, true>(base, 16) } else { group_weights::<F, false>(base, cnt) };
            for (t, ut) in u.iter().enumerate() {
                _mm512_storeu_si512(d.add(64 * t) as *mut _, *ut);
            }
            _mm512_storeu_ps(d.add(512) as *mut f32, dv);
            _mm512_storeu_ps(d.add(576) as *mut f32, cv);
        }
    }
}

/// Activation rows `i0..i0 + K` against M packed weight rows (`pk[m]`), `cols` columns.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c,bmi2")]
pub(super) unsafe fn packed_tile<const M: usize, const K: usize>(ty: GgmlType, pk: [*const u8; M], cols: usize, p: &Prepared, i0: usize, o: &mut [[f32; K]; M]) {
    use GgmlType::*;
    match ty {
        Q2_K => k_packed_tile::<M, K, 2>(pk, cols, p, i0, o),
        Q3_K => k_packed_tile::<M, K, 3>(pk, cols, p, i0, o),
        Q4_K => k_packed_tile::<M, K, 4>(pk, cols, p, i0, o),
        Q5_K => k_packed_tile::<M, K, 5>(pk, cols, p, i0, o),
        Q6_K => k_packed_tile::<M, K, 6>(pk, cols, p, i0, o),
        _ => pair_packed_tile::<M, K>(pk, cols, p, i0, o),
    }
}

/// K-quant superblock, packed (PG bytes): the 4 groups' unsigned values (`k_unpack`), their 4
/// scale patterns, then mn16 (32 bytes), the low half of corr (32 bytes), d and dmin.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c,bmi2")]
unsafe fn pack_k<const T: u8>(w: &[u8], cols: usize, dst: &mut [u8]) {
    let bb = match T {
        2 => 84,
        3 => 110,
        4 => 144,
        5 => 176,
        _ => 210,
    };
    let table = if matches!(T, 4 | 5) { &IDX32 } else { &IDX16 };
    assert!(dst.len() >= cols / 256 * PG);
    for sb in 0..cols / 256 {
        let blk = w.as_ptr().add(sb * bb);
        let d = dst.as_mut_ptr().add(sb * PG);
        let h = k_head::<T>(blk);
        for g in 0..4 {
            _mm512_storeu_si512(d.add(64 * g) as *mut _, k_unpack::<T>(blk, g));
            _mm512_storeu_si512(d.add(256 + 64 * g) as *mut _, pattern(table, g, h.sc));
        }
        _mm256_storeu_si256(d.add(512) as *mut __m256i, h.mn16);
        _mm256_storeu_si256(d.add(544) as *mut __m256i, _mm512_castsi512_si256(h.corr));
        (d.add(576) as *mut f32).write_unaligned(h.d);
        (d.add(580) as *mut f32).write_unaligned(h.dmin);
    }
}

/// `k_tile` on packed superblocks: the same arithmetic in the same order.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c,bmi2")]
unsafe fn k_packed_tile<const M: usize, const K: usize, const T: u8>(pk: [*const u8; M], cols: usize, p: &Prepared, i0: usize, o: &mut [[f32; K]; M]) {
    let has_min = matches!(T, 2 | 4 | 5);
    let a = KActs::<K>::new(p, i0);
    let mut acc = [[_mm512_setzero_ps(); K]; M];
    let mut accm = [[_mm256_setzero_ps(); K]; M];
    for sb in 0..cols / 256 {
        let blk: [*const u8; M] = std::array::from_fn(|m| pk[m].add(sb * PG));
        let mut ai = [[_mm512_setzero_si512(); K]; M];
        for g in 0..4 {
            let u: [__m512i; M] = std::array::from_fn(|m| _mm512_loadu_si512(blk[m].add(64 * g) as *const _));
            let sp: [__m512i; M] = std::array::from_fn(|m| _mm512_loadu_si512(blk[m].add(256 + 64 * g) as *const _));
            for j in 0..K {
                let av = _mm512_loadu_si512(a.q[j].add(sb * 256 + 64 * g) as *const _);
                for m in 0..M {
                    ai[m][j] = _mm512_dpwssd_epi32(ai[m][j], _mm512_maddubs_epi16(u[m], av), sp[m]);
                }
            }
        }
        for j in 0..K {
            let da = *a.d[j].add(sb);
            let bs = _mm256_loadu_si256(a.bsums[j].add(sb * 16) as *const __m256i);
            for m in 0..M {
                let hd = (blk[m].add(576) as *const f32).read_unaligned();
                if has_min {
                    let hdmin = (blk[m].add(580) as *const f32).read_unaligned();
                    let mn16 = _mm256_loadu_si256(blk[m].add(512) as *const __m256i);
                    acc[m][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ai[m][j]), _mm512_set1_ps(hd * da), acc[m][j]);
                    let mi = _mm256_cvtepi32_ps(_mm256_madd_epi16(mn16, bs));
                    accm[m][j] = _mm256_fmadd_ps(mi, _mm256_set1_ps(-hdmin * da), accm[m][j]);
                } else {
                    let corr = _mm512_zextsi256_si512(_mm256_loadu_si256(blk[m].add(544) as *const __m256i));
                    let v = _mm512_dpwssd_epi32(ai[m][j], corr, _mm512_zextsi256_si512(bs));
                    acc[m][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(v), _mm512_set1_ps(hd * da), acc[m][j]);
                }
            }
        }
    }
    for m in 0..M {
        for j in 0..K {
            o[m][j] = _mm512_reduce_add_ps(acc[m][j]);
            if has_min {
                o[m][j] += hsum256(accm[m][j]);
            }
        }
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c,bmi2")]
unsafe fn pair_packed_tile<const M: usize, const K: usize>(pk: [*const u8; M], cols: usize, p: &Prepared, i0: usize, o: &mut [[f32; K]; M]) {
    let nb = cols / 32;
    let aq: [*const i8; K] = std::array::from_fn(|j| p.qs.as_ptr().add((i0 + j) * p.qs_stride));
    let ad: [*const f32; K] = std::array::from_fn(|j| p.d.as_ptr().add((i0 + j) * p.d_stride));
    let asum: [*const f32; K] = std::array::from_fn(|j| p.s.as_ptr().add((i0 + j) * p.d_stride));
    let mut acc = [[_mm512_setzero_ps(); K]; M];
    for g in 0..nb.div_ceil(16) {
        let cnt = (nb - 16 * g).min(16);
        if cnt <= 8 {
            for m in 0..M {
                let gp = pk[m].add(g * PG);
                let u: [__m256i; 8] = std::array::from_fn(|t| _mm256_loadu_si256(gp.add(64 * t) as *const __m256i));
                let dv = _mm256_loadu_ps(gp.add(512) as *const f32);
                let cv = _mm256_loadu_ps(gp.add(576) as *const f32);
                for j in 0..K {
                    let a = aq[j].add(512 * g);
                    let mut ai = _mm256_setzero_si256();
                    for (t, ut) in u.iter().enumerate() {
                        ai = _mm256_dpbusd_epi32(ai, *ut, _mm256_loadu_si256(a.add(64 * t) as *const __m256i));
                    }
                    let sa = _mm256_loadu_ps(asum[j].add(16 * g));
                    acc[m][j] = _mm512_fmadd_ps(_mm512_zextps256_ps512(cv), _mm512_zextps256_ps512(sa), acc[m][j]);
                    let sc = _mm256_mul_ps(dv, _mm256_loadu_ps(ad[j].add(16 * g)));
                    acc[m][j] = _mm512_fmadd_ps(_mm512_zextps256_ps512(_mm256_cvtepi32_ps(ai)), _mm512_zextps256_ps512(sc), acc[m][j]);
                }
            }
            continue;
        }
        for m in 0..M {
            let gp = pk[m].add(g * PG);
            let u: [__m512i; 8] = std::array::from_fn(|t| _mm512_loadu_si512(gp.add(64 * t) as *const _));
            let dv = _mm512_loadu_ps(gp.add(512) as *const f32);
            let cv = _mm512_loadu_ps(gp.add(576) as *const f32);
            for j in 0..K {
                let a = aq[j].add(512 * g);
                let mut ai = _mm512_setzero_si512();
                for (t, ut) in u.iter().enumerate() {
                    ai = _mm512_dpbusd_epi32(ai, *ut, _mm512_loadu_si512(a.add(64 * t) as *const _));
                }
                acc[m][j] = _mm512_fmadd_ps(cv, _mm512_loadu_ps(asum[j].add(16 * g)), acc[m][j]);
                let sc = _mm512_mul_ps(dv, _mm512_loadu_ps(ad[j].add(16 * g)));
                acc[m][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ai), sc, acc[m][j]);
            }
        }
    }
    for m in 0..M {
        for j in 0..K {
            o[m][j] = _mm512_reduce_add_ps(acc[m][j]);
        }
    }
}
