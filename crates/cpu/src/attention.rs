//! Causal attention of rows over their own regions of the K/V cache.

use rayon::prelude::*;

use crate::kv::{KvCache, Side};
use crate::ops::{axpy, dot};

/// Shapes of one attention call.
pub struct AttnShape {
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    /// Scores are q·k times this.
    pub scale: f32,
    /// A sliding-window layer's keys: the row's last `window` (its own included); None: all.
    pub window: Option<usize>,
}

/// The first key a row at `pos` attends to.
fn first_key(pos: u32, window: Option<usize>) -> usize {
    window.map_or(0, |w| (pos as usize + 1).saturating_sub(w))
}

/// Rows of one region at consecutive positions share one read of their keys and values.
const CHUNK_ROWS: usize = 32;

/// For each row r (region, pos) and head h: softmax(scale q·K[first..=pos]) · V[first..=pos],
/// `first` being 0, or the start of the row's window on a sliding-window layer.
/// `q` is [rows][n_head * head_dim]; `out` the same shape.
///
/// Work is split into (chunk, kv group) tasks, a chunk being up to CHUNK_ROWS consecutive rows
/// of one region whose keys are read (and decoded from the mirror's codec) once. Each head's
/// reduction order is fixed, so a row's result never depends on the batch around it.
pub fn attend(kv: &KvCache, layer: usize, rows: &[(usize, u32)], shape: &AttnShape, q: &[f32], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if kv.codec() == resin_core::KvCodec::F16 && crate::ops::has_avx2_fma_f16c() {
        return f16x86::attend(kv, layer, rows, shape, q, out);
    }
    attend_decoded(kv, layer, rows, shape, q, out);
}

/// Each score to exp(score - max), in key order; returns their sum, added in that order.
fn exp_and_sum(scores: &mut [f32], max: f32) -> f32 {
    let mut sum = 0.0;
    for s in scores.iter_mut() {
        *s = (*s - max).exp();
        sum += *s;
    }
    sum
}

/// Rows of one region at consecutive positions, up to CHUNK_ROWS a chunk.
fn chunks_of(rows: &[(usize, u32)]) -> Vec<std::ops::Range<usize>> {
    let mut chunks = Vec::new();
    let mut i = 0;
    while i < rows.len() {
        let mut j = i + 1;
        while j < rows.len() && j - i < CHUNK_ROWS && rows[j].0 == rows[i].0 && rows[j].1 == rows[j - 1].1 + 1 {
            j += 1;
        }
        chunks.push(i..j);
        i = j;
    }
    chunks
}

/// [`attend`] over keys and values decoded from the mirror's codec into f32 rows first (each
/// chunk's once for its kv group), then `ops::dot` and `ops::axpy`.
fn attend_decoded(kv: &KvCache, layer: usize, rows: &[(usize, u32)], shape: &AttnShape, q: &[f32], out: &mut [f32]) {
    let hd = shape.head_dim;
    let q_dim = shape.n_head * hd;
    let group = shape.n_head / shape.n_head_kv;
    let scale = shape.scale;

    let chunks = chunks_of(rows);
    let tasks: Vec<(usize, usize)> = (0..chunks.len()).flat_map(|c| (0..shape.n_head_kv).map(move |g| (c, g))).collect();
    let results: Vec<Vec<f32>> = tasks
        .par_iter()
        .map_init(
            || (Vec::new(), Vec::new(), Vec::new()),
            |(kbuf, vbuf, scores), &(c, g)| {
                let span = chunks[c].clone();
                let region = rows[span.start].0;
                let n = rows[span.end - 1].1 as usize + 1;
                // The chunk's rows are at consecutive positions: the first row's window starts first.
                let base = first_key(rows[span.start].1, shape.window);
                kbuf.resize((n - base) * hd, 0.0);
                vbuf.resize((n - base) * hd, 0.0);
                kv.read(Side::K, region, layer, base, n, g * hd, hd, kbuf);
                kv.read(Side::V, region, layer, base, n, g * hd, hd, vbuf);
                let mut o = vec![0f32; span.len() * group * hd];
                for (ri, r) in span.enumerate() {
                    let lo = first_key(rows[r].1, shape.window) - base;
                    let keys = rows[r].1 as usize + 1 - base;
                    scores.resize(keys - lo, 0.0);
                    let (kbuf, vbuf) = (&kbuf[lo * hd..], &vbuf[lo * hd..]);
                    for j in 0..group {
                        let h = g * group + j;
                        let qh = &q[r * q_dim + h * hd..r * q_dim + (h + 1) * hd];
                        let mut max = f32::NEG_INFINITY;
                        for (t, s) in scores.iter_mut().enumerate() {
                            *s = dot(qh, &kbuf[t * hd..(t + 1) * hd]) * scale;
                            max = max.max(*s);
                        }
                        let sum = exp_and_sum(scores, max);
                        let oh = &mut o[(ri * group + j) * hd..(ri * group + j + 1) * hd];
                        for (t, &s) in scores.iter().enumerate() {
                            axpy(s, &vbuf[t * hd..(t + 1) * hd], oh);
                        }
                        let inv = 1.0 / sum;
                        oh.iter_mut().for_each(|v| *v *= inv);
                    }
                }
                o
            },
        )
        .collect();
    for (&(c, g), o) in tasks.iter().zip(results) {
        for (ri, r) in chunks[c].clone().enumerate() {
            let dst = r * q_dim + g * group * hd;
            out[dst..dst + group * hd].copy_from_slice(&o[ri * group * hd..(ri + 1) * group * hd]);
        }
    }
}

/// [`attend`] on the f16 mirror with AVX2, FMA and F16C: each head reads its keys and values
/// in place, converting 8 at a time in registers, and keeps its output's dims in registers
/// across the keys. The same operations in the same order as [`attend_decoded`] (`ops::dot`'s
/// two 8-lane accumulators and their reduction, `ops::axpy`'s fused multiply-adds in key order,
/// their unfused tails), so the same bits, with no decoded copy of the keys to write and read
/// back, and a task a (chunk, head) rather than a (chunk, kv group): a decode row's heads
/// spread over the threads. A chunk's rows run GROUP at a time: each key and value they share
/// is loaded and converted once for all of them.
#[cfg(target_arch = "x86_64")]
mod f16x86 {
    use std::arch::x86_64::*;

    use half::f16;
    use rayon::prelude::*;

    use super::{chunks_of, first_key, AttnShape};

    use crate::kv::{KvCache, Side};

    /// Rows of a chunk whose heads run together.
    const GROUP: usize = 4;

    pub fn attend(kv: &KvCache, layer: usize, rows: &[(usize, u32)], shape: &AttnShape, q: &[f32], out: &mut [f32]) {
        let hd = shape.head_dim;
        let q_dim = shape.n_head * hd;
        let group = shape.n_head / shape.n_head_kv;
        let kv_dim = kv.kv_dim();
        let chunks = chunks_of(rows);
        let tasks: Vec<(usize, usize)> = (0..chunks.len()).flat_map(|c| (0..shape.n_head).map(move |h| (c, h))).collect();
        let results: Vec<Vec<f32>> = tasks
            .par_iter()
            .map_init(
                || std::array::from_fn::<Vec<f32>, GROUP, _>(|_| Vec::new()),
                |scores, &(c, h)| {
                    let span = chunks[c].clone();
                    let region = rows[span.start].0;
                    let (Some(k), Some(v)) = (kv.f16_rows(Side::K, region, layer), kv.f16_rows(Side::V, region, layer)) else {
                        unreachable!("attend takes this path for the f16 codec only")
                    };
                    let off = (h / group) * hd;
                    let mut o = vec![0f32; span.len() * hd];
                    let qh = |r: usize| &q[r * q_dim + h * hd..r * q_dim + (h + 1) * hd];
                    let at = |r: usize| Keys { lo: first_key(rows[r].1, shape.window), end: rows[r].1 as usize + 1 };
                    // Rows GROUP at a time (consecutive positions: each row's keys are the one
                    // before's and its own), one read and conversion of each key and value for all.
                    let mut ri = 0;
                    while ri < span.len() {
                        let r = span.start + ri;
                        let n = (span.len() - ri).min(GROUP);
                        let os = &mut o[ri * hd..(ri + n) * hd];
                        // SAFETY: `attend` checked AVX2, FMA and F16C; keys < n_ctx, so every row
                        // read lies in the region's layer.
                        unsafe {
                            let mut it = os.chunks_mut(hd);
                            let mut oh = || it.next().unwrap();
                            let (q4, at4) = (|j: usize| qh(r + j.min(n - 1)), |j: usize| at(r + j.min(n - 1)));
                            // The group's rows as `heads::<R>` takes them (R a constant).
                            macro_rules! group_of {
                                ($r:expr) => {
                                    heads::<{ $r }>(
                                        std::array::from_fn(q4),
                                        k,
                                        v,
                                        kv_dim,
                                        off,
                                        std::array::from_fn(at4),
                                        shape.scale,
                                        (&mut scores[..$r]).try_into().unwrap(),
                                        std::array::from_fn(|_| oh()),
                                    )
                                };
                            }
                            match n {
                                1 => group_of!(1),
                                2 => group_of!(2),
                                3 => group_of!(3),
                                _ => group_of!(GROUP),
                            }
                        }
                        ri += n;
                    }
                    o
                },
            )
            .collect();
        for (&(c, h), o) in tasks.iter().zip(results) {
            for (ri, r) in chunks[c].clone().enumerate() {
                let dst = r * q_dim + h * hd;
                out[dst..dst + hd].copy_from_slice(&o[ri * hd..(ri + 1) * hd]);
            }
        }
    }

    /// 8 f16 values at `p` as f32.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load8(p: *const u16) -> __m256 {
        _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
    }

    /// `ops::dot(q, k)` (its AVX2 path) with k's `q.len()` values in f16 at `k`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn dot(q: &[f32], k: *const u16) -> f32 {
        let n = q.len();
        let n16 = n / 16 * 16;
        let (mut s0, mut s1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        let mut i = 0;
        while i < n16 {
            s0 = _mm256_fmadd_ps(_mm256_loadu_ps(q.as_ptr().add(i)), load8(k.add(i)), s0);
            s1 = _mm256_fmadd_ps(_mm256_loadu_ps(q.as_ptr().add(i + 8)), load8(k.add(i + 8)), s1);
            i += 16;
        }
        let mut r = crate::ops::x86::dot_reduce(s0, s1);
        for (j, &qj) in q.iter().enumerate().skip(n16) {
            r += qj * f16::from_bits(*k.add(j)).to_f32();
        }
        r
    }

    /// The keys a row attends to: `lo..end`.
    #[derive(Clone, Copy)]
    struct Keys {
        lo: usize,
        end: usize,
    }

    /// [`dot`] of R rows `q` with the same key at `k`, its values loaded and converted once:
    /// each row's accumulators, reduction and tail as there, so each result is `dot`'s bits.
    #[inline]
    #[allow(clippy::needless_range_loop)] // rows and dims index several arrays in step
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn dot_rows<const R: usize>(q: [&[f32]; R], k: *const u16) -> [f32; R] {
        let n = q[0].len();
        let n16 = n / 16 * 16;
        let (mut a0, mut a1) = ([_mm256_setzero_ps(); R], [_mm256_setzero_ps(); R]);
        let mut i = 0;
        while i < n16 {
            let (k0, k1) = (load8(k.add(i)), load8(k.add(i + 8)));
            for r in 0..R {
                a0[r] = _mm256_fmadd_ps(_mm256_loadu_ps(q[r].as_ptr().add(i)), k0, a0[r]);
                a1[r] = _mm256_fmadd_ps(_mm256_loadu_ps(q[r].as_ptr().add(i + 8)), k1, a1[r]);
            }
            i += 16;
        }
        let mut out = [0f32; R];
        for r in 0..R {
            out[r] = crate::ops::x86::dot_reduce(a0[r], a1[r]);
        }
        for j in n16..n {
            let kj = f16::from_bits(*k.add(j)).to_f32();
            for r in 0..R {
                out[r] += q[r][j] * kj;
            }
        }
        out
    }

    /// One head of R rows of one region at consecutive positions (so their first keys do not
    /// decrease and row r's keys end r after the first's): keys `lo..end` of the region's rows
    /// `k` and `v` (`kv_dim` apart, the head's dims from `off`), each row's output to `oh[r]`
    /// (head_dim values). The keys every row reads are loaded and converted once for all; each
    /// row's scores, softmax and value sums are [`attend_decoded`](super::attend_decoded)'s
    /// operations in its order (`ops::dot`, then `ops::axpy` key after key), so its bits.
    #[allow(clippy::too_many_arguments, clippy::needless_range_loop)] // rows and dims index several arrays in step
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn heads<const R: usize>(qh: [&[f32]; R], k: &[u16], v: &[u16], kv_dim: usize, off: usize, at: [Keys; R], scale: f32, scores: &mut [Vec<f32>; R], oh: [&mut [f32]; R]) {
        let hd = qh[0].len();
        let (first, last) = (at[0], at[R - 1]);
        assert!(last.end * kv_dim <= k.len() && last.end * kv_dim <= v.len() && off + hd <= kv_dim);
        for r in 0..R {
            assert!(oh[r].len() == hd && at[r].end == first.end + r && (r == 0 || at[r - 1].lo <= at[r].lo) && at[r].lo < at[r].end);
            scores[r].resize(at[r].end - at[r].lo, 0.0);
        }
        // Keys every row reads: from the last row's first to the first row's end.
        let (both_lo, both_end) = (last.lo, first.end);
        let key = |t: usize| k.as_ptr().add(t * kv_dim + off);
        for t in first.lo..last.end {
            if (both_lo..both_end).contains(&t) {
                let s = dot_rows(qh, key(t));
                for r in 0..R {
                    scores[r][t - at[r].lo] = s[r] * scale;
                }
            } else {
                for r in 0..R {
                    if (at[r].lo..at[r].end).contains(&t) {
                        scores[r][t - at[r].lo] = dot(qh[r], key(t)) * scale;
                    }
                }
            }
        }
        let mut sum = [0f32; R];
        for r in 0..R {
            let max = scores[r].iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
            sum[r] = super::exp_and_sum(&mut scores[r], max);
        }
        // Value sums: each dim's fused multiply-adds in key order for each row, W dims of
        // every row a pass in registers; the dims past a multiple of 8 unfused, as `ops::axpy` leaves them.
        let wmax = 8 / R;
        let n8 = hd / 8 * 8;
        let vp = v.as_ptr().add(off);
        let mut d0 = 0;
        while d0 < n8 {
            let w = ((n8 - d0) / 8).min(wmax);
            let mut acc = [[_mm256_setzero_ps(); 8]; R];
            for t in first.lo..last.end {
                let row = vp.add(t * kv_dim + d0);
                if (both_lo..both_end).contains(&t) {
                    let mut a = [_mm256_setzero_ps(); R];
                    for r in 0..R {
                        a[r] = _mm256_set1_ps(scores[r][t - at[r].lo]);
                    }
                    for u in 0..w {
                        let x = load8(row.add(8 * u));
                        for r in 0..R {
                            acc[r][u] = _mm256_fmadd_ps(a[r], x, acc[r][u]);
                        }
                    }
                } else {
                    for r in 0..R {
                        if (at[r].lo..at[r].end).contains(&t) {
                            let a = _mm256_set1_ps(scores[r][t - at[r].lo]);
                            for u in 0..w {
                                acc[r][u] = _mm256_fmadd_ps(a, load8(row.add(8 * u)), acc[r][u]);
                            }
                        }
                    }
                }
            }
            for r in 0..R {
                for u in 0..w {
                    _mm256_storeu_ps(oh[r].as_mut_ptr().add(d0 + 8 * u), acc[r][u]);
                }
            }
            d0 += 8 * w;
        }
        for r in 0..R {
            let lo = at[r].lo;
            for d in n8..hd {
                let mut x = 0.0;
                for (t, &sc) in scores[r].iter().enumerate() {
                    x += sc * f16::from_bits(*vp.add((lo + t) * kv_dim + d)).to_f32();
                }
                oh[r][d] = x;
            }
            let inv = 1.0 / sum[r];
            oh[r].iter_mut().for_each(|x| *x *= inv);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use resin_core::KvCodec;

    fn rng(seed: &mut u64) -> f32 {
        *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    /// The in-place f16 path gives the decoded path's bits, for a decode row, a chunk of
    /// consecutive rows, rows of two regions, a sliding window and head dims off 16 and 8;
    /// a control with one value moved by one f16 step differs.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn f16_in_place_equals_decoded() {
        if !crate::ops::has_avx2_fma_f16c() {
            eprintln!("SKIP: no AVX2/FMA/F16C");
            return;
        }
        let mut seed = 7u64;
        for (hd, n_head, n_head_kv, window) in [(64usize, 9usize, 3usize, None), (72, 4, 2, Some(5usize)), (36, 2, 1, None), (128, 8, 2, None)] {
            let (n_layer, n_ctx, regions) = (2, 300, 2);
            let kv_dim = n_head_kv * hd;
            let mut kv = KvCache::new(KvCodec::F16, regions, n_layer, n_ctx, kv_dim, hd).unwrap();
            for region in 0..regions {
                for pos in 0..n_ctx {
                    let k: Vec<f32> = (0..kv_dim).map(|_| rng(&mut seed) * 3.0).collect();
                    let v: Vec<f32> = (0..kv_dim).map(|_| rng(&mut seed)).collect();
                    kv.store(region, 1, pos, &k, &v);
                }
            }
            let shape = AttnShape { n_head, n_head_kv, head_dim: hd, scale: 1.0 / (hd as f32).sqrt(), window };
            // A decode row, then 40 consecutive rows of region 1 (two chunks), then region 0's.
            let mut rows = vec![(0usize, 299u32)];
            rows.extend((100..140).map(|p| (1usize, p)));
            rows.extend([(0, 0), (0, 1), (0, 2)]);
            let q: Vec<f32> = (0..rows.len() * n_head * hd).map(|_| rng(&mut seed)).collect();
            let (mut a, mut b) = (vec![0f32; q.len()], vec![0f32; q.len()]);
            attend(&kv, 1, &rows, &shape, &q, &mut a);
            attend_decoded(&kv, 1, &rows, &shape, &q, &mut b);
            let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            assert!(bits(&a) == bits(&b), "hd {hd}: the in-place path differs from the decoded one");
            // Control: one value of a key row every row reads, one f16 step up.
            let mut v0 = vec![0f32; kv_dim];
            kv.read(Side::V, 0, 1, 0, 1, 0, kv_dim, &mut v0);
            let k0: Vec<f32> = {
                let mut k = vec![0f32; kv_dim];
                kv.read(Side::K, 0, 1, 0, 1, 0, kv_dim, &mut k);
                k
            };
            v0[1] = half::f16::from_bits(half::f16::from_f32(v0[1]).to_bits() + 1).to_f32();
            kv.store(0, 1, 0, &k0, &v0);
            attend_decoded(&kv, 1, &rows, &shape, &q, &mut b);
            assert!(bits(&a) != bits(&b), "hd {hd}: control: a moved value must move a result");
        }
    }
}

#[cfg(test)]
mod speed {
    use super::*;
    use resin_core::KvCodec;

    /// `cargo test --release -p resin-cpu --lib attention_speed -- --ignored --nocapture`:
    /// 64 rows after 4,096 keys in SmolLM2's shape, the best of 7 runs.
    #[test]
    #[ignore]
    fn attention_speed() {
        let (hd, n_head, n_head_kv, depth, n) = (64usize, 9usize, 3usize, 4096usize, 64usize);
        let kv_dim = n_head_kv * hd;
        let mut kv = KvCache::new(KvCodec::F16, 1, 1, depth + n, kv_dim, hd).unwrap();
        let row: Vec<f32> = (0..kv_dim).map(|i| ((i * 7 % 13) as f32 - 6.0) / 6.0).collect();
        for pos in 0..depth + n {
            kv.store(0, 0, pos, &row, &row);
        }
        let shape = AttnShape { n_head, n_head_kv, head_dim: hd, scale: 0.125, window: None };
        let rows: Vec<(usize, u32)> = (0..n).map(|i| (0usize, (depth + i) as u32)).collect();
        let q: Vec<f32> = (0..n * n_head * hd).map(|i| ((i * 5 % 11) as f32 - 5.0) / 5.0).collect();
        let mut out = vec![0f32; q.len()];
        let best = (0..7)
            .map(|_| {
                let t = std::time::Instant::now();
                attend(&kv, 0, &rows, &shape, &q, &mut out);
                t.elapsed().as_secs_f64()
            })
            .fold(f64::MAX, f64::min);
        eprintln!("attend: {n} rows after {depth} keys, {} heads: {:.2} ms", n_head, best * 1e3);
    }
}
