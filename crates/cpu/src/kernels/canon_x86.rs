//! The canonical product on AVX2 and AVX-512 VNNI: one body (`tile`), compiled for each level.
//! The levels differ only in a block's integer dot (`vpdpbusd`, or `vpmaddubsw` + `vpmaddwd`),
//! and both give the exact i32 sums, so they give the same bits.
//!
//! A tile is 8 weight rows x 1 or 4 activation rows. Per group of 8 blocks (a K-quant
//! super-block) each weight row is decoded once into signed quants and its per-block factors;
//! each block's dot comes out as 8 i32 lanes of 4 values, a `vphaddd` tree folds 8 blocks into
//! one vector of their 16-value halves (lanes = blocks), and the format's float expression
//! gives the 8 terms f_b with separate multiplies and adds (no FMA). An 8 x 8 transpose then
//! puts one weight row in each lane, so a chunk's terms are added left to right and the
//! chunks by the tree as lane-wise adds: each lane is exactly the scalar reference's order.

// Register tiles are indexed [activation row][weight row] on purpose.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;
use std::mem::MaybeUninit;

use resin_core::canon::{Cut, BLOCK, CHUNKS_MAX};
use resin_gguf::GgmlType;

use super::blocks::{k4_scales, rd32};
use super::canon_mm::{finish, CanonRows, Epilogue, GROUP, TILE};
use super::{QMatrix, Simd};

/// Activation rows a tile: what one decode of the weights serves.
const AR: usize = 8;

/// One group of 8 blocks of a weight row, decoded: each block's signed quants, and its
/// factors (p0: dw, or the super-block's D; p1: Q4_1's mw, or Dmin; i0: the K-quants' scale,
/// Q6_K's first 16-value scale; i1: the K-quants' min, Q6_K's second scale).
#[derive(Clone, Copy)]
struct Dec {
    w: [__m256i; GROUP],
    aw: [__m256i; GROUP],
    p0: __m256,
    p1: __m256,
    i0: __m256i,
    i1: __m256i,
}

/// Format codes of the const generic F.
const Q8_0: u8 = 0;
const Q4_0: u8 = 1;
const Q4_1: u8 = 2;
const Q5_0: u8 = 3;
const Q4_K: u8 = 4;
const Q5_K: u8 = 5;
const Q6_K: u8 = 6;

/// 8 f16 values as f32.
#[inline(always)]
unsafe fn f16x8(h: [u16; GROUP]) -> __m256 {
    _mm256_cvtph_ps(_mm_loadu_si128(h.as_ptr() as *const __m128i))
}

#[inline(always)]
unsafe fn rd16(p: *const u8) -> u16 {
    (p as *const u16).read_unaligned()
}

/// Group `g` (blocks 8g .. 8g + cnt; the rest zero) of weight row `row`; a whole group
/// takes a loop of known length.
#[inline(always)]
unsafe fn decode<const F: u8>(row: *const u8, g: usize, cnt: usize) -> Dec {
    if cnt == GROUP {
        decode_n::<F>(row, g, GROUP)
    } else {
        decode_n::<F>(row, g, cnt)
    }
}

#[inline(always)]
unsafe fn decode_n<const F: u8>(row: *const u8, g: usize, cnt: usize) -> Dec {
    let zero = _mm256_setzero_si256();
    let m4 = _mm256_set1_epi8(0x0F);
    let mut w = [zero; GROUP];
    match F {
        Q8_0 | Q4_0 | Q4_1 | Q5_0 => {
            let bb = [34, 18, 20, 22][F as usize];
            let (mut dh, mut mh) = ([0u16; GROUP], [0u16; GROUP]);
            let m4x = _mm_set1_epi8(0x0F);
            for k in 0..cnt {
                let b = row.add((GROUP * g + k) * bb);
                dh[k] = rd16(b);
                w[k] = match F {
                    Q8_0 => _mm256_loadu_si256(b.add(2) as *const __m256i),
                    _ => {
                        let off = [0, 2, 4, 6][F as usize];
                        let q = _mm_loadu_si128(b.add(off) as *const __m128i);
                        let v = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16::<4>(q), m4x), _mm_and_si128(q, m4x));
                        match F {
                            Q4_0 => _mm256_sub_epi8(v, _mm256_set1_epi8(8)),
                            Q4_1 => {
                                mh[k] = rd16(b.add(2));
                                v
                            }
                            _ => {
                                let hi = _mm256_and_si256(bits32(rd32(std::slice::from_raw_parts(b, 6), 2)), _mm256_set1_epi8(16));
                                _mm256_sub_epi8(_mm256_or_si256(v, hi), _mm256_set1_epi8(16))
                            }
                        }
                    }
                };
            }
            let p1 = if F == Q4_1 { f16x8(mh) } else { _mm256_setzero_ps() };
            Dec { aw: abs8(&w), w, p0: f16x8(dh), p1, i0: zero, i1: zero }
        }
        _ => {
            let bb = [144, 176, 210][(F - Q4_K) as usize];
            let b = row.add(g * bb);
            if F == Q6_K {
                let m3 = _mm256_set1_epi8(3);
                let m32 = _mm256_set1_epi8(32);
                for h in 0..2 {
                    let ql0 = _mm256_loadu_si256(b.add(64 * h) as *const __m256i);
                    let ql1 = _mm256_loadu_si256(b.add(64 * h + 32) as *const __m256i);
                    let qh = _mm256_loadu_si256(b.add(128 + 32 * h) as *const __m256i);
                    let hi = |v: __m256i| _mm256_slli_epi16::<4>(_mm256_and_si256(v, m3));
                    let t = [
                        _mm256_or_si256(_mm256_and_si256(ql0, m4), hi(qh)),
                        _mm256_or_si256(_mm256_and_si256(ql1, m4), hi(_mm256_srli_epi16::<2>(qh))),
                        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(ql0), m4), hi(_mm256_srli_epi16::<4>(qh))),
                        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(ql1), m4), hi(_mm256_srli_epi16::<6>(qh))),
                    ];
                    for (k, v) in t.iter().enumerate() {
                        w[4 * h + k] = _mm256_sub_epi8(*v, m32);
                    }
                }
                let sc = _mm_loadu_si128(b.add(192) as *const __m128i);
                let even = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, -1, -1, -1, -1, -1, -1, -1, -1);
                let odd = _mm_setr_epi8(1, 3, 5, 7, 9, 11, 13, 15, -1, -1, -1, -1, -1, -1, -1, -1);
                let dd = f16x8([rd16(b.add(208)), 0, 0, 0, 0, 0, 0, 0]);
                Dec {
                    aw: abs8(&w),
                    w,
                    p0: _mm256_broadcastss_ps(_mm256_castps256_ps128(dd)),
                    p1: _mm256_setzero_ps(),
                    i0: _mm256_cvtepi8_epi32(_mm_shuffle_epi8(sc, even)),
                    i1: _mm256_cvtepi8_epi32(_mm_shuffle_epi8(sc, odd)),
                }
            } else {
                let qs = if F == Q5_K { 48 } else { 16 };
                let qh = _mm256_loadu_si256(b.add(16) as *const __m256i);
                for j in 0..4 {
                    let v = _mm256_loadu_si256(b.add(qs + 32 * j) as *const __m256i);
                    w[2 * j] = _mm256_and_si256(v, m4);
                    w[2 * j + 1] = _mm256_and_si256(_mm256_srli_epi16::<4>(v), m4);
                }
                if F == Q5_K {
                    for (j, wj) in w.iter_mut().enumerate() {
                        let bit = _mm256_set1_epi8(1 << j);
                        let set = _mm256_cmpeq_epi8(_mm256_and_si256(qh, bit), bit);
                        *wj = _mm256_or_si256(*wj, _mm256_and_si256(set, _mm256_set1_epi8(16)));
                    }
                }
                let (sc, mn) = k4_scales(std::slice::from_raw_parts(b.add(4), 12));
                let dd = _mm256_castps256_ps128(f16x8([rd16(b), rd16(b.add(2)), 0, 0, 0, 0, 0, 0]));
                Dec {
                    aw: abs8(&w),
                    w,
                    p0: _mm256_broadcastss_ps(dd),
                    p1: _mm256_broadcastss_ps(_mm_movehdup_ps(dd)),
                    i0: _mm256_cvtepu8_epi32(_mm_loadl_epi64(sc.as_ptr() as *const __m128i)),
                    i1: _mm256_cvtepu8_epi32(_mm_loadl_epi64(mn.as_ptr() as *const __m128i)),
                }
            }
        }
    }
}

/// |w| of each block's quants.
#[inline(always)]
unsafe fn abs8(w: &[__m256i; GROUP]) -> [__m256i; GROUP] {
    std::array::from_fn(|k| _mm256_abs_epi8(w[k]))
}

/// The 32 bits of `v` as 32 bytes: 0xFF where the bit is set (bit i: byte i).
#[inline(always)]
unsafe fn bits32(v: u32) -> __m256i {
    let shuf = _mm256_set_epi64x(0x0303_0303_0303_0303, 0x0202_0202_0202_0202, 0x0101_0101_0101_0101, 0);
    let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(v as i32), shuf);
    let mask = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    _mm256_cmpeq_epi8(_mm256_and_si256(bytes, mask), mask)
}

/// The 8 block terms f_b (lanes = blocks) of decoded group `dec` against activation row
/// `i`'s group `g`.
#[inline(always)]
unsafe fn terms<const F: u8, const VNNI: bool>(dec: &Dec, x: &CanonRows, i: usize, g: usize) -> __m256 {
    let b0 = i * x.nbp + GROUP * g;
    let a = x.q.as_ptr().add(b0 * BLOCK);
    let zero = _mm256_setzero_si256();
    let ones = _mm256_set1_epi16(1);
    let mut l = [zero; GROUP];
    for k in 0..GROUP {
        let av = _mm256_loadu_si256(a.add(k * BLOCK) as *const __m256i);
        let wk = dec.w[k];
        // |w| x sign(w) a: the activations never hold -128, so the product is exact.
        let (aw, sa) = (dec.aw[k], _mm256_sign_epi8(av, wk));
        l[k] = if VNNI { _mm256_dpbusd_epi32(zero, aw, sa) } else { _mm256_madd_epi16(_mm256_maddubs_epi16(aw, sa), ones) };
    }
    // Lanes 0..4 of a block's dot hold its values 0..16, lanes 4..8 the rest.
    let q0 = _mm256_hadd_epi32(_mm256_hadd_epi32(l[0], l[1]), _mm256_hadd_epi32(l[2], l[3]));
    let q1 = _mm256_hadd_epi32(_mm256_hadd_epi32(l[4], l[5]), _mm256_hadd_epi32(l[6], l[7]));
    let h0 = _mm256_permute2x128_si256::<0x20>(q0, q1);
    let h1 = _mm256_permute2x128_si256::<0x31>(q0, q1);
    let d = _mm256_loadu_ps(x.d.as_ptr().add(b0));
    let sx = _mm256_loadu_si256(x.s.as_ptr().add(b0) as *const __m256i);
    match F {
        Q4_K | Q5_K => {
            let s = _mm256_mullo_epi32(dec.i0, _mm256_add_epi32(h0, h1));
            let mn = _mm256_mullo_epi32(dec.i1, sx);
            _mm256_sub_ps(_mm256_mul_ps(_mm256_mul_ps(d, dec.p0), _mm256_cvtepi32_ps(s)), _mm256_mul_ps(_mm256_mul_ps(d, dec.p1), _mm256_cvtepi32_ps(mn)))
        }
        Q6_K => {
            let s = _mm256_add_epi32(_mm256_mullo_epi32(dec.i0, h0), _mm256_mullo_epi32(dec.i1, h1));
            _mm256_mul_ps(_mm256_mul_ps(d, dec.p0), _mm256_cvtepi32_ps(s))
        }
        _ => {
            let t = _mm256_mul_ps(_mm256_mul_ps(dec.p0, d), _mm256_cvtepi32_ps(_mm256_add_epi32(h0, h1)));
            if F == Q4_1 {
                _mm256_add_ps(t, _mm256_mul_ps(_mm256_mul_ps(dec.p1, d), _mm256_cvtepi32_ps(sx)))
            } else {
                t
            }
        }
    }
}

/// r[k] lane m = v[m] lane k.
#[inline(always)]
unsafe fn transpose8(v: &[__m256; 8]) -> [__m256; 8] {
    let t0 = _mm256_unpacklo_ps(v[0], v[1]);
    let t1 = _mm256_unpackhi_ps(v[0], v[1]);
    let t2 = _mm256_unpacklo_ps(v[2], v[3]);
    let t3 = _mm256_unpackhi_ps(v[2], v[3]);
    let t4 = _mm256_unpacklo_ps(v[4], v[5]);
    let t5 = _mm256_unpackhi_ps(v[4], v[5]);
    let t6 = _mm256_unpacklo_ps(v[6], v[7]);
    let t7 = _mm256_unpackhi_ps(v[6], v[7]);
    let u0 = _mm256_shuffle_ps::<0x44>(t0, t2);
    let u1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
    let u2 = _mm256_shuffle_ps::<0x44>(t1, t3);
    let u3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
    let u4 = _mm256_shuffle_ps::<0x44>(t4, t6);
    let u5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
    let u6 = _mm256_shuffle_ps::<0x44>(t5, t7);
    let u7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
    [
        _mm256_permute2f128_ps::<0x20>(u0, u4),
        _mm256_permute2f128_ps::<0x20>(u1, u5),
        _mm256_permute2f128_ps::<0x20>(u2, u6),
        _mm256_permute2f128_ps::<0x20>(u3, u7),
        _mm256_permute2f128_ps::<0x31>(u0, u4),
        _mm256_permute2f128_ps::<0x31>(u1, u5),
        _mm256_permute2f128_ps::<0x31>(u2, u6),
        _mm256_permute2f128_ps::<0x31>(u3, u7),
    ]
}

/// Weight rows m0 .. m0 + nm (at most 8) against activation rows i0 .. i0 + A.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn tile<const F: u8, const VNNI: bool, const A: usize>(w: &QMatrix, x: &CanonRows, cut: &Cut, m0: usize, nm: usize, i0: usize, out: *mut f32, epi: Epilogue) {
    let rows: [*const u8; TILE] = std::array::from_fn(|m| w.row(m0 + m.min(nm - 1)).as_ptr());
    let nb = cut.blocks;
    let zero = _mm256_setzero_ps();
    // The running chunk of each activation row, and the finished chunks' partials (only the
    // tree's `lanes` are written: the whole array would be cleared for every tile).
    let mut cur = [zero; A];
    let mut parts = [[MaybeUninit::<__m256>::uninit(); CHUNKS_MAX]; A];
    let mut chunk = 0;
    for g in 0..nb.div_ceil(GROUP) {
        let cnt = (nb - GROUP * g).min(GROUP);
        // Chunks are whole groups (at least 8 blocks, a power of two).
        let c = GROUP * g / cut.chunk_blocks;
        if c != chunk {
            for j in 0..A {
                parts[j][chunk].write(cur[j]);
                cur[j] = zero;
            }
            chunk = c;
        }
        let mut f = [[zero; TILE]; A];
        for m in 0..TILE {
            let dec = decode::<F>(rows[m], g, cnt);
            for j in 0..A {
                f[j][m] = terms::<F, VNNI>(&dec, x, i0 + j, g);
            }
        }
        for j in 0..A {
            let t = transpose8(&f[j]);
            for tk in &t[..cnt] {
                cur[j] = _mm256_add_ps(cur[j], *tk);
            }
        }
    }
    for j in 0..A {
        let v = &mut parts[j];
        v[chunk].write(cur[j]);
        for p in &mut v[cut.chunks..cut.lanes] {
            p.write(zero);
        }
        let mut dd = 1;
        while dd < cut.lanes {
            for i in (0..cut.lanes).step_by(2 * dd) {
                // SAFETY: parts 0..lanes were all written above.
                v[i].write(_mm256_add_ps(v[i].assume_init(), v[i + dd].assume_init()));
            }
            dd *= 2;
        }
        let mut y = [0f32; TILE];
        _mm256_storeu_ps(y.as_mut_ptr(), v[0].assume_init());
        let i = i0 + j;
        let r = (!x.r.is_empty()).then(|| x.r[i]);
        for (m, ym) in y.iter().enumerate().take(nm) {
            let o = out.add(i * w.rows + m0 + m);
            *o = finish(*ym, r, *o, epi);
        }
    }
}

macro_rules! level {
    ($name:ident, $vnni:expr, $feat:literal) => {
        #[target_feature(enable = $feat)]
        #[allow(clippy::too_many_arguments)]
        unsafe fn $name<const F: u8>(w: &QMatrix, x: &CanonRows, cut: &Cut, r0: usize, r1: usize, out: *mut f32, epi: Epilogue) {
            let mut m0 = r0;
            while m0 < r1 {
                let nm = (r1 - m0).min(TILE);
                let mut i = 0;
                while i + AR <= x.n {
                    tile::<F, $vnni, AR>(w, x, cut, m0, nm, i, out, epi);
                    i += AR;
                }
                while i < x.n {
                    tile::<F, $vnni, 1>(w, x, cut, m0, nm, i, out, epi);
                    i += 1;
                }
                m0 += TILE;
            }
        }
    };
}

level!(avx2_rows, false, "avx2,fma,f16c,bmi2");
level!(vnni_rows, true, "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c,bmi2");

/// Weight rows r0..r1 of `w` against every activation row of `x`, into `out` (row i of the
/// output at i * w.rows). The caller checked the format, the shapes and the path.
#[allow(clippy::too_many_arguments)]
pub(super) fn rows(simd: Simd, w: &QMatrix, x: &CanonRows, cut: &Cut, r0: usize, r1: usize, out: *mut f32, epi: Epilogue) {
    type Rows = unsafe fn(&QMatrix, &CanonRows, &Cut, usize, usize, *mut f32, Epilogue);
    macro_rules! pick {
        ($f:ident) => {
            match w.ty {
                GgmlType::Q8_0 => $f::<Q8_0> as Rows,
                GgmlType::Q4_0 => $f::<Q4_0>,
                GgmlType::Q4_1 => $f::<Q4_1>,
                GgmlType::Q5_0 => $f::<Q5_0>,
                GgmlType::Q4_K => $f::<Q4_K>,
                GgmlType::Q5_K => $f::<Q5_K>,
                GgmlType::Q6_K => $f::<Q6_K>,
                _ => return,
            }
        };
    }
    let f = if simd == Simd::Avx512Vnni { pick!(vnni_rows) } else { pick!(avx2_rows) };
    // SAFETY: the caller checked that the machine runs `simd`; rows r0..r1 are the task's own.
    unsafe { f(w, x, cut, r0, r1, out, epi) }
}
