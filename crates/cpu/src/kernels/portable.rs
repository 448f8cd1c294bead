//! The portable path: scalar code for every format, the fallback and the oracle of the SIMD
//! paths. It reads the same prepared activations and does the same integer dot products.

use super::acts::{Family, Prepared};
use super::blocks::{bf16, f16, g16_offset, k4_scales, q3_scales, rd32};
use resin_gguf::GgmlType;

pub(super) fn tile<const K: usize>(ty: GgmlType, w: &[u8], x: &[f32], cols: usize, p: &Prepared, i0: usize, o: &mut [f32; K]) {
    match Family::of(ty) {
        Family::Float => float_tile(ty, w, x, cols, i0, o),
        Family::Pair32 => pair_tile(ty, w, cols, p, i0, o),
        Family::Super256 => k_tile(ty, w, cols, p, i0, o),
    }
}

/// One float weight.
#[inline(always)]
pub(crate) fn float_at(ty: GgmlType, w: &[u8], c: usize) -> f32 {
    match ty {
        GgmlType::F32 => f32::from_le_bytes([w[4 * c], w[4 * c + 1], w[4 * c + 2], w[4 * c + 3]]),
        GgmlType::F16 => f16(w, 2 * c),
        GgmlType::BF16 => bf16(w, 2 * c),
        _ => unreachable!(),
    }
}

fn float_tile<const K: usize>(ty: GgmlType, w: &[u8], x: &[f32], cols: usize, i0: usize, o: &mut [f32; K]) {
    for (j, oj) in o.iter_mut().enumerate() {
        let xr = &x[(i0 + j) * cols..(i0 + j + 1) * cols];
        let mut lanes = [0f32; 8];
        for (c, xv) in xr.iter().enumerate() {
            lanes[c % 8] += float_at(ty, w, c) * xv;
        }
        *oj = lanes.iter().sum();
    }
}

/// One 32-block: (d, m, values). For Q4_0, Q5_0, Q8_0 the values are signed and m = 0;
/// for Q4_1, Q5_1 they are unsigned and the real value is d*q + m.
#[inline(always)]
pub(crate) fn decode32(ty: GgmlType, b: &[u8]) -> (f32, f32, [i8; 32]) {
    let mut q = [0i8; 32];
    match ty {
        GgmlType::Q4_0 | GgmlType::Q4_1 => {
            let (off, bias, m) = if ty == GgmlType::Q4_0 { (2, 8, 0.0) } else { (4, 0, f16(b, 2)) };
            for l in 0..16 {
                q[l] = (b[off + l] & 0xF) as i8 - bias;
                q[l + 16] = (b[off + l] >> 4) as i8 - bias;
            }
            (f16(b, 0), m, q)
        }
        GgmlType::Q5_0 | GgmlType::Q5_1 => {
            let (hoff, off, bias, m) = if ty == GgmlType::Q5_0 { (2, 6, 16, 0.0) } else { (4, 8, 0, f16(b, 2)) };
            let qh = rd32(b, hoff);
            for l in 0..16 {
                let h0 = ((qh >> l) & 1) as u8;
                let h1 = ((qh >> (l + 16)) & 1) as u8;
                q[l] = ((b[off + l] & 0xF) | (h0 << 4)) as i8 - bias;
                q[l + 16] = ((b[off + l] >> 4) | (h1 << 4)) as i8 - bias;
            }
            (f16(b, 0), m, q)
        }
        GgmlType::Q8_0 => {
            for l in 0..32 {
                q[l] = b[2 + l] as i8;
            }
            (f16(b, 0), 0.0, q)
        }
        _ => unreachable!(),
    }
}

fn pair_tile<const K: usize>(ty: GgmlType, w: &[u8], cols: usize, p: &Prepared, i0: usize, o: &mut [f32; K]) {
    let bb = ty.block_bytes();
    let has_m = matches!(ty, GgmlType::Q4_1 | GgmlType::Q5_1);
    let mut acc = [0f32; K];
    for b in 0..cols / 32 {
        let (d, m, q) = decode32(ty, &w[b * bb..(b + 1) * bb]);
        for (j, a) in acc.iter_mut().enumerate() {
            let row = i0 + j;
            let (g, k) = (b / 16, b % 16);
            let grp = &p.qs[row * p.qs_stride + 512 * g..][..512];
            let mut isum = 0i32;
            for (e, qv) in q.iter().enumerate() {
                isum += *qv as i32 * grp[g16_offset(k, e)] as i32;
            }
            let di = row * p.d_stride + 16 * g + k;
            *a += d * p.d[di] * isum as f32;
            if has_m {
                *a += m * p.s[di];
            }
        }
    }
    *o = acc;
}

/// One K-quant superblock: values (signed real quant values, or unsigned ones for formats
/// with mins), scale per 16 values, min per 16 values, d, dmin.
/// The real value i is `d * sc[i/16] * q[i] - dmin * mn[i/16]`.
pub(crate) fn decode_k(ty: GgmlType, b: &[u8]) -> ([i8; 256], [i32; 16], [i32; 16], f32, f32) {
    let mut q = [0i8; 256];
    let mut sc = [0i32; 16];
    let mut mn = [0i32; 16];
    match ty {
        GgmlType::Q2_K => {
            for i in 0..16 {
                sc[i] = (b[i] & 0xF) as i32;
                mn[i] = (b[i] >> 4) as i32;
            }
            for h in 0..2 {
                for j in 0..4 {
                    for l in 0..32 {
                        q[128 * h + 32 * j + l] = ((b[16 + 32 * h + l] >> (2 * j)) & 3) as i8;
                    }
                }
            }
            (q, sc, mn, f16(b, 80), f16(b, 82))
        }
        GgmlType::Q3_K => {
            let s = q3_scales(&b[96..108]);
            for i in 0..16 {
                sc[i] = s[i] as i32;
            }
            for h in 0..2 {
                for j in 0..4 {
                    for l in 0..32 {
                        let lo = (b[32 + 32 * h + l] >> (2 * j)) & 3;
                        let hi = (b[l] >> (4 * h + j)) & 1;
                        q[128 * h + 32 * j + l] = (lo | (hi << 2)) as i8 - 4;
                    }
                }
            }
            (q, sc, mn, f16(b, 108), 0.0)
        }
        GgmlType::Q4_K | GgmlType::Q5_K => {
            let (s, m) = k4_scales(&b[4..16]);
            for i in 0..16 {
                sc[i] = s[i / 2] as i32;
                mn[i] = m[i / 2] as i32;
            }
            let five = ty == GgmlType::Q5_K;
            let qs = if five { 48 } else { 16 };
            for j in 0..4 {
                for l in 0..32 {
                    let v = b[qs + 32 * j + l];
                    let (h0, h1) = if five { ((b[16 + l] >> (2 * j)) & 1, (b[16 + l] >> (2 * j + 1)) & 1) } else { (0, 0) };
                    q[64 * j + l] = ((v & 0xF) | (h0 << 4)) as i8;
                    q[64 * j + 32 + l] = ((v >> 4) | (h1 << 4)) as i8;
                }
            }
            (q, sc, mn, f16(b, 0), f16(b, 2))
        }
        GgmlType::Q6_K => {
            for i in 0..16 {
                sc[i] = b[192 + i] as i8 as i32;
            }
            for h in 0..2 {
                let ql = &b[64 * h..64 * h + 64];
                let qh = &b[128 + 32 * h..128 + 32 * h + 32];
                for l in 0..32 {
                    let base = 128 * h;
                    q[base + l] = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i8 - 32;
                    q[base + l + 32] = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i8 - 32;
                    q[base + l + 64] = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i8 - 32;
                    q[base + l + 96] = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i8 - 32;
                }
            }
            (q, sc, mn, f16(b, 208), 0.0)
        }
        _ => unreachable!(),
    }
}

fn k_tile<const K: usize>(ty: GgmlType, w: &[u8], cols: usize, p: &Prepared, i0: usize, o: &mut [f32; K]) {
    let bb = ty.block_bytes();
    let has_min = matches!(ty, GgmlType::Q2_K | GgmlType::Q4_K | GgmlType::Q5_K);
    let mut acc = [0f32; K];
    for sb in 0..cols / 256 {
        let (q, sc, mn, d, dmin) = decode_k(ty, &w[sb * bb..(sb + 1) * bb]);
        for (j, a) in acc.iter_mut().enumerate() {
            let row = i0 + j;
            let aq = &p.qs[row * p.qs_stride + sb * 256..][..256];
            let bi = row * p.d_stride + sb;
            let bs = &p.bsums[bi * 16..bi * 16 + 16];
            let mut isum = 0i32;
            let mut msum = 0i32;
            for i in 0..16 {
                let mut s = 0i32;
                for l in 0..16 {
                    s += q[16 * i + l] as i32 * aq[16 * i + l] as i32;
                }
                isum += sc[i] * s;
                msum += mn[i] * bs[i] as i32;
            }
            let da = p.d[bi];
            *a += da * d * isum as f32;
            if has_min {
                *a -= da * dmin * msum as f32;
            }
        }
    }
    *o = acc;
}
