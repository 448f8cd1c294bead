//! The canonical product on AVX-512 VNNI and AVX2 over the tile layout (`canon_pack`): one
//! body (`tile`), generic over the vector width ([`Isa`]). A lane is one weight row, so a
//! block's integer sums come out of the dots one row a lane, its float term is one vector
//! expression (separate multiplies and adds, no FMA), a chunk's terms are added left to right
//! and the chunks by the tree as lane-wise adds: each lane is exactly the scalar reference's
//! order. The levels differ only in the integer dot (`vpdpbusd`, or `vpmaddubsw` + `vpmaddwd`)
//! and in how Q8_0's signed quants meet it; both give the exact i32 sums, so the same bits.

// Register tiles are indexed [activation row] on purpose.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;
use std::mem::MaybeUninit;

use resin_core::canon::{Cut, BLOCK, CHUNKS_MAX};
use resin_gguf::GgmlType;

use super::canon_mm::{finish, CanonRows, Epilogue};
use super::canon_pack::{CanonMatrix, Layout, RECORD, TILE};
use super::Simd;

/// A vector level: `I` holds one i32 a lane, `F` one f32 a lane, `LANES` weight rows.
trait Isa {
    const LANES: usize;
    /// Activation rows a tile at most (what the registers hold).
    const ROWS: usize;
    /// What Q8_0's dot adds to s for each unit of the block's activation sum.
    const Q8_OFF: i32;
    type I: Copy;
    type F: Copy;
    unsafe fn ld(p: *const u8) -> Self::I;
    unsafe fn splat(v: i32) -> Self::I;
    unsafe fn splat8(v: i8) -> Self::I;
    unsafe fn and(a: Self::I, b: Self::I) -> Self::I;
    unsafe fn or(a: Self::I, b: Self::I) -> Self::I;
    /// Shifts of 16-bit lanes by 1 to 4 (a constant where it is called).
    unsafe fn shl(a: Self::I, n: u32) -> Self::I;
    unsafe fn shr(a: Self::I, n: u32) -> Self::I;
    /// acc + the dot of unsigned bytes `w` and signed bytes `a`, 4 a lane.
    unsafe fn dot(acc: Self::I, w: Self::I, a: Self::I) -> Self::I;
    /// Q8_0's signed quants made ready for `dot8`.
    unsafe fn q8(w: Self::I) -> (Self::I, Self::I);
    unsafe fn dot8(acc: Self::I, w: (Self::I, Self::I), a: Self::I) -> Self::I;
    unsafe fn add_i(a: Self::I, b: Self::I) -> Self::I;
    unsafe fn mul_i(a: Self::I, b: Self::I) -> Self::I;
    unsafe fn u8s(p: *const u8) -> Self::I;
    unsafe fn i8s(p: *const u8) -> Self::I;
    unsafe fn zero() -> Self::F;
    unsafe fn splatf(v: f32) -> Self::F;
    unsafe fn f16s(p: *const u8) -> Self::F;
    unsafe fn cvt(a: Self::I) -> Self::F;
    unsafe fn add(a: Self::F, b: Self::F) -> Self::F;
    unsafe fn sub(a: Self::F, b: Self::F) -> Self::F;
    unsafe fn mul(a: Self::F, b: Self::F) -> Self::F;
    unsafe fn store(p: *mut f32, v: Self::F);
}

struct Avx512;
struct Avx2;

impl Isa for Avx512 {
    const LANES: usize = 16;
    const ROWS: usize = 8;
    const Q8_OFF: i32 = 128;
    type I = __m512i;
    type F = __m512;
    #[inline(always)]
    unsafe fn ld(p: *const u8) -> __m512i {
        _mm512_loadu_si512(p as *const __m512i)
    }
    #[inline(always)]
    unsafe fn splat(v: i32) -> __m512i {
        _mm512_set1_epi32(v)
    }
    #[inline(always)]
    unsafe fn splat8(v: i8) -> __m512i {
        _mm512_set1_epi8(v)
    }
    #[inline(always)]
    unsafe fn and(a: __m512i, b: __m512i) -> __m512i {
        _mm512_and_si512(a, b)
    }
    #[inline(always)]
    unsafe fn or(a: __m512i, b: __m512i) -> __m512i {
        _mm512_or_si512(a, b)
    }
    #[inline(always)]
    unsafe fn shl(a: __m512i, n: u32) -> __m512i {
        match n {
            1 => _mm512_slli_epi16::<1>(a),
            2 => _mm512_slli_epi16::<2>(a),
            3 => _mm512_slli_epi16::<3>(a),
            _ => _mm512_slli_epi16::<4>(a),
        }
    }
    #[inline(always)]
    unsafe fn shr(a: __m512i, n: u32) -> __m512i {
        match n {
            1 => _mm512_srli_epi16::<1>(a),
            2 => _mm512_srli_epi16::<2>(a),
            3 => _mm512_srli_epi16::<3>(a),
            _ => _mm512_srli_epi16::<4>(a),
        }
    }
    #[inline(always)]
    unsafe fn dot(acc: __m512i, w: __m512i, a: __m512i) -> __m512i {
        _mm512_dpbusd_epi32(acc, w, a)
    }
    /// w + 128 as unsigned bytes: the dot then adds 128 x the activation sum.
    #[inline(always)]
    unsafe fn q8(w: __m512i) -> (__m512i, __m512i) {
        (_mm512_xor_si512(w, _mm512_set1_epi8(-128)), w)
    }
    #[inline(always)]
    unsafe fn dot8(acc: __m512i, w: (__m512i, __m512i), a: __m512i) -> __m512i {
        _mm512_dpbusd_epi32(acc, w.0, a)
    }
    #[inline(always)]
    unsafe fn add_i(a: __m512i, b: __m512i) -> __m512i {
        _mm512_add_epi32(a, b)
    }
    #[inline(always)]
    unsafe fn mul_i(a: __m512i, b: __m512i) -> __m512i {
        _mm512_mullo_epi32(a, b)
    }
    #[inline(always)]
    unsafe fn u8s(p: *const u8) -> __m512i {
        _mm512_cvtepu8_epi32(_mm_loadu_si128(p as *const __m128i))
    }
    #[inline(always)]
    unsafe fn i8s(p: *const u8) -> __m512i {
        _mm512_cvtepi8_epi32(_mm_loadu_si128(p as *const __m128i))
    }
    #[inline(always)]
    unsafe fn zero() -> __m512 {
        _mm512_setzero_ps()
    }
    #[inline(always)]
    unsafe fn splatf(v: f32) -> __m512 {
        _mm512_set1_ps(v)
    }
    #[inline(always)]
    unsafe fn f16s(p: *const u8) -> __m512 {
        _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i))
    }
    #[inline(always)]
    unsafe fn cvt(a: __m512i) -> __m512 {
        _mm512_cvtepi32_ps(a)
    }
    #[inline(always)]
    unsafe fn add(a: __m512, b: __m512) -> __m512 {
        _mm512_add_ps(a, b)
    }
    #[inline(always)]
    unsafe fn sub(a: __m512, b: __m512) -> __m512 {
        _mm512_sub_ps(a, b)
    }
    #[inline(always)]
    unsafe fn mul(a: __m512, b: __m512) -> __m512 {
        _mm512_mul_ps(a, b)
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: __m512) {
        _mm512_storeu_ps(p, v)
    }
}

impl Isa for Avx2 {
    const LANES: usize = 8;
    const ROWS: usize = 4;
    const Q8_OFF: i32 = 0;
    type I = __m256i;
    type F = __m256;
    #[inline(always)]
    unsafe fn ld(p: *const u8) -> __m256i {
        _mm256_loadu_si256(p as *const __m256i)
    }
    #[inline(always)]
    unsafe fn splat(v: i32) -> __m256i {
        _mm256_set1_epi32(v)
    }
    #[inline(always)]
    unsafe fn splat8(v: i8) -> __m256i {
        _mm256_set1_epi8(v)
    }
    #[inline(always)]
    unsafe fn and(a: __m256i, b: __m256i) -> __m256i {
        _mm256_and_si256(a, b)
    }
    #[inline(always)]
    unsafe fn or(a: __m256i, b: __m256i) -> __m256i {
        _mm256_or_si256(a, b)
    }
    #[inline(always)]
    unsafe fn shl(a: __m256i, n: u32) -> __m256i {
        match n {
            1 => _mm256_slli_epi16::<1>(a),
            2 => _mm256_slli_epi16::<2>(a),
            3 => _mm256_slli_epi16::<3>(a),
            _ => _mm256_slli_epi16::<4>(a),
        }
    }
    #[inline(always)]
    unsafe fn shr(a: __m256i, n: u32) -> __m256i {
        match n {
            1 => _mm256_srli_epi16::<1>(a),
            2 => _mm256_srli_epi16::<2>(a),
            3 => _mm256_srli_epi16::<3>(a),
            _ => _mm256_srli_epi16::<4>(a),
        }
    }
    /// The pair sums of unsigned weights below 64 and activations of magnitude 127 or less
    /// stay inside i16, so the dot is exact.
    #[inline(always)]
    unsafe fn dot(acc: __m256i, w: __m256i, a: __m256i) -> __m256i {
        _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(w, a), _mm256_set1_epi16(1)))
    }
    /// |w| against a with w's sign: the activations never hold -128, so exact.
    #[inline(always)]
    unsafe fn q8(w: __m256i) -> (__m256i, __m256i) {
        (_mm256_abs_epi8(w), w)
    }
    #[inline(always)]
    unsafe fn dot8(acc: __m256i, w: (__m256i, __m256i), a: __m256i) -> __m256i {
        _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(w.0, _mm256_sign_epi8(a, w.1)), _mm256_set1_epi16(1)))
    }
    #[inline(always)]
    unsafe fn add_i(a: __m256i, b: __m256i) -> __m256i {
        _mm256_add_epi32(a, b)
    }
    #[inline(always)]
    unsafe fn mul_i(a: __m256i, b: __m256i) -> __m256i {
        _mm256_mullo_epi32(a, b)
    }
    #[inline(always)]
    unsafe fn u8s(p: *const u8) -> __m256i {
        _mm256_cvtepu8_epi32(_mm_loadl_epi64(p as *const __m128i))
    }
    #[inline(always)]
    unsafe fn i8s(p: *const u8) -> __m256i {
        _mm256_cvtepi8_epi32(_mm_loadl_epi64(p as *const __m128i))
    }
    #[inline(always)]
    unsafe fn zero() -> __m256 {
        _mm256_setzero_ps()
    }
    #[inline(always)]
    unsafe fn splatf(v: f32) -> __m256 {
        _mm256_set1_ps(v)
    }
    #[inline(always)]
    unsafe fn f16s(p: *const u8) -> __m256 {
        _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
    }
    #[inline(always)]
    unsafe fn cvt(a: __m256i) -> __m256 {
        _mm256_cvtepi32_ps(a)
    }
    #[inline(always)]
    unsafe fn add(a: __m256, b: __m256) -> __m256 {
        _mm256_add_ps(a, b)
    }
    #[inline(always)]
    unsafe fn sub(a: __m256, b: __m256) -> __m256 {
        _mm256_sub_ps(a, b)
    }
    #[inline(always)]
    unsafe fn mul(a: __m256, b: __m256) -> __m256 {
        _mm256_mul_ps(a, b)
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: __m256) {
        _mm256_storeu_ps(p, v)
    }
}

/// Format codes of the const generic F.
const Q8_0: u8 = 0;
const Q4_0: u8 = 1;
const Q4_1: u8 = 2;
const Q5_0: u8 = 3;
const Q4_K: u8 = 4;
const Q5_K: u8 = 5;
const Q6_K: u8 = 6;

const fn ty_of(f: u8) -> GgmlType {
    match f {
        Q8_0 => GgmlType::Q8_0,
        Q4_0 => GgmlType::Q4_0,
        Q4_1 => GgmlType::Q4_1,
        Q5_0 => GgmlType::Q5_0,
        Q4_K => GgmlType::Q4_K,
        Q5_K => GgmlType::Q5_K,
        _ => GgmlType::Q6_K,
    }
}

/// Bits 4.. of group `g`'s quants from a one-bit plane (bit `g` of each byte) at bit 4.
#[inline(always)]
unsafe fn plane1<V: Isa>(p: V::I, g: usize) -> V::I {
    let v = match g {
        0 => V::shl(p, 4),
        1 => V::shl(p, 3),
        2 => V::shl(p, 2),
        3 => V::shl(p, 1),
        4 => p,
        5 => V::shr(p, 1),
        6 => V::shr(p, 2),
        _ => V::shr(p, 3),
    };
    V::and(v, V::splat8(0x10))
}

/// Bits 4..6 of group `4h + k`'s quants from plane `h` (bits 2k..2k + 2 of each byte).
#[inline(always)]
unsafe fn plane2<V: Isa>(p: V::I, k: usize) -> V::I {
    let v = match k {
        0 => V::shl(p, 4),
        1 => V::shl(p, 2),
        2 => p,
        _ => V::shr(p, 2),
    };
    V::and(v, V::splat8(0x30))
}

/// Block `b`'s 8 groups of unsigned quants (Q8_0: its signed bytes) for lanes from `lane0`;
/// `at` is the block's first byte.
#[inline(always)]
unsafe fn unpack<V: Isa, const F: u8>(l: &Layout, at: *const u8, lane0: usize) -> [V::I; 8] {
    let planes = at.add(l.scales + 4 * lane0);
    let q = planes.add(l.planes * RECORD);
    let mut w = [V::splat(0); 8];
    if F == Q8_0 {
        for (g, wg) in w.iter_mut().enumerate() {
            *wg = V::ld(q.add(g * RECORD));
        }
        return w;
    }
    let m4 = V::splat8(0x0F);
    for j in 0..4 {
        let v = V::ld(q.add(j * RECORD));
        w[j] = V::and(v, m4);
        w[j + 4] = V::and(V::shr(v, 4), m4);
    }
    match l.planes {
        1 => {
            let p = V::ld(planes);
            for g in 0..8 {
                w[g] = V::or(w[g], plane1::<V>(p, g));
            }
        }
        2 => {
            for h in 0..2 {
                let p = V::ld(planes.add(h * RECORD));
                for k in 0..4 {
                    w[4 * h + k] = V::or(w[4 * h + k], plane2::<V>(p, k));
                }
            }
        }
        _ => {}
    }
    w
}

/// Lanes `lane0..` of tile `t` against activation rows `i0..i0 + R`, every block.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn tile<V: Isa, const F: u8, const R: usize>(w: &CanonMatrix, x: &CanonRows, cut: &Cut, t: usize, lane0: usize, i0: usize, out: *mut f32, epi: Epilogue) {
    let l = match Layout::of(ty_of(F)) {
        Some(l) => l,
        None => return,
    };
    let tb = w.tile(t).as_ptr();
    let zero = V::zero();
    let mut cur = [zero; R];
    // The finished chunks' partials (only the tree's `lanes` are written).
    let mut parts = [[MaybeUninit::<V::F>::uninit(); CHUNKS_MAX]; R];
    let (mut dd, mut dmin) = (zero, zero);
    let nb = x.blocks();
    let acts: [*const i8; R] = std::array::from_fn(|i| x.q.as_ptr().add((i0 + i) * nb * BLOCK));
    let meta: [usize; R] = std::array::from_fn(|i| (i0 + i) * nb);
    for b in 0..cut.blocks {
        if b > 0 && b % cut.chunk_blocks == 0 {
            let c = b / cut.chunk_blocks - 1;
            for i in 0..R {
                parts[i][c].write(cur[i]);
                cur[i] = zero;
            }
        }
        let at = tb.add(l.block_at(b));
        if l.unit_blocks > 1 && b % l.unit_blocks == 0 {
            let head = tb.add(l.head_at(b) + 2 * lane0);
            dd = V::f16s(head);
            if F != Q6_K {
                dmin = V::f16s(head.add(32));
            }
        }
        let wq = unpack::<V, F>(&l, at, lane0);
        let mut w8 = [(wq[0], wq[0]); 8];
        if F == Q8_0 {
            for g in 0..8 {
                w8[g] = V::q8(wq[g]);
            }
        }
        for i in 0..R {
            let xb = meta[i] + b;
            let a = acts[i].add(b * BLOCK) as *const i32;
            let (d, sx) = (*x.d.get_unchecked(xb), *x.s.get_unchecked(xb));
            let bc = |g: usize| V::splat(a.add(g).read_unaligned());
            let f = match F {
                Q6_K => {
                    let h = *x.h.get_unchecked(xb);
                    let (mut s0, mut s1) = (V::splat(-l.off * h), V::splat(-l.off * (sx - h)));
                    for g in 0..4 {
                        s0 = V::dot(s0, wq[g], bc(g));
                        s1 = V::dot(s1, wq[g + 4], bc(g + 4));
                    }
                    let (sc0, sc1) = (V::i8s(at.add(lane0)), V::i8s(at.add(TILE + lane0)));
                    V::mul(V::mul(V::splatf(d), dd), V::cvt(V::add_i(V::mul_i(sc0, s0), V::mul_i(sc1, s1))))
                }
                Q4_K | Q5_K => {
                    let mut s = V::splat(0);
                    for g in 0..8 {
                        s = V::dot(s, wq[g], bc(g));
                    }
                    let (sc, mn) = (V::u8s(at.add(lane0)), V::u8s(at.add(TILE + lane0)));
                    let vd = V::splatf(d);
                    V::sub(V::mul(V::mul(vd, dd), V::cvt(V::mul_i(sc, s))), V::mul(V::mul(vd, dmin), V::cvt(V::mul_i(mn, V::splat(sx)))))
                }
                _ => {
                    let mut s = V::splat(-if F == Q8_0 { V::Q8_OFF } else { l.off } * sx);
                    for g in 0..8 {
                        s = if F == Q8_0 { V::dot8(s, w8[g], bc(g)) } else { V::dot(s, wq[g], bc(g)) };
                    }
                    let vd = V::splatf(d);
                    let t = V::mul(V::mul(V::f16s(at.add(2 * lane0)), vd), V::cvt(s));
                    if F == Q4_1 {
                        V::add(t, V::mul(V::mul(V::f16s(at.add(32 + 2 * lane0)), vd), V::splatf(sx as f32)))
                    } else {
                        t
                    }
                }
            };
            cur[i] = V::add(cur[i], f);
        }
    }
    let last = (cut.blocks - 1) / cut.chunk_blocks;
    let m0 = t * TILE + lane0;
    let nm = V::LANES.min(w.rows - m0);
    for i in 0..R {
        let v = &mut parts[i];
        v[last].write(cur[i]);
        for p in &mut v[cut.chunks..cut.lanes] {
            p.write(zero);
        }
        let mut dd = 1;
        while dd < cut.lanes {
            for k in (0..cut.lanes).step_by(2 * dd) {
                // SAFETY: parts 0..lanes were all written above.
                v[k].write(V::add(v[k].assume_init(), v[k + dd].assume_init()));
            }
            dd *= 2;
        }
        let mut y = [0f32; 16];
        V::store(y.as_mut_ptr(), v[0].assume_init());
        let row = i0 + i;
        let r = (!x.r.is_empty()).then(|| x.r[row]);
        for (m, ym) in y.iter().enumerate().take(nm) {
            let o = out.add(row * w.rows + m0 + m);
            *o = finish(*ym, r, *o, epi);
        }
    }
}

/// Tiles t0..t1 against every activation row, `V::ROWS` activation rows a pass.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn tiles_of<V: Isa, const F: u8>(w: &CanonMatrix, x: &CanonRows, cut: &Cut, t0: usize, t1: usize, out: *mut f32, epi: Epilogue) {
    for t in t0..t1 {
        let mut lane0 = 0;
        while lane0 < TILE && t * TILE + lane0 < w.rows {
            let mut i = 0;
            if V::ROWS >= 8 {
                while i + 8 <= x.n {
                    tile::<V, F, 8>(w, x, cut, t, lane0, i, out, epi);
                    i += 8;
                }
            }
            while i + 4 <= x.n {
                tile::<V, F, 4>(w, x, cut, t, lane0, i, out, epi);
                i += 4;
            }
            if i + 2 <= x.n {
                tile::<V, F, 2>(w, x, cut, t, lane0, i, out, epi);
                i += 2;
            }
            if i < x.n {
                tile::<V, F, 1>(w, x, cut, t, lane0, i, out, epi);
            }
            lane0 += V::LANES;
        }
    }
}

type Tiles = unsafe fn(&CanonMatrix, &CanonRows, &Cut, usize, usize, *mut f32, Epilogue);

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c,bmi2")]
unsafe fn avx512_tiles<const F: u8>(w: &CanonMatrix, x: &CanonRows, cut: &Cut, t0: usize, t1: usize, out: *mut f32, epi: Epilogue) {
    tiles_of::<Avx512, F>(w, x, cut, t0, t1, out, epi)
}

#[target_feature(enable = "avx2,fma,f16c,bmi2")]
unsafe fn avx2_tiles<const F: u8>(w: &CanonMatrix, x: &CanonRows, cut: &Cut, t0: usize, t1: usize, out: *mut f32, epi: Epilogue) {
    tiles_of::<Avx2, F>(w, x, cut, t0, t1, out, epi)
}

/// Tiles t0..t1 of `w` against every activation row of `x`, into `out` (row i of the output
/// at i * w.rows). The caller checked the shapes and the path.
#[allow(clippy::too_many_arguments)]
pub(super) fn tiles(simd: Simd, w: &CanonMatrix, x: &CanonRows, cut: &Cut, t0: usize, t1: usize, out: *mut f32, epi: Epilogue) {
    macro_rules! pick {
        ($f:ident) => {
            match w.ty {
                GgmlType::Q8_0 => $f::<Q8_0> as Tiles,
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
    let f = if simd == Simd::Avx512Vnni { pick!(avx512_tiles) } else { pick!(avx2_tiles) };
    // SAFETY: the caller checked that the machine runs `simd`; tiles t0..t1 are the task's own.
    unsafe { f(w, x, cut, t0, t1, out, epi) }
}
