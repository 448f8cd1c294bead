// Rope-and-store, fused: for each row and head, add the bias (flags & 1), RMS-norm the head
// (flags & 2, qwen3), rotate the first rope_dims dims (ROPE_NORM: adjacent pairs, GGUF llama
// layout; ROPE_NEOX: halves) with the cos/sin table row of the row's position, and
//   q heads: write back in place;
//   k heads: write into the mirror K row at the row's region base + pos * kv_dim (f16 clamped
//            to the half range unless KV_F32; KV_Q8: q8_0 blocks over the head, see below), and
//            copy the v head (plus bias) into the V row.
// Dims past rope_dims pass through. Workgroup (head, row): heads 0..n_head are q heads, the
// next n_head_kv are k/v heads. One body serves the one-row and N-row forms (rows = the
// dispatch's y size).
#version 450
#extension GL_GOOGLE_include_directive : require

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 64;

layout(std430, set = 0, binding = 0) buffer Q { float q[]; };
layout(std430, set = 0, binding = 1) readonly buffer K { float k[]; };
layout(std430, set = 0, binding = 2) readonly buffer V { float v[]; };
// Biases packed [q_dim | kv_dim | kv_dim]; q-norm then k-norm weights [head_dim | head_dim].
layout(std430, set = 0, binding = 3) readonly buffer Bias { float bias[]; };
layout(std430, set = 0, binding = 4) readonly buffer Norm { float qkn[]; };
// (cos, sin) pairs: [n_ctx][rope_dims / 2][2].
layout(std430, set = 0, binding = 5) readonly buffer Rope { float cs[]; };
layout(std430, set = 0, binding = 6) readonly buffer Meta { uint meta[]; };
#ifdef KV_F32
layout(std430, set = 0, binding = 7) writeonly buffer MK { float mk[]; };
layout(std430, set = 0, binding = 8) writeonly buffer MV { float mv[]; };
#elif defined(KV_Q8)
// Read-write: the words a head's blocks share with a neighbour's are merged by atomics.
layout(std430, set = 0, binding = 7) buffer MK { uint mk[]; };
layout(std430, set = 0, binding = 8) buffer MV { uint mv[]; };
#else
layout(std430, set = 0, binding = 7) writeonly buffer MK { uint mk[]; };
layout(std430, set = 0, binding = 8) writeonly buffer MV { uint mv[]; };
#endif

layout(push_constant) uniform Push {
    uint n_head;
    uint n_head_kv;
    uint head_dim;
    uint rope_dims;
    uint flags;
    float eps;
} p;

#include "meta.glsl"
#include "rope.glsl"
#ifdef ROPE_NEOX
const bool NEOX = true;
#else
const bool NEOX = false;
#endif
#ifdef KV_Q8
#include "kvq8.glsl"
#endif

shared float hin[512];
shared float hout[512];
shared float red[256];
#define QK_H hin
#define QK_W qkn
#define QK_RED red
#include "qk_norm.glsl"
#ifdef KV_Q8
shared uint qd[32];     // f16 bits of each block's scale: K blocks, then V blocks at 16
shared float qid[32];   // each block's inverse scale 1 / d (0 when d is 0)

// Halfword hw (0 .. 17 * head_dim / 32) of the head's q8_0 blocks from the values x (shared)
// and the scales of side `sd` (0 K, 16 V): halfword 0 of a block is d, then pairs of quants.
#define Q8_HALF(x, sd, hw, out_)                                                      \
    {                                                                                 \
        uint blk = (hw) / 17u, m = (hw) - blk * 17u;                                  \
        if (m == 0u) {                                                                \
            out_ = qd[(sd) + blk];                                                    \
        } else {                                                                      \
            uint e = 32u * blk + 2u * (m - 1u);                                       \
            float id = qid[(sd) + blk];                                               \
            out_ = q8_quant(x[e], id) | (q8_quant(x[e + 1u], id) << 8);              \
        }                                                                             \
    }

// Write the head's blocks (values x, scales of side sd) at byte b0 of `buf`. A block is 34
// bytes, so a head starts or ends in the middle of a 32-bit word when its first block index is
// odd (head_dim / 32 odd) and shares that word with another head or row, written by another
// workgroup (or earlier). Each whole word of the head is written by one thread with a plain
// store; the (at most two) shared words are merged by atomicAnd (clear our half) then atomicOr
// (set it), which commute with the other writer's on the other half.
#define Q8_STORE(buf, x, sd, b0, nhw)                                                 \
    for (uint w = ((b0) >> 2) + t; w < ((b0) + 2u * (nhw) + 3u) >> 2; w += WG) {      \
        int h0 = int(2u * w) - int((b0) >> 1);                                        \
        bool lo_in = h0 >= 0 && h0 < int(nhw);                                        \
        bool hi_in = h0 + 1 >= 0 && h0 + 1 < int(nhw);                               \
        uint lo = 0u, hi = 0u;                                                        \
        if (lo_in) Q8_HALF(x, sd, uint(h0), lo)                                       \
        if (hi_in) Q8_HALF(x, sd, uint(h0 + 1), hi)                                   \
        if (lo_in && hi_in) {                                                         \
            buf[w] = lo | (hi << 16);                                                 \
        } else {                                                                      \
            uint mine = lo_in ? 0x0000FFFFu : 0xFFFF0000u;                            \
            atomicAnd(buf[w], ~mine);                                                 \
            atomicOr(buf[w], lo | (hi << 16));                                        \
        }                                                                             \
    }
#endif

void main() {
    uint h = gl_WorkGroupID.x;
    uint r = gl_WorkGroupID.y;
    uint t = gl_LocalInvocationID.x;
    uint hd = p.head_dim;
    uint q_dim = p.n_head * hd;
    uint kv_dim = p.n_head_kv * hd;
    bool is_q = h < p.n_head;
    uint kh = h - p.n_head;
    uint src = is_q ? r * q_dim + h * hd : r * kv_dim + kh * hd;
    uint boff = is_q ? h * hd : q_dim + kh * hd;
    uint pos = meta[r * META_WORDS + META_POS];

    for (uint i = t; i < hd; i += WG) {
        float a = is_q ? q[src + i] : k[src + i];
        if ((p.flags & 1u) != 0u) a = with_bias(a, bias[boff + i]);
        hin[i] = a;
    }
    barrier();
    if ((p.flags & 2u) != 0u) qk_norm_head(t, hd, 0u, is_q ? 0u : hd, p.eps);
    uint half_r = p.rope_dims / 2u;
    uint crow = pos * half_r;
    for (uint i = t; i < hd; i += WG) {
        if (i < half_r) {
            uint i0, i1;
            rope_pair(i, half_r, NEOX, i0, i1);
            float c = cs[2u * (crow + i)];
            float s = cs[2u * (crow + i) + 1u];
            float o0, o1;
            rope_rotate(hin[i0], hin[i1], c, s, o0, o1);
            hout[i0] = o0;
            hout[i1] = o1;
        } else if (i >= p.rope_dims) {
            hout[i] = hin[i];
        }
    }
    barrier();
    if (is_q) {
        for (uint i = t; i < hd; i += WG) q[src + i] = hout[i];
        return;
    }
    uint dst = meta[r * META_WORDS + META_KV_BASE] + pos * kv_dim + kh * hd;
    uint vb = q_dim + kv_dim + kh * hd;
#ifdef KV_F32
    for (uint i = t; i < hd; i += WG) {
        mk[dst + i] = hout[i];
        float a = v[src + i];
        if ((p.flags & 1u) != 0u) a = with_bias(a, bias[vb + i]);
        mv[dst + i] = a;
    }
#elif defined(KV_Q8)
    // The v head (plus bias) into hin (free since the rotation's barrier).
    for (uint i = t; i < hd; i += WG) {
        float a = v[src + i];
        if ((p.flags & 1u) != 0u) a = with_bias(a, bias[vb + i]);
        hin[i] = a;
    }
    barrier();
    // One thread a block: amax by the CPU's fold, d = amax / 127, id = 1 / d.
    uint nb = hd / 32u;
    for (uint j = t; j < 2u * nb; j += WG) {
        bool is_v = j >= nb;
        uint blk = is_v ? j - nb : j;
        // |x| compared as bits (the order of non-NaN floats), so no subnormal is flushed.
        uint amax = 0u;
        for (uint i = 0u; i < 32u; i++) {
            uint a = floatBitsToUint(is_v ? hin[32u * blk + i] : hout[32u * blk + i]) & 0x7FFFFFFFu;
            amax = amax > a ? amax : a;
        }
        float d = q8_div(uintBitsToFloat(amax), 127.0);
        uint sd = is_v ? 16u : 0u;
        qd[sd + blk] = q8_f16_bits(d);
        qid[sd + blk] = floatBitsToUint(d) != 0u ? q8_div(1.0, d) : 0.0;
    }
    barrier();
    uint b0 = q8_dbyte(dst);
    Q8_STORE(mk, hout, 0u, b0, 17u * nb)
    Q8_STORE(mv, hin, 16u, b0, 17u * nb)
#else
    // Two halves a word, so each word is written by one thread.
    for (uint j = t; j < hd / 2u; j += WG) {
        uint i = 2u * j;
        mk[(dst + i) >> 1] = packHalf2x16(vec2(clamp_half(hout[i]), clamp_half(hout[i + 1u])));
        float a0 = v[src + i], a1 = v[src + i + 1u];
        if ((p.flags & 1u) != 0u) {
            a0 = with_bias(a0, bias[vb + i]);
            a1 = with_bias(a1, bias[vb + i + 1u]);
        }
        mv[(dst + i) >> 1] = packHalf2x16(vec2(clamp_half(a0), clamp_half(a1)));
    }
#endif
}
