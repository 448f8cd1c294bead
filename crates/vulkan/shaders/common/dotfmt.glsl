// The canonical matrix product's side of the block formats (mv.comp; docs/canonical-order.md
// section 2). Each format defines
//   void dot_load(uint row_off, uint u, out uint qw[8], out vec2 wf, out ivec2 wi)
// the weight quants of 32-value block u as int8, 4 a word (value 4j+k in byte k of qw[j]),
// with the block's float (wf) and integer (wi) parameters, and
//   float dot_finish(ivec2 s, vec2 wf, ivec2 wi, float dx, int xs)
// f_b, the block's contribution, from the exact integer dot products of the weight quants
// with the activation quants (s.x over values 0..15, s.y over 16..31; only Q6_K, whose halves
// have scales of their own (DOT_HALVES), needs them apart) and the activation block's d and
// sum of quants: the format's float expression of the spec's table, each product rounded
// apart (`precise`). dot_term takes the integer part itself (dot4); mm.comp's tensor-core
// tier takes it from an int8 tile product. Quants stored unsigned (0..15, 0..31)
// are valid signed int8 too; Q4_0 / Q5_0 take their offset (8, 16) off with the activation
// sum: sum (q - o) a = dot(q, a) - o * sum a. Q6_K's quants are made signed in the bytes.
#ifndef RESIN_DOTFMT_GLSL
#define RESIN_DOTFMT_GLSL

#ifdef DOT_HW
// OpSDot (4450) with PackedVectorFormat4x8Bit (0): capabilities DotProductInput4x8BitPacked
// (6018) and DotProduct (6019).
spirv_instruction(extensions = ["SPV_KHR_integer_dot_product"], capabilities = [6018, 6019], id = 4450)
int sdot4x8(uint a, uint b, spirv_literal int fmt);
int dot4(uint a, uint b) { return sdot4x8(a, b, 0); }
#else
int dot4(uint a, uint b) {
    int ia = int(a), ib = int(b);
    return bitfieldExtract(ia, 0, 8) * bitfieldExtract(ib, 0, 8) + bitfieldExtract(ia, 8, 8) * bitfieldExtract(ib, 8, 8)
        + bitfieldExtract(ia, 16, 8) * bitfieldExtract(ib, 16, 8) + bitfieldExtract(ia, 24, 8) * bitfieldExtract(ib, 24, 8);
}
#endif

// One activation block: its quant words, d and the sum of its quants.
struct XUnit {
    uint q[8];
    float d;
    int s;
};
// The block's activation quant words lo .. lo + n dotted with qw[lo .. lo + n).
int dot_words(uint qw[8], XUnit x, uint lo, uint n) {
    int s = 0;
    for (uint j = lo; j < lo + n; j++) s += dot4(qw[j], x.q[j]);
    return s;
}

// Bits 0..3 of h as bit 4 of each of four bytes.
uint spread4(uint h) {
    return (((h & 1u) | ((h & 2u) << 7) | ((h & 4u) << 14) | ((h & 8u) << 21)) << 4);
}

#if defined(FMT_Q8_0) || defined(FMT_Q4_0) || defined(FMT_Q4_1) || defined(FMT_Q5_0)
void dot_load(uint row_off, uint u, out uint qw[8], out vec2 wf, out ivec2 wi) {
    wi = ivec2(0);
#if defined(FMT_Q8_0)
    // The device's Q8_0 rows (formats.glsl): the unit's quants in two aligned 16-byte loads,
    // its scale from the row's scales.
    wf = vec2(q8_scale(row_off, u), 0.0);
    q8_quants(row_off, u, qw);
#else
    uint b = row_off + u * BLOCK_BYTES;
    wf = vec2(rd_f16(b), 0.0);
#endif
#if defined(FMT_Q4_0)
    for (uint j = 0u; j < 4u; j++) {
        uint w = rd_u32(b + 2u + 4u * j);
        qw[j] = w & 0x0F0F0F0Fu;
        qw[j + 4u] = (w >> 4) & 0x0F0F0F0Fu;
    }
#elif defined(FMT_Q4_1)
    wf.y = rd_f16(b + 2u);
    for (uint j = 0u; j < 4u; j++) {
        uint w = rd_u32(b + 4u + 4u * j);
        qw[j] = w & 0x0F0F0F0Fu;
        qw[j + 4u] = (w >> 4) & 0x0F0F0F0Fu;
    }
#elif defined(FMT_Q5_0)
    // Q5_0: value i's fifth bit is bit i of qh.
    uint qh = rd_u32(b + 2u);
    for (uint j = 0u; j < 4u; j++) {
        uint w = rd_u32(b + 6u + 4u * j);
        qw[j] = (w & 0x0F0F0F0Fu) | spread4(qh >> (4u * j));
        qw[j + 4u] = ((w >> 4) & 0x0F0F0F0Fu) | spread4(qh >> (16u + 4u * j));
    }
#endif
}
float dot_finish(ivec2 s2, vec2 wf, ivec2 wi, float dx, int xs) {
    int isum = s2.x + s2.y;
#if defined(FMT_Q4_0)
    isum -= 8 * xs;
#elif defined(FMT_Q5_0)
    isum -= 16 * xs;
#endif
    precise float dd = wf.x * dx;
    precise float t = dd * float(isum);
#if defined(FMT_Q4_1)
    precise float md = wf.y * dx;
    precise float tm = md * float(xs);
    t = t + tm;
#endif
    return t;
}
#elif defined(FMT_Q4_K) || defined(FMT_Q5_K)
// wf = (d, dmin), wi = (sc, mn) of the unit's 32 values (ggml's get_scale_min_k4).
void dot_load(uint row_off, uint u, out uint qw[8], out vec2 wf, out ivec2 wi) {
    uint b = row_off + (u >> 3) * BLOCK_BYTES;
    uint s = u & 7u;
    uint pair = s >> 1;
    uint shift = (s & 1u) * 4u;
    // The block's 16-byte head (d, dmin, the 12 scale bytes) in one aligned load, and
    // ggml's get_scale_min_k4 on its words without a branch.
    uvec4 hd = WDATA4[b >> 4];
    wf = unpackHalf2x16(hd.x);
    uint sh = (s & 3u) * 8u;
    uint a = (hd.y >> sh) & 0xFFu, m8 = (hd.z >> sh) & 0xFFu, c8 = (hd.w >> sh) & 0xFFu;
    bool lo4 = s < 4u;
    uint sc = lo4 ? a & 63u : (c8 & 0xFu) | ((a >> 6) << 4);
    uint mn = lo4 ? m8 & 63u : (c8 >> 4) | ((m8 >> 6) << 4);
    wi = ivec2(int(sc), int(mn));
    // The unit's 32 quant bytes (and Q5_K's 32 high-bit bytes) are 16-byte aligned (blocks of
    // 144 / 176 bytes, rows of whole blocks): two 16-byte loads each.
    uint q4 = (b + QS_OFF + 32u * pair) >> 4;
    uvec4 lo = WDATA4[q4], hi = WDATA4[q4 + 1u];
    uint qs[8] = uint[8](lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w);
#if defined(FMT_Q5_K)
    uvec4 h0 = WDATA4[(b + QH_OFF) >> 4], h1 = WDATA4[((b + QH_OFF) >> 4) + 1u];
    uint qh[8] = uint[8](h0.x, h0.y, h0.z, h0.w, h1.x, h1.y, h1.z, h1.w);
#endif
    for (uint j = 0u; j < 8u; j++) {
        uint w = (qs[j] >> shift) & 0x0F0F0F0Fu;
#if defined(FMT_Q5_K)
        w |= ((qh[j] >> s) & 0x01010101u) << 4;
#endif
        qw[j] = w;
    }
}
float dot_finish(ivec2 s2, vec2 wf, ivec2 wi, float dx, int xs) {
    int isum = wi.x * (s2.x + s2.y);
    int msum = wi.y * xs;
    precise float a = dx * wf.x;
    precise float b = dx * wf.y;
    precise float ta = a * float(isum);
    precise float tb = b * float(msum);
    precise float t = ta - tb;
    return t;
}
#elif defined(FMT_Q6_K)
// Signed quants (-32..31); wi = the two signed scales of the block's 16-value halves.
void dot_load(uint row_off, uint u, out uint qw[8], out vec2 wf, out ivec2 wi) {
    // The device's Q6_K rows (formats.glsl): quants in aligned 16-byte loads, d after them.
    uint b = q6_block(row_off, u);
    uint s = u & 7u;
    uint n = s >> 2;
    uint g = s & 3u;
    wf = vec2(q6_d(row_off, u), 0.0);
    uint sb = b + 192u + 8u * n + 2u * g;
    wi = ivec2(bitfieldExtract(int(rd_u8(sb)), 0, 8), bitfieldExtract(int(rd_u8(sb + 1u)), 0, 8));
    uint ql = b + 64u * n + (g & 1u) * 32u;
    uint qh = b + 128u + 32u * n;
    uint lshift = (g >> 1) * 4u;
    uint wl[8], wh[8];
    rd_u32x8_a16(ql, wl);
    rd_u32x8_a16(qh, wh);
    for (uint j = 0u; j < 8u; j++) {
        uint lo = (wl[j] >> lshift) & 0x0F0F0F0Fu;
        uint hi = ((wh[j] >> (2u * g)) & 0x03030303u) << 4;
        // Each byte v in 0..63 becomes v - 32 as int8, with no borrow between bytes.
        qw[j] = (((lo | hi) | 0x80808080u) - 0x20202020u) ^ 0x80808080u;
    }
}
#define DOT_HALVES
float dot_finish(ivec2 s2, vec2 wf, ivec2 wi, float dx, int xs) {
    int isum = wi.x * s2.x + wi.y * s2.y;
    precise float a = dx * wf.x;
    precise float t = a * float(isum);
    return t;
}
#else
#error "the canonical product has no expression for this format"
#endif

float dot_term(uint qw[8], vec2 wf, ivec2 wi, XUnit x) {
    return dot_finish(ivec2(dot_words(qw, x, 0u, 4u), dot_words(qw, x, 4u, 4u)), wf, wi, x.d, x.s);
}

#endif
