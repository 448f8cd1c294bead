// Prefill-window attention, flash style: workgroup (head h, tile of BR consecutive query rows)
// walks the keys in tiles of BC, each K and V tile loaded into shared memory once and used by
// every row of the tile; online softmax per row (running max m, sum l, f32 accumulators), the
// causal mask by each row's key count (meta keys: row r attends to keys 0..keys(r) of its
// region, or on a sliding-window layer only its last key_window of them: seen()). Rows of one
// tile may lie in different regions (a segment boundary inside the tile): the tile takes its
// distinct kv_base values one after another ("groups"), each group walking the keys of its
// region from its rows' smallest first key up to their largest key count, the other rows
// masked. Output as attn + attn_combine write it: out[(r * n_head + h) * head_dim + d].
// Specialization: 0 = workgroup size (128 or 256), 1 = BR, 2 = BC, 3 = HD (= head_dim, even).
//
// COOPMAT (f16 mirror, GL_KHR_cooperative_matrix, vulkan1.3): the scores Q K^T and the sums
// P V on 16x16x16 f16 x f16 -> f32 tiles. q is rounded to f16 (clamped), the weights P too;
// K and V are the mirror's f16 values. The scores go through shared memory (f32) to the same
// online softmax, the outputs live in shared memory (f32: each key tile rescales them, then
// adds P V on the cooperative tiles). BR, BC, HD multiples of 16; WG a multiple of BR.
#version 450
#extension GL_GOOGLE_include_directive : require
#ifdef COOPMAT
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_shader_subgroup_basic : require
#endif

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
    uint key_window;   // a sliding-window layer's keys a row (0: all)
} p;

#include "meta.glsl"
#ifdef KV_Q8
#include "kvq8.glsl"
Q8_READER(q8_mk, mk)
Q8_READER(q8_mv, mv)
#endif

#ifdef COOPMAT
#define CM 16u
#define F16MAX 65504.0
const uint HP = HD + 8u;    // f16 row strides, padded by 16 bytes against bank conflicts
const uint BCP = BC + 8u;
shared float16_t qh[BR * HP];
shared float16_t kvh[BC * HP];   // the K tile, then the V tile
shared float16_t ph[BR * BCP];   // weights exp(s - m)
shared float sf[BR * BC];        // scores (unscaled, unmasked)
shared float of[BR * HD];        // outputs, rescaled each key tile
#define ACC coopmat<float, gl_ScopeSubgroup, CM, CM, gl_MatrixUseAccumulator>
#define MATA coopmat<float16_t, gl_ScopeSubgroup, CM, CM, gl_MatrixUseA>
#define MATB coopmat<float16_t, gl_ScopeSubgroup, CM, CM, gl_MatrixUseB>
#else
const uint QS = HD + 1u;   // padded row stride of the q and k/v tiles (no bank conflicts)
shared float qs[BR * QS];
shared float kv[BC * QS];   // the K tile, then the V tile
shared float sp[BR * BC];   // scores, then weights exp(s - m)
#endif
shared float ms[BR];
shared float ls[BR];
shared float al[BR];        // this key tile's rescale of each row's accumulators
shared uint rbase[BR];
shared uint rkeys[BR];
shared uint rstate[BR];     // 0 pending, 1 in the current group, 2 done (or no row)
shared uint gany;
shared uint gbase;
shared uint gkeys;
shared uint gfirst;   // the group's rows' smallest first key
shared float pmx[WG];       // the parallel softmax's partial maxima ...
shared float pss[WG];       // ... and partial sums: WG / BR threads a row

#define MAXS 8u      // scores a thread in the blocked form (BR * BC <= MAXS * WG)
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

// The tile's rows: region, key count, state; the running max and sum.
void load_rows(uint r0, uint t) {
    for (uint i = t; i < BR; i += WG) {
        uint r = r0 + i;
        bool live = r < p.rows;
        rbase[i] = live ? meta[r * META_WORDS + META_KV_BASE] : 0u;
        rkeys[i] = live ? meta[r * META_WORDS + META_KEYS] : 0u;
        rstate[i] = live ? 0u : 2u;
        ms[i] = -1.0 / 0.0;
        ls[i] = 0.0;
    }
}

// Whether row rr of the tile attends to key j: its group's, causal, within its window.
bool seen(uint rr, uint j) {
    return rstate[rr] == 1u && j < rkeys[rr] && j >= attn_first_key(rkeys[rr], p.key_window);
}

// The next group: the pending rows sharing the first pending row's region (gbase, gkeys:
// its rows' largest key count, gfirst: their smallest first key). False when no row is
// pending. Every thread calls it.
bool next_group(uint t) {
    if (t == 0u) {
        uint any = 0u, b = 0u, km = 0u, kf = 0xFFFFFFFFu;
        for (uint i = 0u; i < BR; i++) {
            if (rstate[i] != 0u) continue;
            if (any == 0u) {
                any = 1u;
                b = rbase[i];
            }
            if (rbase[i] == b) {
                rstate[i] = 1u;
                km = max(km, rkeys[i]);
                kf = min(kf, attn_first_key(rkeys[i], p.key_window));
            }
        }
        gany = any;
        gbase = b;
        gkeys = km;
        gfirst = kf;
    }
    barrier();
    return gany != 0u;
}

// After a group: its rows are done. Every thread calls it.
void end_group(uint t) {
    if (t == 0u) {
        for (uint i = 0u; i < BR; i++) {
            if (rstate[i] == 1u) rstate[i] = 2u;
        }
    }
    barrier();
}

// One key tile's online softmax over all threads, WG / BR a row (WG a multiple of BR, BC of
// WG / BR): each thread's keys part, part + WG / BR, ...; the row's max over their maxima
// (exact), each its keys' weights, the row's sum over their sums in order; al[rr] the
// rescale of the row's outputs. SCORE(rr, c) reads a masked, scaled score; PUT_W(rr, c, w)
// stores a weight.
#define SOFTMAX_TILE(t)                                                             \
    {                                                                               \
        uint tpr = WG / BR;                                                         \
        uint rr = t / tpr, part = t % tpr;                                          \
        float pm = -1.0 / 0.0;                                                      \
        for (uint c = part; c < BC; c += tpr) pm = max(pm, SCORE(rr, c));           \
        pmx[t] = pm;                                                                \
        barrier();                                                                  \
        float cmax = ms[rr];                                                        \
        for (uint k = 0u; k < tpr; k++) cmax = max(cmax, pmx[rr * tpr + k]);        \
        float ps = 0.0;                                                             \
        if (cmax == -1.0 / 0.0) {                                                   \
            /* Not in this group, or no key of this tile: nothing changes. */       \
            for (uint c = part; c < BC; c += tpr) PUT_W(rr, c, 0.0);                \
        } else {                                                                    \
            for (uint c = part; c < BC; c += tpr) {                                 \
                float w = exp(SCORE(rr, c) - cmax);                                 \
                PUT_W(rr, c, w);                                                    \
                ps += w;                                                            \
            }                                                                       \
        }                                                                           \
        pss[t] = ps;                                                                \
        barrier();                                                                  \
        if (part == 0u) {                                                           \
            if (cmax == -1.0 / 0.0) {                                               \
                al[rr] = 1.0;                                                       \
            } else {                                                                \
                float psum = 0.0;                                                   \
                for (uint k = 0u; k < tpr; k++) psum += pss[rr * tpr + k];          \
                float rescale = exp(ms[rr] - cmax);                                 \
                ls[rr] = ls[rr] * rescale + psum;                                   \
                ms[rr] = cmax;                                                      \
                al[rr] = rescale;                                                   \
            }                                                                       \
        }                                                                           \
    }

#ifndef COOPMAT
void main() {
    uint h = gl_WorkGroupID.x;
    uint r0 = gl_WorkGroupID.y * BR;
    uint t = gl_LocalInvocationID.x;
    uint kv_dim = p.n_head_kv * HD;
    uint g = h / (p.n_head / p.n_head_kv);

    load_rows(r0, t);
    for (uint i = t; i < BR * HD; i += WG) {
        uint rr = i / HD, d = i - rr * HD;
        uint r = r0 + rr;
        qs[rr * QS + d] = r < p.rows ? q[(r * p.n_head + h) * HD + d] : 0.0;
    }
    float acc[MAXACC];
    for (uint i = 0u; i < MAXACC; i++) acc[i] = 0.0;
    barrier();

    while (next_group(t)) {
        uint base = gbase + g * HD;
        uint kmax = gkeys;

        for (uint c0 = gfirst / BC * BC; c0 < kmax; c0 += BC) {
            LOAD_TILE(mk)
            barrier();
            if (WG % BC == 0u && (BR * BC) % WG == 0u && BR * BC <= MAXS * WG) {
                // Blocked (the same scores, the same sums over d): a thread's scores share
                // one key (items t, t + WG, ...), so each k value is read once for all.
                uint c = t % BC;
                uint rs = WG / BC;
                float dots[MAXS];
                for (uint j = 0u; j < MAXS; j++) dots[j] = 0.0;
                for (uint d = 0u; d < HD; d++) {
                    float kd = kv[c * QS + d];
                    for (uint j = 0u; j < MAXS; j++) {
                        if (j * WG >= BR * BC) break;
                        dots[j] += qs[(t / BC + j * rs) * QS + d] * kd;
                    }
                }
                for (uint j = 0u; j < MAXS; j++) {
                    if (j * WG >= BR * BC) break;
                    uint rr = t / BC + j * rs;
                    sp[rr * BC + c] = seen(rr, c0 + c) ? dots[j] * p.scale : -1.0 / 0.0;
                }
            } else {
                for (uint i = t; i < BR * BC; i += WG) {
                    uint rr = i / BC, c = i - rr * BC;
                    float s = -1.0 / 0.0;
                    if (seen(rr, c0 + c)) {
                        float dot = 0.0;
                        for (uint d = 0u; d < HD; d++) dot += qs[rr * QS + d] * kv[c * QS + d];
                        s = dot * p.scale;
                    }
                    sp[i] = s;
                }
            }
            barrier();
            LOAD_TILE(mv)
            if (WG % BR == 0u && BC % (WG / BR) == 0u) {
#define SCORE(rr, c) sp[(rr) * BC + (c)]
#define PUT_W(rr, c, w) sp[(rr) * BC + (c)] = (w)
                SOFTMAX_TILE(t)
#undef SCORE
#undef PUT_W
            } else {
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
            }
            barrier();
            uint cn = min(BC, kmax - c0);
            if (WG % HD == 0u) {
                // A thread's accumulators share one d (t % HD): each v value read once for all,
                // each accumulator rescaled and then summed over the keys in order, as below.
                uint d = t % HD;
                uint rs = WG / HD;
                for (uint i = 0u; i < MAXACC; i++) {
                    if (t + i * WG >= BR * HD) break;
                    acc[i] = acc[i] * al[t / HD + i * rs];
                }
                for (uint c = 0u; c < cn; c++) {
                    float vd = kv[c * QS + d];
                    for (uint i = 0u; i < MAXACC; i++) {
                        if (t + i * WG >= BR * HD) break;
                        acc[i] += sp[(t / HD + i * rs) * BC + c] * vd;
                    }
                }
            } else {
                for (uint i = 0u; i < MAXACC; i++) {
                    uint e = t + i * WG;
                    if (e >= BR * HD) break;
                    uint rr = e / HD, d = e - rr * HD;
                    float a = acc[i] * al[rr];
                    for (uint c = 0u; c < cn; c++) a += sp[rr * BC + c] * kv[c * QS + d];
                    acc[i] = a;
                }
            }
            barrier();
        }
        end_group(t);
    }

    for (uint i = 0u; i < MAXACC; i++) {
        uint e = t + i * WG;
        if (e >= BR * HD) break;
        uint rr = e / HD, d = e - rr * HD;
        uint r = r0 + rr;
        if (r < p.rows) outv[(r * p.n_head + h) * HD + d] = acc[i] / ls[rr];
    }
}
#endif

#ifdef COOPMAT
// Key rows c0..c0+BC (zeros past kmax) of the f16 mirror `buf` into kvh, as stored.
#define LOAD_TILE_H(buf)                                                            \
    for (uint i = t; i < BC * (HD / 2u); i += WG) {                                 \
        uint c = i / (HD / 2u), w = i - c * (HD / 2u);                              \
        uint j = c0 + c;                                                            \
        f16vec2 v = j < kmax ? unpackFloat2x16(buf[((base + j * kv_dim) >> 1) + w]) : f16vec2(0.0); \
        kvh[c * HP + 2u * w] = v.x;                                                 \
        kvh[c * HP + 2u * w + 1u] = v.y;                                            \
    }

void main() {
    uint h = gl_WorkGroupID.x;
    uint r0 = gl_WorkGroupID.y * BR;
    uint t = gl_LocalInvocationIndex;
    uint sg = gl_SubgroupID;
    uint ns = gl_NumSubgroups;
    uint kv_dim = p.n_head_kv * HD;
    uint g = h / (p.n_head / p.n_head_kv);

    load_rows(r0, t);
    for (uint i = t; i < BR * HD; i += WG) {
        uint rr = i / HD, d = i - rr * HD;
        uint r = r0 + rr;
        float v = r < p.rows ? q[(r * p.n_head + h) * HD + d] : 0.0;
        qh[rr * HP + d] = float16_t(clamp(v, -F16MAX, F16MAX));
        of[i] = 0.0;
    }
    barrier();

    while (next_group(t)) {
        uint base = gbase + g * HD;
        uint kmax = gkeys;
        for (uint c0 = gfirst / BC * BC; c0 < kmax; c0 += BC) {
            LOAD_TILE_H(mk)
            barrier();
            // Scores: 16x16 tiles of rows x keys, a subgroup each in turn.
            for (uint tt = sg; tt < (BR / CM) * (BC / CM); tt += ns) {
                uint rb = tt % (BR / CM), cb = tt / (BR / CM);
                ACC s = ACC(0.0);
                for (uint kb = 0u; kb < HD; kb += CM) {
                    MATA a;
                    MATB b;
                    coopMatLoad(a, qh, rb * CM * HP + kb, HP, gl_CooperativeMatrixLayoutRowMajor);
                    coopMatLoad(b, kvh, cb * CM * HP + kb, HP, gl_CooperativeMatrixLayoutColumnMajor);
                    s = coopMatMulAdd(a, b, s);
                }
                coopMatStore(s, sf, rb * CM * BC + cb * CM, BC, gl_CooperativeMatrixLayoutRowMajor);
            }
            barrier();
            LOAD_TILE_H(mv)
#define SCORE(rr, c) (seen(rr, c0 + (c)) ? sf[(rr) * BC + (c)] * p.scale : -1.0 / 0.0)
#define PUT_W(rr, c, w) ph[(rr) * BCP + (c)] = float16_t(w)
            SOFTMAX_TILE(t)
#undef SCORE
#undef PUT_W
            barrier();
            for (uint i = t; i < BR * HD; i += WG) of[i] = of[i] * al[i / HD];
            barrier();
            // Outputs += P V: 16x16 tiles of rows x dims, a subgroup each in turn.
            for (uint tt = sg; tt < (BR / CM) * (HD / CM); tt += ns) {
                uint rb = tt % (BR / CM), db = tt / (BR / CM);
                ACC o;
                coopMatLoad(o, of, rb * CM * HD + db * CM, HD, gl_CooperativeMatrixLayoutRowMajor);
                for (uint kb = 0u; kb < BC; kb += CM) {
                    MATA a;
                    MATB b;
                    coopMatLoad(a, ph, rb * CM * BCP + kb, BCP, gl_CooperativeMatrixLayoutRowMajor);
                    coopMatLoad(b, kvh, kb * HP + db * CM, HP, gl_CooperativeMatrixLayoutRowMajor);
                    o = coopMatMulAdd(a, b, o);
                }
                coopMatStore(o, of, rb * CM * HD + db * CM, HD, gl_CooperativeMatrixLayoutRowMajor);
            }
            barrier();
        }
        end_group(t);
    }

    for (uint i = t; i < BR * HD; i += WG) {
        uint rr = i / HD, d = i - rr * HD;
        uint r = r0 + rr;
        if (r < p.rows) outv[(r * p.n_head + h) * HD + d] = of[i] / ls[rr];
    }
}
#endif
