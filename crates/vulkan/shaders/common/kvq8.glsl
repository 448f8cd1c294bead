// The q8_0 K/V mirror (KV_Q8): ggml's Q8_0 block, 32 values as an f16 scale d then 32 int8,
// 34 bytes, x = d * q. Element e of a mirror buffer (rows and heads start at multiples of 32
// elements) lies in block e / 32 at byte (e / 32) * 34 + 2 + e % 32. Blocks are 2-byte aligned
// only, so the buffers are read as 32-bit words (no 8/16-bit storage features needed).
//
// The quantization is bit for bit the CPU home's (resin_gguf formats/q8_0.rs, ggml's
// quantize_row_q8_0_ref): amax by its fold, d = amax / 127 and id = 1 / d correctly rounded
// (a Vulkan OpFDiv may be 2.5 ulp off, so the quotients are computed here by integer long
// division), q = round(x * id) half away from zero (GLSL round() leaves halves to the
// implementation), d stored as f16 rounded to nearest even (a conversion's rounding mode is the
// implementation's, so it is done on the bits), and read back exactly (f16 subnormals too).
// Not matched: NaN inputs, and f32-subnormal inputs (below 1.2e-38) where the device flushes
// them in the product x * id (Vulkan allows it); amax, d and id never pass through a float
// operation that could flush.
#ifndef RESIN_KVQ8_GLSL
#define RESIN_KVQ8_GLSL

// x = m * 2^(e - 150) with m in [2^23, 2^24), for finite x > 0.
void q8_unpack(float x, out uint m, out int e) {
    uint b = floatBitsToUint(x);
    e = int(b >> 23);
    m = b & 0x7FFFFFu;
    if (e == 0) {
        int s = 23 - findMSB(m);
        m <<= uint(s);
        e = 1 - s;
    } else {
        m |= 0x800000u;
    }
}

// a / b rounded to nearest even, for finite a >= 0 and finite b > 0 (overflow gives infinity).
float q8_div(float a, float b) {
    if (floatBitsToUint(a) == 0u) return 0.0;
    uint ma, mb;
    int ea, eb;
    q8_unpack(a, ma, ea);
    q8_unpack(b, mb, eb);
    int e = ea - eb;
    if (ma < mb) {
        ma <<= 1u;
        e -= 1;
    }
    // ma / mb in [1, 2): 26 quotient bits by restoring division, q = floor(ma / mb * 2^25).
    uint q = 0u, r = ma;
    for (int i = 0; i < 26; i++) {
        q <<= 1u;
        if (r >= mb) {
            r -= mb;
            q |= 1u;
        }
        r <<= 1u;
    }
    // a / b = (q + rest) * 2^(e - 25), rest in [0, 1) and nonzero iff r != 0.
    int E = e + 127;
    if (E >= 255) return uintBitsToFloat(0x7F800000u);
    uint shift = E >= 1 ? 2u : uint(min(3 - E, 27));
    uint base = E >= 1 ? uint(E - 1) << 23 : 0u;
    uint m = q >> shift;
    uint rem = q & ((1u << shift) - 1u);
    uint hf = 1u << (shift - 1u);
    if (rem > hf || (rem == hf && (r != 0u || (m & 1u) != 0u))) m += 1u;
    // A carry out of the mantissa lands in the exponent (to infinity at the top).
    return uintBitsToFloat(base + m);
}

// f32 -> f16 bits, round to nearest even (as half::f16::from_f32), subnormals and overflow.
uint q8_f16_bits(float f) {
    uint x = floatBitsToUint(f);
    uint s = (x >> 16) & 0x8000u;
    uint a = x & 0x7FFFFFFFu;
    if (a > 0x7F800000u) return s | 0x7E00u | ((a >> 13) & 0x3FFu);
    if (a >= 0x477FF000u) return s | 0x7C00u;   // 65520 and up round to infinity
    if (a >= 0x38800000u) return s | ((a - 0x38000000u + 0xFFFu + ((a >> 13) & 1u)) >> 13);
    if (a <= 0x33000000u) return s;             // at most half the least subnormal
    uint e = a >> 23;
    uint m = (a & 0x7FFFFFu) | 0x800000u;
    uint sh = 126u - e;                         // 14..24
    uint h = m >> sh;
    uint rem = m & ((1u << sh) - 1u);
    uint hf = 1u << (sh - 1u);
    if (rem > hf || (rem == hf && (h & 1u) != 0u)) h += 1u;
    return s | h;
}

// f16 bits -> f32, exact (subnormal halves are normal floats).
float q8_f16_value(uint h) {
    uint s = (h & 0x8000u) << 16;
    uint e = (h >> 10) & 0x1Fu;
    uint m = h & 0x3FFu;
    if (e == 0u) {
        precise float v = float(m) * uintBitsToFloat(0x33800000u);   // m * 2^-24
        return s != 0u ? -v : v;
    }
    if (e == 31u) return uintBitsToFloat(s | 0x7F800000u | (m << 13));
    return uintBitsToFloat(s | ((e + 112u) << 23) | (m << 13));
}

// Rust's (x).round() as i8: half away from zero, saturating, NaN to 0.
int q8_round(float x) {
    if (isnan(x)) return 0;
    x = clamp(x, -128.0, 127.0);
    float t = trunc(x);
    precise float f = abs(x - t);
    return int(t) + (f >= 0.5 ? (x < 0.0 ? -1 : 1) : 0);
}

// The quant of x with inverse scale id.
uint q8_quant(float x, float id) {
    precise float p = x * id;
    return uint(q8_round(p)) & 0xFFu;
}

// Byte offset of element e's quant, and of its block's scale.
uint q8_qbyte(uint e) { return (e >> 5) * 34u + 2u + (e & 31u); }
uint q8_dbyte(uint e) { return (e >> 5) * 34u; }

// Byte b (0..3) of w as a signed value.
int q8_sbyte(uint w, uint b) { return bitfieldExtract(int(w), int(b * 8u), 8); }

// d * q as the CPU's dequantization computes it (q as f32, times d).
float q8_value(float d, int q) {
    precise float v = float(q) * d;
    return v;
}

// Readers of a mirror bound as `uint BUF[]`: NAME(e) = element e, NAME_w32(o) = the 32-bit word
// at 2-byte aligned byte offset o, NAME_d(e) = the scale of element e's block.
#define Q8_READER(NAME, BUF)                                                         \
    uint NAME##_u16(uint o) { return (BUF[o >> 2] >> ((o & 2u) * 8u)) & 0xFFFFu; }   \
    uint NAME##_w32(uint o) {                                                        \
        uint i = o >> 2;                                                             \
        if ((o & 2u) == 0u) return BUF[i];                                           \
        return (BUF[i] >> 16) | (BUF[i + 1u] << 16);                                 \
    }                                                                                \
    float NAME##_d(uint e) { return q8_f16_value(NAME##_u16(q8_dbyte(e))); }         \
    float NAME(uint e) {                                                             \
        uint o = q8_qbyte(e);                                                        \
        int q = bitfieldExtract(int(BUF[o >> 2]), int((o & 3u) * 8u), 8);           \
        return q8_value(NAME##_d(e), q);                                             \
    }

#endif
