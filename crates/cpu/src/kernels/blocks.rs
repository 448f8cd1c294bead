//! Block layout helpers shared by every path (ggml's layouts, ggml-common.h).
//!
//! Byte offsets inside one block:
//! - Q4_0 (18): d f16 @0, qs[16] @2 (low nibbles values 0..16, high nibbles 16..32), value d*(q-8)
//! - Q4_1 (20): d @0, m @2, qs[16] @4, value d*q + m
//! - Q5_0 (22): d @0, qh u32 @2 (bit i = bit 4 of value i), qs[16] @6, value d*(q-16)
//! - Q5_1 (24): d @0, m @2, qh @4, qs[16] @8, value d*q + m
//! - Q8_0 (34): d @0, qs i8[32] @2
//! - Q2_K (84): scales[16] @0 (low 4 bits scale, high 4 bits min), qs[64] @16, d @80, dmin @82
//! - Q3_K (110): hmask[32] @0, qs[64] @32, scales[12] @96 (16 6-bit, -32), d @108
//! - Q4_K (144): d @0, dmin @2, scales[12] @4 (8 6-bit scales, 8 6-bit mins), qs[128] @16
//! - Q5_K (176): d @0, dmin @2, scales[12] @4, qh[32] @16, qs[128] @48
//! - Q6_K (210): ql[128] @0, qh[64] @128, scales i8[16] @192, d @208

#[inline(always)]
pub(crate) fn rd16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

#[inline(always)]
pub(crate) fn rd32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

#[inline(always)]
pub(crate) fn f16(b: &[u8], at: usize) -> f32 {
    half::f16::from_bits(rd16(b, at)).to_f32()
}

#[inline(always)]
pub(crate) fn bf16(b: &[u8], at: usize) -> f32 {
    f32::from_bits((rd16(b, at) as u32) << 16)
}

/// Q4_K / Q5_K: the 8 six-bit scales and 8 six-bit mins packed in 12 bytes.
#[inline(always)]
pub(crate) fn k4_scales(s: &[u8]) -> ([u8; 8], [u8; 8]) {
    const KMASK1: u32 = 0x3f3f_3f3f;
    const KMASK2: u32 = 0x0f0f_0f0f;
    const KMASK3: u32 = 0x0303_0303;
    let u0 = rd32(s, 0);
    let u1 = rd32(s, 4);
    let u2 = rd32(s, 8);
    let m_hi = ((u2 >> 4) & KMASK2) | (((u1 >> 6) & KMASK3) << 4);
    let m_lo = u1 & KMASK1;
    let s_hi = (u2 & KMASK2) | (((u0 >> 6) & KMASK3) << 4);
    let s_lo = u0 & KMASK1;
    let mut sc = [0u8; 8];
    let mut mn = [0u8; 8];
    sc[..4].copy_from_slice(&s_lo.to_le_bytes());
    sc[4..].copy_from_slice(&s_hi.to_le_bytes());
    mn[..4].copy_from_slice(&m_lo.to_le_bytes());
    mn[4..].copy_from_slice(&m_hi.to_le_bytes());
    (sc, mn)
}

/// Q3_K: the 16 six-bit scales packed in 12 bytes, minus 32.
#[inline(always)]
pub(crate) fn q3_scales(s: &[u8]) -> [i8; 16] {
    const KMASK1: u32 = 0x0303_0303;
    const KMASK2: u32 = 0x0f0f_0f0f;
    let a0 = rd32(s, 0);
    let a1 = rd32(s, 4);
    let tmp = rd32(s, 8);
    let w = [
        (a0 & KMASK2) | ((tmp & KMASK1) << 4),
        (a1 & KMASK2) | (((tmp >> 2) & KMASK1) << 4),
        ((a0 >> 4) & KMASK2) | (((tmp >> 4) & KMASK1) << 4),
        ((a1 >> 4) & KMASK2) | (((tmp >> 6) & KMASK1) << 4),
    ];
    let mut out = [0i8; 16];
    for (k, v) in w.iter().enumerate() {
        for (t, b) in v.to_le_bytes().iter().enumerate() {
            out[4 * k + t] = (*b as i8).wrapping_sub(32);
        }
    }
    out
}

/// Byte offset of value `e` (0..32) of block `k` (0..16) inside a group's 512 bytes (acts.rs).
#[inline(always)]
pub(crate) fn g16_offset(k: usize, e: usize) -> usize {
    64 * (4 * (e / 16) + (e % 16) / 4) + 4 * k + e % 4
}
