//! The AVX2 path (AVX2, FMA, F16C, BMI2): 32 values a step.
//!
//! Same scheme as avx512.rs with `vpmaddubsw` + `vpmaddwd` in place of the VNNI instructions.
//! Q8_0 uses the sign trick (|w| times a with w's sign) because `vpmaddubsw` saturates, so it
//! needs no correction. Each output element is reduced in a fixed order.

use super::acts::Prepared;
use super::blocks::{k4_scales, q3_scales};
use resin_gguf::GgmlType;
use std::arch::x86_64::*;

#[target_feature(enable = "avx2,fma,f16c,bmi2")]
pub(super) unsafe fn tile<const K: usize>(ty: GgmlType, w: &[u8], x: &[f32], cols: usize, p: &Prepared, i0: usize, o: &mut [f32; K]) {
    use GgmlType::*;
    match ty {
        F32 => float_tile::<K, 0>(w, x, cols, i0, o),
        F16 => float_tile::<K, 1>(w, x, cols, i0, o),
        BF16 => float_tile::<K, 2>(w, x, cols, i0, o),
        Q4_0 => pair_tile::<K, 0>(w, cols, p, i0, o),
        Q4_1 => pair_tile::<K, 1>(w, cols, p, i0, o),
        Q5_0 => pair_tile::<K, 2>(w, cols, p, i0, o),
        Q5_1 => pair_tile::<K, 3>(w, cols, p, i0, o),
        Q8_0 => pair_tile::<K, 4>(w, cols, p, i0, o),
        Q2_K | Q3_K | Q4_K | Q5_K | Q6_K => k_tile::<K>(ty, w, cols, p, i0, o),
        Q8_1 | Q8_K => unreachable!("activation formats"),
    }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c,bmi2")]
unsafe fn f16_at(p: *const u8) -> f32 {
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128((p as *const u16).read_unaligned() as i32)))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c,bmi2")]
unsafe fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

#[target_feature(enable = "avx2,fma,f16c,bmi2")]
unsafe fn float_tile<const K: usize, const FT: u8>(w: &[u8], x: &[f32], cols: usize, i0: usize, o: &mut [f32; K]) {
    let wp = w.as_ptr();
    let xp: [*const f32; K] = std::array::from_fn(|j| x.as_ptr().add((i0 + j) * cols));
    let mut acc = [_mm256_setzero_ps(); K];
    let full = cols / 8 * 8;
    let mut c = 0;
    while c < full {
        let wv = match FT {
            0 => _mm256_loadu_ps(wp.add(4 * c) as *const f32),
            1 => _mm256_cvtph_ps(_mm_loadu_si128(wp.add(2 * c) as *const __m128i)),
            _ => _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(_mm_loadu_si128(wp.add(2 * c) as *const __m128i)))),
        };
        for j in 0..K {
            acc[j] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(xp[j].add(c)), acc[j]);
        }
        c += 8;
    }
    for j in 0..K {
        let mut tail = 0f32;
        for c in full..cols {
            tail += super::portable::float_at([GgmlType::F32, GgmlType::F16, GgmlType::BF16][FT as usize], w, c) * *xp[j].add(c);
        }
        o[j] = hsum(acc[j]) + tail;
    }
}

/// 32-block formats. F: 0 Q4_0, 1 Q4_1, 2 Q5_0, 3 Q5_1, 4 Q8_0. Each group of 16 blocks in
/// two halves of 8 lanes; the weights' dwords come in by gathers in the activation layout.
#[target_feature(enable = "avx2,fma,f16c,bmi2")]
unsafe fn pair_tile<const K: usize, const F: u8>(w: &[u8], cols: usize, p: &Prepared, i0: usize, o: &mut [f32; K]) {
    let (bb, qh_off, qs_off, has_m, bias): (usize, usize, usize, bool, f32) = match F {
        0 => (18, 0, 2, false, 8.0),
        1 => (20, 0, 4, true, 0.0),
        2 => (22, 2, 6, false, 16.0),
        3 => (24, 4, 8, true, 0.0),
        _ => (34, 0, 2, false, 0.0),
    };
    let nb = cols / 32;
    let aq: [*const i8; K] = std::array::from_fn(|j| p.qs.as_ptr().add((i0 + j) * p.qs_stride));
    let ad: [*const f32; K] = std::array::from_fn(|j| p.d.as_ptr().add((i0 + j) * p.d_stride));
    let asum: [*const f32; K] = std::array::from_fn(|j| p.s.as_ptr().add((i0 + j) * p.d_stride));
    let mut acc = [_mm256_setzero_ps(); K];
    let m4 = _mm256_set1_epi8(0x0F);
    let ones = _mm256_set1_epi16(1);
    let lo16 = _mm256_set1_epi32(0xFFFF);
    let zero = _mm256_setzero_si256();
    let rep = _mm256_setr_epi8(0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12, 0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12);
    let pat = _mm256_set1_epi32(0x0804_0201);
    let b16 = _mm256_set1_epi8(16);
    for g in 0..nb.div_ceil(16) {
        let cnt = (nb - 16 * g).min(16);
        let base = w.as_ptr().add(16 * g * bb);
        for h in 0..2 {
            let blocks: [i32; 8] = std::array::from_fn(|i| (8 * h + i) as i32);
            let idx = _mm256_mullo_epi32(_mm256_loadu_si256(blocks.as_ptr() as *const __m256i), _mm256_set1_epi32(bb as i32));
            let valid = _mm256_cmpgt_epi32(_mm256_set1_epi32(cnt as i32), _mm256_loadu_si256(blocks.as_ptr() as *const __m256i));
            let gat = |off: usize| _mm256_mask_i32gather_epi32::<1>(zero, base.add(off) as *const i32, idx, valid);
            let g0 = gat(0);
            let half8 = |v: __m256i| {
                let pk = _mm256_packus_epi32(_mm256_and_si256(v, lo16), _mm256_and_si256(v, lo16));
                _mm256_cvtph_ps(_mm256_castsi256_si128(_mm256_permute4x64_epi64::<0b1000>(pk)))
            };
            let dv = half8(g0);
            let cv = if has_m { half8(_mm256_srli_epi32::<16>(g0)) } else { _mm256_mul_ps(dv, _mm256_set1_ps(-bias)) };
            // Step t of the 8: lane i holds values 4t..4t+4 of block 8h + i.
            let mut u = [zero; 8];
            if F <= 3 {
                for t in 0..4 {
                    let v = gat(qs_off + 4 * t);
                    u[t] = _mm256_and_si256(v, m4);
                    u[t + 4] = _mm256_and_si256(_mm256_srli_epi16::<4>(v), m4);
                }
                if F >= 2 {
                    let hv = gat(qh_off);
                    for (t, ut) in u.iter_mut().enumerate() {
                        let x = _mm256_shuffle_epi8(_mm256_srlv_epi32(hv, _mm256_set1_epi32(4 * t as i32)), rep);
                        let is = _mm256_cmpeq_epi8(_mm256_and_si256(x, pat), pat);
                        *ut = _mm256_or_si256(*ut, _mm256_and_si256(is, b16));
                    }
                }
            } else {
                for (t, ut) in u.iter_mut().enumerate() {
                    *ut = gat(2 + 4 * t);
                }
            }
            for j in 0..K {
                let a = aq[j].add(512 * g + 32 * h);
                let mut ai = zero;
                for (t, ut) in u.iter().enumerate() {
                    let av = _mm256_loadu_si256(a.add(64 * t) as *const __m256i);
                    let p16 = if F == 4 { _mm256_maddubs_epi16(_mm256_sign_epi8(*ut, *ut), _mm256_sign_epi8(av, *ut)) } else { _mm256_maddubs_epi16(*ut, av) };
                    ai = _mm256_add_epi32(ai, _mm256_madd_epi16(p16, ones));
                }
                if F != 4 {
                    acc[j] = _mm256_fmadd_ps(cv, _mm256_loadu_ps(asum[j].add(16 * g + 8 * h)), acc[j]);
                }
                let sc = _mm256_mul_ps(dv, _mm256_loadu_ps(ad[j].add(16 * g + 8 * h)));
                acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ai), sc, acc[j]);
            }
        }
    }
    for j in 0..K {
        o[j] = hsum(acc[j]);
    }
}

/// K-quants, 32 values (group k of 8) a step.
#[target_feature(enable = "avx2,fma,f16c,bmi2")]
unsafe fn k_tile<const K: usize>(ty: GgmlType, w: &[u8], cols: usize, p: &Prepared, i0: usize, o: &mut [f32; K]) {
    let bb = ty.block_bytes();
    let aq: [*const i8; K] = std::array::from_fn(|j| p.qs.as_ptr().add((i0 + j) * p.qs_stride));
    let ad: [*const f32; K] = std::array::from_fn(|j| p.d.as_ptr().add((i0 + j) * p.d_stride));
    let abs: [*const i16; K] = std::array::from_fn(|j| p.bsums.as_ptr().add((i0 + j) * p.d_stride * 16));
    let m4 = _mm256_set1_epi8(0x0F);
    let one = _mm256_set1_epi8(1);
    let three = _mm256_set1_epi8(3);
    let mut acc = [_mm256_setzero_ps(); K];
    let mut accm = [_mm256_setzero_ps(); K];
    for sb in 0..cols / 256 {
        let blk = w.as_ptr().add(sb * bb);
        let bs = std::slice::from_raw_parts(blk, bb);
        // Per-16 scales (sc16) and per-16 mins (mn16), d, dmin, and the offset of the
        // unsigned values (folded into the per-16 correction scale `corr`).
        let mut sc16 = [0i16; 16];
        let mut mn16 = [0i16; 16];
        let (d, dmin, off): (f32, f32, i16) = match ty {
            GgmlType::Q2_K => {
                for i in 0..16 {
                    sc16[i] = (bs[i] & 0xF) as i16;
                    mn16[i] = (bs[i] >> 4) as i16;
                }
                (f16_at(blk.add(80)), f16_at(blk.add(82)), 0)
            }
            GgmlType::Q3_K => {
                let s = q3_scales(&bs[96..108]);
                for i in 0..16 {
                    sc16[i] = s[i] as i16;
                }
                (f16_at(blk.add(108)), 0.0, 4)
            }
            GgmlType::Q4_K | GgmlType::Q5_K => {
                let (s, m) = k4_scales(&bs[4..16]);
                for i in 0..16 {
                    sc16[i] = s[i / 2] as i16;
                    mn16[i] = m[i / 2] as i16;
                }
                (f16_at(blk), f16_at(blk.add(2)), 0)
            }
            _ => {
                for i in 0..16 {
                    sc16[i] = bs[192 + i] as i8 as i16;
                }
                (f16_at(blk.add(208)), 0.0, 32)
            }
        };
        let has_min = matches!(ty, GgmlType::Q2_K | GgmlType::Q4_K | GgmlType::Q5_K);
        let mut ai = [_mm256_setzero_si256(); K];
        for k in 0..8 {
            let u = match ty {
                GgmlType::Q2_K | GgmlType::Q3_K => {
                    let (h, j) = (k / 4, k % 4);
                    let qoff = if ty == GgmlType::Q2_K { 16 } else { 32 };
                    let q = _mm256_loadu_si256(blk.add(qoff + 32 * h) as *const __m256i);
                    let lo = _mm256_and_si256(_mm256_srl_epi16(q, _mm_cvtsi32_si128(2 * j as i32)), three);
                    if ty == GgmlType::Q3_K {
                        let hm = _mm256_loadu_si256(blk as *const __m256i);
                        let hb = _mm256_and_si256(_mm256_srl_epi16(hm, _mm_cvtsi32_si128((4 * h + j) as i32)), one);
                        _mm256_or_si256(lo, _mm256_slli_epi16::<2>(hb))
                    } else {
                        lo
                    }
                }
                GgmlType::Q4_K | GgmlType::Q5_K => {
                    let five = ty == GgmlType::Q5_K;
                    let qoff = if five { 48 } else { 16 };
                    let q = _mm256_loadu_si256(blk.add(qoff + 32 * (k / 2)) as *const __m256i);
                    let nib = _mm256_and_si256(_mm256_srl_epi16(q, _mm_cvtsi32_si128(4 * (k % 2) as i32)), m4);
                    if five {
                        let qh = _mm256_loadu_si256(blk.add(16) as *const __m256i);
                        let hb = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(k as i32)), one);
                        _mm256_or_si256(nib, _mm256_slli_epi16::<4>(hb))
                    } else {
                        nib
                    }
                }
                _ => {
                    let (h, kk) = (k / 4, k % 4);
                    let ql = _mm256_loadu_si256(blk.add(64 * h + 32 * (kk % 2)) as *const __m256i);
                    let nib = _mm256_and_si256(_mm256_srl_epi16(ql, _mm_cvtsi32_si128(4 * (kk / 2) as i32)), m4);
                    let qh = _mm256_loadu_si256(blk.add(128 + 32 * h) as *const __m256i);
                    let hb = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * kk as i32)), three);
                    _mm256_or_si256(nib, _mm256_slli_epi16::<4>(hb))
                }
            };
            let sp = _mm256_set_m128i(_mm_set1_epi16(sc16[2 * k + 1]), _mm_set1_epi16(sc16[2 * k]));
            for j in 0..K {
                let a = _mm256_loadu_si256(aq[j].add(sb * 256 + 32 * k) as *const __m256i);
                ai[j] = _mm256_add_epi32(ai[j], _mm256_madd_epi16(_mm256_maddubs_epi16(u, a), sp));
            }
        }
        let scv = _mm256_loadu_si256(sc16.as_ptr() as *const __m256i);
        let corr = _mm256_mullo_epi16(scv, _mm256_set1_epi16(-off));
        let mnv = _mm256_loadu_si256(mn16.as_ptr() as *const __m256i);
        for j in 0..K {
            let da = *ad[j].add(sb);
            let bsv = _mm256_loadu_si256(abs[j].add(sb * 16) as *const __m256i);
            let v = if off != 0 { _mm256_add_epi32(ai[j], _mm256_madd_epi16(corr, bsv)) } else { ai[j] };
            acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(v), _mm256_set1_ps(d * da), acc[j]);
            if has_min {
                let mi = _mm256_cvtepi32_ps(_mm256_madd_epi16(mnv, bsv));
                accm[j] = _mm256_fmadd_ps(mi, _mm256_set1_ps(-dmin * da), accm[j]);
            }
        }
    }
    for j in 0..K {
        o[j] = hsum(acc[j]) + hsum(accm[j]);
    }
}
