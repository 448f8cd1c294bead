// Prefill-window attention, flash style: workgroup (head h, tile of BR consecutive query rows)
// walks the keys in tiles of BC, each K and V tile loaded into shared memory once and used by
// every row of the tile; online softmax per row (running max m, sum l, f32 accumulators), the
// causal mask by each row's key count (meta keys: row r attends to keys 0..keys(r) of its
// region). Rows of one tile may lie in different regions (a segment boundary inside the tile):
// the tile takes its distinct kv_base values one after another ("groups"), each group walking
// the keys of its region up to its rows' largest key count, the other rows masked. Output as
// attn + attn_combine write it: out[(r * n_head + h) * head_dim + d].
// Specialization: 0 = workgroup size (128 or 256), 1 = BR, 2 = BC, 3 = HD (= head_dim, even).
#version 450
#extension GL_GOOGLE_include_directive : require

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 128;
layout(constant_id = 1) const uint BR = 16;
layout(constant_id = 2) const uint BC = 32;
layout(constant_id = 3) const uint HD = 64;

layout(std430, set = 0, binding = 0) readonly buffer Q { float q[]; };
#ifdef KV_F32
layout(std430, set = 0, binding = 1) readonly buffer MK { float mk[]; };
layout(std430, set = 0, binding = 2) readonly buffer MV { float mv[]; };
#elif defined(KV_Q8)
// q8_0 blocks (common/kvq8.glsl), read back as d * q in f32.
layout(std430, set = 0, binding = 1) readonly buffer MK { uint mk[]; };
layout(std430, set = 0, binding = 2) readonly buffer MV { uint mv[]; };
#else
layout(std430, set = 0, binding = 1) readonly buffer MK { uint mk[]; };
layout(std430, set = 0, binding = 2) readonly buffer MV { uint mv[]; };
#endif
layout(std430, set = 0, binding = 3) readonly buffer Meta { uint meta[]; };
layout(std430, set = 0, binding = 4) writeonly buffer Out { float outv[]; };

layout(push_constant) uniform Push {
    uint n_head;
    uint n_head_kv;
    uint head_dim;   // == HD
    uint rows;       // rows of the window
    float scale;
} p;

#include "meta.glsl"
#ifdef KV_Q8
#include "kvq8.glsl"
Q8_READER(q8_mk, mk)
Q8_READER(q8_mv, mv)
#endif

const uint QS = HD + 1u;   // padded row stride of the q and k/v tiles (no bank conflicts)
shared float qs[BR * QS];
shared float kv[BC * QS];   // the K tile, then the V tile
shared float sp[BR * BC];   // scores, then weights exp(s - m)
shared float ms[BR];
shared float ls[BR];
shared float al[BR];        // this key tile's rescale of each row's accumulators
shared uint rbase[BR];
shared uint rkeys[BR];
shared uint rstate[BR];     // 0 pending, 1 in the current group, 2 done (or no row)
shared uint gany;
shared uint gbase;
shared uint gkeys;

#define MAXACC 16u   // accumulators a thread: BR * HD <= MAXACC * WG (the host checks). With 32
                     // lavapipe computed wrong values (or skipped the output) past ~1000 keys.

// Load key tile rows c0..c0+BC (zeros past kmax) of `buf` into kv.
#ifdef KV_F32
#define LOAD_TILE(buf)                                                  \
    for (uint i = t; i < BC * HD; i += WG) {                            \
        uint c = i / HD, d = i - c * HD;                                \
        uint j = c0 + c;                                                \
        kv[c * QS + d] = j < kmax ? buf[base + j * kv_dim + d] : 0.0;   \
    }
#elif defined(KV_Q8)
#define LOAD_TILE(buf)                                                  \
    for (uint i = t; i < BC * HD; i += WG) {                            \
        uint c = i / HD, d = i - c * HD;                                \
        uint j = c0 + c;                                                \
        kv[c * QS + d] = j < kmax ? q8_##buf(base + j * kv_dim + d) : 0.0; \
    }
#else
#define LOAD_TILE(buf)                                                  \
    for (uint i = t; i < BC * (HD / 2u); i += WG) {                     \
        uint c = i / (HD / 2u), w = i - c * (HD / 2u);                  \
        uint j = c0 + c;                                                \
        vec2 v = j < kmax ? unpackHalf2x16(buf[((base + j * kv_dim) >> 1) + w]) : vec2(0.0); \
        kv[c * QS + 2u * w] = v.x;                                      \
        kv[c * QS + 2u * w + 1u] = v.y;                                 \
    }
#endif

void main() {
    uint h = gl_WorkGroupID.x;
    uint r0 = gl_WorkGroupID.y * BR;
    uint t = gl_LocalInvocationID.x;
    uint kv_dim = p.n_head_kv * HD;
    uint g = h / (p.n_head / p.n_head_kv);

    for (uint i = t; i < BR; i += WG) {
        uint r = r0 + i;
        bool live = r < p.rows;
        rbase[i] = live ? meta[r * META_WORDS + META_KV_BASE] : 0u;
        rkeys[i] = live ? meta[r * META_WORDS + META_KEYS] : 0u;
        rstate[i] = live ? 0u : 2u;
        ms[i] = -1.0 / 0.0;
        ls[i] = 0.0;
    }
    for (uint i = t; i < BR * HD; i += WG) {
        uint rr = i / HD, d = i - rr * HD;
        uint r = r0 + rr;
        qs[rr * QS + d] = r < p.rows ? q[(r * p.n_head + h) * HD + d] : 0.0;
    }
    float acc[MAXACC];
    for (uint i = 0u; i < MAXACC; i++) acc[i] = 0.0;
    barrier();

    while (true) {
        // The next group: the pending rows sharing the first pending row's region.
        if (t == 0u) {
            uint any = 0u, b = 0u, km = 0u;
            for (uint i = 0u; i < BR; i++) {
                if (rstate[i] != 0u) continue;
                if (any == 0u) {
                    any = 1u;
                    b = rbase[i];
                }
                if (rbase[i] == b) {
                    rstate[i] = 1u;
                    km = max(km, rkeys[i]);
                }
            }
            gany = any;
            gbase = b;
            gkeys = km;
        }
        barrier();
        if (gany == 0u) break;
        uint base = gbase + g * HD;
        uint kmax = gkeys;

        for (uint c0 = 0u; c0 < kmax; c0 += BC) {
            LOAD_TILE(mk)
            barrier();
            for (uint i = t; i < BR * BC; i += WG) {
                uint rr = i / BC, c = i - rr * BC;
                float s = -1.0 / 0.0;
                if (rstate[rr] == 1u && c0 + c < rkeys[rr]) {
                    float dot = 0.0;
                    for (uint d = 0u; d < HD; d++) dot += qs[rr * QS + d] * kv[c * QS + d];
                    s = dot * p.scale;
                }
                sp[i] = s;
            }
            barrier();
            LOAD_TILE(mv)
            for (uint rr = t; rr < BR; rr += WG) {
                float m = ms[rr];
                float cmax = m;
                for (uint c = 0u; c < BC; c++) cmax = max(cmax, sp[rr * BC + c]);
                if (cmax == -1.0 / 0.0) {
                    // Not in this group, or no key of this tile: nothing changes.
                    for (uint c = 0u; c < BC; c++) sp[rr * BC + c] = 0.0;
                    al[rr] = 1.0;
                } else {
                    float psum = 0.0;
                    for (uint c = 0u; c < BC; c++) {
                        float w = exp(sp[rr * BC + c] - cmax);
                        sp[rr * BC + c] = w;
                        psum += w;
                    }
                    float rescale = exp(m - cmax);
                    ls[rr] = ls[rr] * rescale + psum;
                    ms[rr] = cmax;
                    al[rr] = rescale;
                }
            }
            barrier();
            uint cn = min(BC, kmax - c0);
            for (uint i = 0u; i < MAXACC; i++) {
                uint e = t + i * WG;
                if (e >= BR * HD) break;
                uint rr = e / HD, d = e - rr * HD;
                float a = acc[i] * al[rr];
                for (uint c = 0u; c < cn; c++) a += sp[rr * BC + c] * kv[c * QS + d];
                acc[i] = a;
            }
            barrier();
        }
        if (t == 0u) {
            for (uint i = 0u; i < BR; i++) {
                if (rstate[i] == 1u) rstate[i] = 2u;
            }
        }
        barrier();
    }

    for (uint i = 0u; i < MAXACC; i++) {
        uint e = t + i * WG;
        if (e >= BR * HD) break;
        uint rr = e / HD, d = e - rr * HD;
        uint r = r0 + rr;
        if (r < p.rows) outv[(r * p.n_head + h) * HD + d] = acc[i] / ls[rr];
    }
}
