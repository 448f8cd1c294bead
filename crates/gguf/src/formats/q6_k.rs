//! Q6_K: 256 values in 16 sub-blocks of 16; 6-bit signed quants, x = d * sc * (q - 32), with an
//! 8-bit signed scale per sub-block. Per 128 values: `ql[l]` holds values l (low nibble) and
//! l+64 (high), `ql[l+32]` values l+32 and l+96; `qh[l]` the top 2 bits of l, l+32, l+64, l+96.
//!
//! Q8_K (also here): 256 values as i8 quants with an f32 scale and per-16 sums, x = d * q.

use super::kquant::{make_qx_quants, GROUP_MAX_EPS};
use super::{f16_bytes, f16_le, nearest_int, Block};
use crate::GgmlType;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct BlockQ6K {
    /// Low 4 bits of the quants.
    pub ql: [u8; 128],
    /// High 2 bits of the quants.
    pub qh: [u8; 64],
    pub scales: [i8; 16],
    /// Super-block scale (f16).
    pub d: [u8; 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ6K>() == 210);

// SAFETY: repr(C) byte arrays only: alignment 1, no padding, any bits valid; 210 bytes.
unsafe impl Block for BlockQ6K {
    const TY: GgmlType = GgmlType::Q6_K;
    const LEN: usize = 256;

    fn dequantize(&self, y: &mut [f32]) {
        let d = f16_le(self.d);
        for n in 0..2 {
            let (ql, qh) = (&self.ql[64 * n..64 * n + 64], &self.qh[32 * n..32 * n + 32]);
            let sc = &self.scales[8 * n..8 * n + 8];
            let y = &mut y[128 * n..128 * n + 128];
            for l in 0..32 {
                let is = l / 16;
                let q1 = ((ql[l] & 0x0f) | ((qh[l] & 3) << 4)) as i32 - 32;
                let q2 = ((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
                let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
                let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
                y[l] = d * sc[is] as f32 * q1 as f32;
                y[l + 32] = d * sc[is + 2] as f32 * q2 as f32;
                y[l + 64] = d * sc[is + 4] as f32 * q3 as f32;
                y[l + 96] = d * sc[is + 6] as f32 * q4 as f32;
            }
        }
    }

    /// quantize_row_q6_K_ref.
    fn quantize(x: &[f32]) -> Self {
        let mut l = [0i8; 256];
        let mut scales = [0f32; 16];
        let (mut max_scale, mut max_abs_scale) = (0.0f32, 0.0f32);
        for ib in 0..16 {
            let s = make_qx_quants(32, &x[16 * ib..16 * ib + 16], &mut l[16 * ib..16 * ib + 16]);
            scales[ib] = s;
            if s.abs() > max_abs_scale {
                max_abs_scale = s.abs();
                max_scale = s;
            }
        }
        let mut b = BlockQ6K { ql: [0; 128], qh: [0; 64], scales: [0; 16], d: [0; 2] };
        if max_abs_scale < GROUP_MAX_EPS {
            b.d = f16_bytes(0.0);
            return b;
        }
        let iscale = -128.0 / max_scale;
        b.d = f16_bytes(1.0 / iscale);
        for (sc, s) in b.scales.iter_mut().zip(&scales) {
            *sc = nearest_int(iscale * s).min(127) as i8;
        }
        let d_all = f16_le(b.d);
        for j in 0..16 {
            let d = d_all * b.scales[j] as f32;
            if d == 0.0 {
                continue;
            }
            for ii in 0..16 {
                l[16 * j + ii] = (nearest_int(x[16 * j + ii] / d).clamp(-32, 31) + 32) as i8;
            }
        }
        for n in 0..2 {
            let lh = &l[128 * n..128 * n + 128];
            for i in 0..32 {
                let q = |k: usize| lh[i + 32 * k] as u8;
                b.ql[64 * n + i] = (q(0) & 0x0f) | ((q(2) & 0x0f) << 4);
                b.ql[64 * n + i + 32] = (q(1) & 0x0f) | ((q(3) & 0x0f) << 4);
                b.qh[32 * n + i] = (q(0) >> 4) | ((q(1) >> 4) << 2) | ((q(2) >> 4) << 4) | ((q(3) >> 4) << 6);
            }
        }
        b
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct BlockQ8K {
    /// Scale (f32).
    pub d: [u8; 4],
    pub qs: [i8; 256],
    /// Sums of each 16 quants (i16 little-endian).
    pub bsums: [[u8; 2]; 16],
}
const _: () = assert!(std::mem::size_of::<BlockQ8K>() == 292);

// SAFETY: repr(C) byte arrays only: alignment 1, no padding, any bits valid; 292 bytes.
unsafe impl Block for BlockQ8K {
    const TY: GgmlType = GgmlType::Q8_K;
    const LEN: usize = 256;

    fn dequantize(&self, y: &mut [f32]) {
        let d = f32::from_le_bytes(self.d);
        for (v, q) in y.iter_mut().zip(&self.qs) {
            *v = d * *q as f32;
        }
    }

    /// quantize_row_q8_K_ref: the value of largest magnitude maps to -127.
    fn quantize(x: &[f32]) -> Self {
        let mut b = BlockQ8K { d: [0; 4], qs: [0; 256], bsums: [[0; 2]; 16] };
        let (mut max, mut amax) = (0.0f32, 0.0f32);
        for &v in x {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        if amax == 0.0 {
            return b;
        }
        let iscale = -127.0 / max;
        for (q, v) in b.qs.iter_mut().zip(x) {
            *q = nearest_int(iscale * v).min(127) as i8;
        }
        for (s, q16) in b.bsums.iter_mut().zip(b.qs.chunks_exact(16)) {
            *s = (q16.iter().map(|&q| q as i16).sum::<i16>()).to_le_bytes();
        }
        b.d = (1.0 / iscale).to_le_bytes();
        b
    }
}
