// Merge the key pieces of decode attention: out = sum_p acc_p e^(m_p - M) / sum_p l_p e^(m_p - M)
// over the row's pieces (as many as attn.comp cut its keys into; each holds a key).
// Workgroup (head, row).
#version 450
#extension GL_GOOGLE_include_directive : require

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 64;

layout(std430, set = 0, binding = 0) readonly buffer Part { float part[]; };
layout(std430, set = 0, binding = 1) readonly buffer Meta { uint meta[]; };
layout(std430, set = 0, binding = 2) writeonly buffer Out { float outv[]; };

layout(push_constant) uniform Push {
    uint n_head;
    uint head_dim;
} p;

#include "meta.glsl"

shared float wp[ATTN_SLOTS];   // e^(m_p - M) of each piece

void main() {
    uint h = gl_WorkGroupID.x;
    uint r = gl_WorkGroupID.y;
    uint t = gl_LocalInvocationID.x;
    uint hd = p.head_dim;
    uint keys = meta[r * META_WORDS + META_KEYS];
    uint npc = (keys + attn_piece_keys(keys) - 1u) / attn_piece_keys(keys);
    uint first = (r * p.n_head + h) * ATTN_SLOTS;
    float mx = -1.0 / 0.0;
    for (uint i = 0u; i < npc; i++) mx = max(mx, part[(first + i) * (hd + 2u)]);
    for (uint i = t; i < npc; i += WG) wp[i] = exp(part[(first + i) * (hd + 2u)] - mx);
    barrier();
    float l = 0.0;
    for (uint i = 0u; i < npc; i++) l += part[(first + i) * (hd + 2u) + 1u] * wp[i];
    for (uint d = t; d < hd; d += WG) {
        float a = 0.0;
        for (uint i = 0u; i < npc; i++) a += part[(first + i) * (hd + 2u) + 2u + d] * wp[i];
        outv[(r * p.n_head + h) * hd + d] = a / l;
    }
}
