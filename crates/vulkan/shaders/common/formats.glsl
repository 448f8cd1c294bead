// GGUF block formats, read in place (Q8_0 and Q6_K in the device's arrangement of their
// bytes, src/layout.rs). Each format defines
//   BLOCK_VALUES (and BLOCK_BYTES, where blocks lie whole in GGUF order),
//   void load_unit(uint row_off, uint u, out float v[32])
// which writes values 32*u .. 32*u+31 of the row starting at byte `row_off`, and
//   void load8(uint row_off, uint g, out float v[8])
// which writes values 8*g .. 8*g+7 (the subgroup GEMV's piece: neighbouring lanes read
// neighbouring bytes). Both give the same values for the same positions. The arithmetic
// follows ggml's dequantize_row_* operation for operation (`precise` keeps the compiler from
// fusing a multiply and an add that the reference rounds apart).
#ifndef RESIN_FORMATS_GLSL
#define RESIN_FORMATS_GLSL
#include "bytes.glsl"

#if defined(FMT_Q8_0) || defined(FMT_Q6_K)
// These two are held in the device's layout (src/layout.rs: each row 16-byte aligned, its
// scales after its quants), whose offsets need the row length: the includer defines
// ROW_COLS, the values a row.
#ifndef ROW_COLS
#error "FMT_Q8_0 and FMT_Q6_K need ROW_COLS (values a row) defined before formats.glsl"
#endif
// The 8 words at a 16-byte aligned offset: two 16-byte loads where the includer binds the
// weights as WDATA4 too (HAVE_WDATA4), else 8 aligned words.
void rd_u32x8_a16(uint o, out uint w[8]) {
#ifdef HAVE_WDATA4
    uvec4 a = WDATA4[o >> 4], b = WDATA4[(o >> 4) + 1u];
    w = uint[8](a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w);
#else
    for (uint j = 0u; j < 8u; j++) w[j] = WDATA[(o >> 2) + j];
#endif
}
#endif

#if defined(FMT_F32)
#define BLOCK_VALUES 1u
#define BLOCK_BYTES 4u
void load_unit(uint row_off, uint u, out float v[32]) {
    uint base = (row_off >> 2) + u * 32u;
    for (uint l = 0u; l < 32u; l++) v[l] = uintBitsToFloat(WDATA[base + l]);
}
void load8(uint row_off, uint g, out float v[8]) {
    uint base = (row_off >> 2) + g * 8u;
    for (uint l = 0u; l < 8u; l++) v[l] = uintBitsToFloat(WDATA[base + l]);
}
#elif defined(FMT_F16)
#define BLOCK_VALUES 1u
#define BLOCK_BYTES 2u
void load_unit(uint row_off, uint u, out float v[32]) {
    uint o = row_off + u * 64u;
    for (uint l = 0u; l < 32u; l += 2u) {
        vec2 h = unpackHalf2x16(rd_u32(o + l * 2u));
        v[l] = h.x;
        v[l + 1u] = h.y;
    }
}
void load8(uint row_off, uint g, out float v[8]) {
    uint o = row_off + g * 16u;
    for (uint l = 0u; l < 8u; l += 2u) {
        vec2 h = unpackHalf2x16(rd_u32(o + l * 2u));
        v[l] = h.x;
        v[l + 1u] = h.y;
    }
}
#elif defined(FMT_Q4_0)
#define BLOCK_VALUES 32u
#define BLOCK_BYTES 18u
void load_unit(uint row_off, uint u, out float v[32]) {
    uint b = row_off + u * BLOCK_BYTES;
    float d = rd_f16(b);
    for (uint j = 0u; j < 4u; j++) {
        uint w = rd_u32(b + 2u + 4u * j);
        for (uint k = 0u; k < 4u; k++) {
            uint q = byte_of(w, k);
            v[4u * j + k] = float(int(q & 0xFu) - 8) * d;
            v[4u * j + k + 16u] = float(int(q >> 4) - 8) * d;
        }
    }
}
// Piece h = g & 3 of a block: values 8h..8h+7 are the low nibbles (h < 2) or the high
// nibbles (h >= 2) of quant bytes 8(h & 1)..8(h & 1)+7.
void load8(uint row_off, uint g, out float v[8]) {
    uint b = row_off + (g >> 2) * BLOCK_BYTES;
    uint h = g & 3u;
    uint shift = (h >> 1) * 4u;
    float d = rd_f16(b);
    for (uint j = 0u; j < 2u; j++) {
        uint w = rd_u32(b + 2u + 8u * (h & 1u) + 4u * j);
        for (uint k = 0u; k < 4u; k++) {
            uint q = (byte_of(w, k) >> shift) & 0xFu;
            v[4u * j + k] = float(int(q) - 8) * d;
        }
    }
}
#elif defined(FMT_Q4_1)
#define BLOCK_VALUES 32u
#define BLOCK_BYTES 20u
void load_unit(uint row_off, uint u, out float v[32]) {
    uint b = row_off + u * BLOCK_BYTES;
    float d = rd_f16(b);
    float m = rd_f16(b + 2u);
    for (uint j = 0u; j < 4u; j++) {
        uint w = rd_u32(b + 4u + 4u * j);
        for (uint k = 0u; k < 4u; k++) {
            uint q = byte_of(w, k);
            precise float lo = float(q & 0xFu) * d + m;
            precise float hi = float(q >> 4) * d + m;
            v[4u * j + k] = lo;
            v[4u * j + k + 16u] = hi;
        }
    }
}
void load8(uint row_off, uint g, out float v[8]) {
    uint b = row_off + (g >> 2) * BLOCK_BYTES;
    uint h = g & 3u;
    uint shift = (h >> 1) * 4u;
    float d = rd_f16(b);
    float m = rd_f16(b + 2u);
    for (uint j = 0u; j < 2u; j++) {
        uint w = rd_u32(b + 4u + 8u * (h & 1u) + 4u * j);
        for (uint k = 0u; k < 4u; k++) {
            uint q = (byte_of(w, k) >> shift) & 0xFu;
            precise float t = float(q) * d + m;
            v[4u * j + k] = t;
        }
    }
}
#elif defined(FMT_Q5_0)
#define BLOCK_VALUES 32u
#define BLOCK_BYTES 22u
void load_unit(uint row_off, uint u, out float v[32]) {
    uint b = row_off + u * BLOCK_BYTES;
    float d = rd_f16(b);
    uint qh = rd_u32(b + 2u);
    for (uint j = 0u; j < 4u; j++) {
        uint w = rd_u32(b + 6u + 4u * j);
        for (uint k = 0u; k < 4u; k++) {
            uint i = 4u * j + k;
            uint q = byte_of(w, k);
            uint h0 = ((qh >> i) << 4) & 0x10u;
            uint h1 = (qh >> (i + 12u)) & 0x10u;
            v[i] = float(int((q & 0xFu) | h0) - 16) * d;
            v[i + 16u] = float(int((q >> 4) | h1) - 16) * d;
        }
    }
}
void load8(uint row_off, uint g, out float v[8]) {
    uint b = row_off + (g >> 2) * BLOCK_BYTES;
    uint h = g & 3u;
    float d = rd_f16(b);
    uint qh = rd_u32(b + 2u);
    for (uint j = 0u; j < 2u; j++) {
        uint w = rd_u32(b + 6u + 8u * (h & 1u) + 4u * j);
        for (uint k = 0u; k < 4u; k++) {
            uint i = 8u * (h & 1u) + 4u * j + k;
            uint q = byte_of(w, k);
            int t;
            if (h < 2u) {
                uint h0 = ((qh >> i) << 4) & 0x10u;
                t = int((q & 0xFu) | h0) - 16;
            } else {
                uint h1 = (qh >> (i + 12u)) & 0x10u;
                t = int((q >> 4) | h1) - 16;
            }
            v[4u * j + k] = float(t) * d;
        }
    }
}
#elif defined(FMT_Q8_0)
// Q8_0 as the device holds it (src/layout.rs): a row's quants first (32 a block, in block
// order: ROW_COLS bytes), then its blocks' f16 scales, the row padded to 16 bytes. A unit's
// quants are 8 aligned words (two 16-byte loads with HAVE_WDATA4), neighbouring units
// neighbouring bytes.
#define BLOCK_VALUES 32u
// The f16 scale of block u of the row at row_off.
float q8_scale(uint row_off, uint u) { return rd_f16(row_off + ROW_COLS + 2u * u); }
// The 32 quants of block u, 4 a word (value 4j+k in byte k of w[j]).
void q8_quants(uint row_off, uint u, out uint w[8]) { rd_u32x8_a16(row_off + 32u * u, w); }
void load_unit(uint row_off, uint u, out float v[32]) {
    float d = q8_scale(row_off, u);
    uint w[8];
    q8_quants(row_off, u, w);
    for (uint j = 0u; j < 8u; j++)
        for (uint k = 0u; k < 4u; k++) v[4u * j + k] = float(sbyte_of(w[j], k)) * d;
}
void load8(uint row_off, uint g, out float v[8]) {
    float d = q8_scale(row_off, g >> 2);
    uint i = (row_off >> 2) + 2u * g;
    for (uint j = 0u; j < 2u; j++) {
        uint w = WDATA[i + j];
        for (uint k = 0u; k < 4u; k++) v[4u * j + k] = float(sbyte_of(w, k)) * d;
    }
}
#elif defined(FMT_Q4_K) || defined(FMT_Q5_K)
#define BLOCK_VALUES 256u
#if defined(FMT_Q4_K)
#define BLOCK_BYTES 144u
#define QS_OFF 16u
#else
#define BLOCK_BYTES 176u
#define QH_OFF 16u
#define QS_OFF 48u
#endif
// ggml's get_scale_min_k4 over the 12 packed scale bytes at b + 4.
void scale_min_k4(uint b, uint j, out uint sc, out uint m) {
    if (j < 4u) {
        sc = rd_u8(b + 4u + j) & 63u;
        m = rd_u8(b + 8u + j) & 63u;
    } else {
        sc = (rd_u8(b + 8u + j) & 0xFu) | ((rd_u8(b + j) >> 6) << 4);
        m = (rd_u8(b + 8u + j) >> 4) | ((rd_u8(b + 4u + j) >> 6) << 4);
    }
}
void load_unit(uint row_off, uint u, out float v[32]) {
    uint b = row_off + (u >> 3) * BLOCK_BYTES;
    uint s = u & 7u;          // 32-value group of the superblock (= ggml's `is`)
    uint pair = s >> 1;       // 64-value pair: its 32 quant bytes
    uint shift = (s & 1u) * 4u;
    float d = rd_f16(b);
    float dmin = rd_f16(b + 2u);
    uint sc, mn;
    scale_min_k4(b, s, sc, mn);
    float d1 = d * float(sc);
    float m1 = dmin * float(mn);
    uint qw[8];
#if defined(FMT_Q5_K)
    uint hq[8];
#endif
#ifdef HAVE_WDATA4
    // 16 bytes a load: blocks (144, 176 bytes) are 16-byte multiples, the binding 16-aligned.
    uvec4 q0 = WDATA4[(b + QS_OFF + 32u * pair) >> 4], q1 = WDATA4[((b + QS_OFF + 32u * pair) >> 4) + 1u];
    qw = uint[8](q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w);
#if defined(FMT_Q5_K)
    uvec4 h0 = WDATA4[(b + QH_OFF) >> 4], h1 = WDATA4[((b + QH_OFF) >> 4) + 1u];
    hq = uint[8](h0.x, h0.y, h0.z, h0.w, h1.x, h1.y, h1.z, h1.w);
#endif
#else
    for (uint j = 0u; j < 8u; j++) {
        qw[j] = WDATA[(b + QS_OFF + 32u * pair + 4u * j) >> 2];
#if defined(FMT_Q5_K)
        hq[j] = WDATA[(b + QH_OFF + 4u * j) >> 2];
#endif
    }
#endif
    for (uint j = 0u; j < 8u; j++) {
        uint w = qw[j];
#if defined(FMT_Q5_K)
        uint hw = hq[j];
#endif
        for (uint k = 0u; k < 4u; k++) {
            uint q = (byte_of(w, k) >> shift) & 0xFu;
#if defined(FMT_Q5_K)
            q += ((byte_of(hw, k) >> s) & 1u) * 16u;
#endif
            precise float t = d1 * float(q) - m1;
            v[4u * j + k] = t;
        }
    }
}
// Piece h = g & 3 of 32-value group u = g >> 2: load_unit's words 2h and 2h + 1.
void load8(uint row_off, uint g, out float v[8]) {
    uint u = g >> 2;
    uint h = g & 3u;
    uint b = row_off + (u >> 3) * BLOCK_BYTES;
    uint s = u & 7u;
    uint pair = s >> 1;
    uint shift = (s & 1u) * 4u;
    float d = rd_f16(b);
    float dmin = rd_f16(b + 2u);
    uint sc, mn;
    scale_min_k4(b, s, sc, mn);
    float d1 = d * float(sc);
    float m1 = dmin * float(mn);
    for (uint j = 0u; j < 2u; j++) {
        uint w = WDATA[(b + QS_OFF + 32u * pair + 8u * h + 4u * j) >> 2];
#if defined(FMT_Q5_K)
        uint hw = WDATA[(b + QH_OFF + 8u * h + 4u * j) >> 2];
#endif
        for (uint k = 0u; k < 4u; k++) {
            uint q = (byte_of(w, k) >> shift) & 0xFu;
#if defined(FMT_Q5_K)
            q += ((byte_of(hw, k) >> s) & 1u) * 16u;
#endif
            precise float t = d1 * float(q) - m1;
            v[4u * j + k] = t;
        }
    }
}
#elif defined(FMT_Q6_K)
// Q6_K as the device holds it (src/layout.rs): each block's first 208 bytes (ql[128],
// qh[64], scales[16]) in block order, then the blocks' f16 d, the row padded to 16 bytes, so
// a block starts 16-byte aligned and its quants are aligned 16-byte loads.
#define BLOCK_VALUES 256u
#define Q6_BODY 208u
// The block of unit u (32 values) of the row at row_off, and its d.
uint q6_block(uint row_off, uint u) { return row_off + (u >> 3) * Q6_BODY; }
float q6_d(uint row_off, uint u) { return rd_f16(row_off + (ROW_COLS / 256u) * Q6_BODY + 2u * (u >> 3)); }
void load_unit(uint row_off, uint u, out float v[32]) {
    uint b = q6_block(row_off, u);
    uint s = u & 7u;
    uint n = s >> 2;          // 128-value half
    uint g = s & 3u;          // which of q1..q4
    float d = q6_d(row_off, u);
    uint ql = b + 64u * n + (g & 1u) * 32u;
    uint qh = b + 128u + 32u * n;
    uint lshift = (g >> 1) * 4u;
    uint wls[8];
    uint whs[8];
    rd_u32x8_a16(ql, wls);
    rd_u32x8_a16(qh, whs);
    int scs[2] = int[2](bitfieldExtract(int(rd_u8(b + 192u + 8u * n + 2u * g)), 0, 8),
                        bitfieldExtract(int(rd_u8(b + 192u + 8u * n + 1u + 2u * g)), 0, 8));
    for (uint j = 0u; j < 8u; j++) {
        uint wl = wls[j];
        uint wh = whs[j];
        for (uint k = 0u; k < 4u; k++) {
            uint l = 4u * j + k;
            int q = int(((byte_of(wl, k) >> lshift) & 0xFu) | (((byte_of(wh, k) >> (2u * g)) & 3u) << 4)) - 32;
            int sc = scs[l / 16u];
            precise float t = (d * float(sc)) * float(q);
            v[l] = t;
        }
    }
}
// Piece h = g & 3 of 32-value group u = g >> 2: load_unit's l = 8h .. 8h+7 (one scale, l / 16 = h / 2).
void load8(uint row_off, uint g, out float v[8]) {
    uint u = g >> 2;
    uint h = g & 3u;
    uint b = q6_block(row_off, u);
    uint s = u & 7u;
    uint n = s >> 2;
    uint gq = s & 3u;
    float d = q6_d(row_off, u);
    uint ql = b + 64u * n + (gq & 1u) * 32u + 8u * h;
    uint qh = b + 128u + 32u * n + 8u * h;
    uint lshift = (gq >> 1) * 4u;
    int sc = bitfieldExtract(int(rd_u8(b + 192u + 8u * n + (h >> 1) + 2u * gq)), 0, 8);
    for (uint j = 0u; j < 2u; j++) {
        uint wl = WDATA[(ql >> 2) + j];
        uint wh = WDATA[(qh >> 2) + j];
        for (uint k = 0u; k < 4u; k++) {
            int q = int(((byte_of(wl, k) >> lshift) & 0xFu) | (((byte_of(wh, k) >> (2u * gq)) & 3u) << 4)) - 32;
            precise float t = (d * float(sc)) * float(q);
            v[4u * j + k] = t;
        }
    }
}
#else
#error "no format define"
#endif

#endif
