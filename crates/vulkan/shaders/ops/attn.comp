// Decode attention, split over keys: workgroup (head, piece, row) takes its piece of the
// keys 0..keys(row) of the row's region (each piece ceil(keys / n_pieces) keys) and writes a
// partial result: the running max m, the sum l of exp(s - m) and acc = sum exp(s - m) v.
// attn_combine merges the pieces. Scores are q.k * scale over head_dim, keys and values read
// from the layer's mirror buffers (f16 pairs, or KV_F32).
#version 450
#extension GL_GOOGLE_include_directive : require

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 64;

layout(std430, set = 0, binding = 0) readonly buffer Q { float q[]; };
#ifdef KV_F32
layout(std430, set = 0, binding = 1) readonly buffer MK { float mk[]; };
layout(std430, set = 0, binding = 2) readonly buffer MV { float mv[]; };
#else
layout(std430, set = 0, binding = 1) readonly buffer MK { uint mk[]; };
layout(std430, set = 0, binding = 2) readonly buffer MV { uint mv[]; };
#endif
layout(std430, set = 0, binding = 3) readonly buffer Meta { uint meta[]; };
// Partials: [row][head][piece] -> (m, l) and acc[head_dim].
layout(std430, set = 0, binding = 4) writeonly buffer Part { float part[]; };

layout(push_constant) uniform Push {
    uint n_head;
    uint n_head_kv;
    uint head_dim;
    uint n_pieces;
    float scale;
} p;

#include "meta.glsl"

shared float qs[256];
shared float sc[256];

#define MAXD 4u   // dims a thread accumulates: head_dim <= MAXD * WG

float kval(uint e) {
#ifdef KV_F32
    return mk[e];
#else
    return unpackHalf2x16(mk[e >> 1]).x;
#endif
}

void main() {
    uint h = gl_WorkGroupID.x;
    uint piece = gl_WorkGroupID.y;
    uint r = gl_WorkGroupID.z;
    uint t = gl_LocalInvocationID.x;
    uint hd = p.head_dim;
    uint kv_dim = p.n_head_kv * hd;
    uint g = h / (p.n_head / p.n_head_kv);
    uint keys = meta[r * META_WORDS + META_KEYS];
    uint base = meta[r * META_WORDS + META_KV_BASE] + g * hd;
    uint per = (keys + p.n_pieces - 1u) / p.n_pieces;
    uint k0 = min(piece * per, keys);
    uint k1 = min(k0 + per, keys);

    for (uint i = t; i < hd; i += WG) qs[i] = q[(r * p.n_head + h) * hd + i];
    barrier();

    float m = -1.0 / 0.0;
    float l = 0.0;
    float acc[MAXD];
    for (uint d = 0u; d < MAXD; d++) acc[d] = 0.0;

    for (uint c0 = k0; c0 < k1; c0 += WG) {
        uint j = c0 + t;
        float s = -1.0 / 0.0;
        if (j < k1) {
            uint e = base + j * kv_dim;
            float dot = 0.0;
#ifdef KV_F32
            for (uint i = 0u; i < hd; i++) dot += qs[i] * mk[e + i];
#else
            for (uint i = 0u; i < hd; i += 2u) {
                vec2 kk = unpackHalf2x16(mk[(e + i) >> 1]);
                dot += qs[i] * kk.x + qs[i + 1u] * kk.y;
            }
#endif
            s = dot * p.scale;
        }
        sc[t] = s;
        barrier();
        uint cn = min(WG, k1 - c0);
        float cmax = m;
        for (uint i = 0u; i < cn; i++) cmax = max(cmax, sc[i]);
        float rescale = exp(m - cmax);
        barrier();
        if (t < cn) sc[t] = exp(sc[t] - cmax);
        barrier();
        float psum = 0.0;
        for (uint i = 0u; i < cn; i++) psum += sc[i];
        l = l * rescale + psum;
        for (uint d = 0u; d < MAXD; d++) {
            uint dim = t + d * WG;
            if (dim >= hd) break;
            float a = acc[d] * rescale;
            for (uint i = 0u; i < cn; i++) {
                uint e = base + (c0 + i) * kv_dim + dim;
#ifdef KV_F32
                a += sc[i] * mv[e];
#else
                a += sc[i] * unpackHalf2x16(mv[e >> 1] >> ((e & 1u) * 16u)).x;
#endif
            }
            acc[d] = a;
        }
        m = cmax;
        barrier();
    }
    uint slot = (r * p.n_head + h) * p.n_pieces + piece;
    uint ob = slot * (hd + 2u);
    if (t == 0u) {
        part[ob] = m;
        part[ob + 1u] = l;
    }
    for (uint d = 0u; d < MAXD; d++) {
        uint dim = t + d * WG;
        if (dim < hd) part[ob + 2u + dim] = acc[d];
    }
}
