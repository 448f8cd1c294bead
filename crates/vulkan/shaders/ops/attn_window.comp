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
// K and V are the mirror's f16 values. A subgroup a strip of 16 rows (BR = 16 subgroups,
// WG = BR / 16 * the subgroup size, at least 16 lanes), its outputs in accumulators (below).
#version 450
#extension GL_GOOGLE_include_directive : require
#ifdef COOPMAT
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#extension GL_KHR_shader_subgroup_vote : require
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
// A split row's pieces: [row][head][WIN_PIECES] -> (m, l, acc[HD]), read back by the workgroup
// that finishes the tile's pieces last (coherent), which counts in done_wgs (a word a tile of
// rows and head, zero between dispatches).
layout(std430, set = 0, binding = 5) coherent buffer Part { float wpart[]; };
layout(std430, set = 0, binding = 6) coherent buffer Done { uint done_wgs[]; };

layout(push_constant) uniform Push {
    uint n_head;
    uint n_head_kv;
    uint head_dim;   // == HD
    uint rows;       // rows of the window
    float scale;
    uint key_window;   // a sliding-window layer's keys a row (0: all)
} p;

#include "meta.glsl"
#include "last_wg.glsl"
#ifdef KV_Q8
#include "kvq8.glsl"
Q8_READER(q8_mk, mk)
Q8_READER(q8_mv, mv)
#endif

#ifdef COOPMAT
#define CM 16u
#define F16MAX 65504.0
const uint NSTRIP = BR / CM;          // subgroups: one strip of 16 query rows each
const uint XW = BC > HD ? BC : HD;    // a strip's scratch row: BC scores or HD outputs
const uint HP = HD + 8u;              // f16 row strides, padded by 16 bytes against bank conflicts
const uint PW = XW + 8u;
const uint SW = XW + 4u;              // f32 row stride
shared float16_t kh[BC * HP];         // the key tile
shared float16_t vh[BC * HP];         // the value tile
shared float sfx[NSTRIP * CM * SW];   // a strip's scores, or its outputs when they are rescaled
shared float16_t phx[NSTRIP * CM * PW];   // a strip's weights exp(s - m) (first its q)
#define ACC coopmat<float, gl_ScopeSubgroup, CM, CM, gl_MatrixUseAccumulator>
#define MATA coopmat<float16_t, gl_ScopeSubgroup, CM, CM, gl_MatrixUseA>
#define MATB coopmat<float16_t, gl_ScopeSubgroup, CM, CM, gl_MatrixUseB>
#else
const uint QS = HD + 1u;   // padded row stride of the q and k/v tiles (no bank conflicts)
shared float qs[BR * QS];
shared float kv[BC * QS];   // the K tile, then the V tile
shared float sp[BR * BC];   // scores, then weights exp(s - m)
shared float pmx[WG];       // the parallel softmax's partial maxima ...
shared float pss[WG];       // ... and partial sums: WG / BR threads a row
#endif
shared float ms[BR];
shared float ls[BR];
shared float al[BR];        // this key tile's rescale of each row's accumulators
shared uint rbase[BR];
shared uint rkeys[BR];
shared uint rper[BR];       // the row's piece size (win_piece_keys) ...
shared uint rnp[BR];        // ... and its pieces (0: no row)
shared uint rstate[BR];     // 0 pending, 1 in the current group, 2 done (or no row)
shared uint gany;
shared uint gbase;
shared uint gkeys;
shared uint gper;     // the group's rows' piece size
shared uint tnp;      // the tile's most pieces a row
shared uint gfirst;   // the group's rows' smallest first key

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

// The tile's rows: region, key count, pieces, state; the running max and sum. Then tnp, the
// tile's most pieces a row. Every thread calls it.
void load_rows(uint r0, uint t) {
    for (uint i = t; i < BR; i += WG) {
        uint r = r0 + i;
        bool live = r < p.rows;
        uint k = live ? meta[r * META_WORDS + META_KEYS] : 0u;
        rbase[i] = live ? meta[r * META_WORDS + META_KV_BASE] : 0u;
        rkeys[i] = k;
        rper[i] = win_piece_keys(k);
        rnp[i] = (k + rper[i] - 1u) / rper[i];
        rstate[i] = live ? 0u : 2u;
        ms[i] = -1.0 / 0.0;
        ls[i] = 0.0;
    }
    barrier();
    if (t == 0u) {
        uint n = 0u;
        for (uint i = 0u; i < BR; i++) n = max(n, rnp[i]);
        tnp = n;
    }
    barrier();
}

// Partial `z` of row r, head h in wpart.
uint win_part(uint r, uint h, uint z) {
    return ((r * p.n_head + h) * WIN_PIECES + z) * (HD + 2u);
}

// After every workgroup of the tile has written its pieces: the one that finishes last merges
// the split rows' pieces in piece order, out = sum_z acc_z e^(m_z - M) / sum_z l_z e^(m_z - M)
// (the decode combine's arithmetic). Every thread calls it.
void win_merge(uint r0, uint h, uint t) {
    if (tnp <= 1u || !finishes_last(gl_WorkGroupID.y * p.n_head + h, tnp, t)) return;
    for (uint e = t; e < BR * HD; e += WG) {
        uint rr = e / HD, d = e - rr * HD;
        uint r = r0 + rr;
        uint np = rnp[rr];
        if (r >= p.rows || np <= 1u) continue;
        float mx = -1.0 / 0.0;
        for (uint z = 0u; z < np; z++) mx = max(mx, wpart[win_part(r, h, z)]);
        float l = 0.0, a = 0.0;
        for (uint z = 0u; z < np; z++) {
            uint ob = win_part(r, h, z);
            float w = exp(wpart[ob] - mx);
            l = fma(wpart[ob + 1u], w, l);
            a = fma(wpart[ob + 2u + d], w, a);
        }
        outv[(r * p.n_head + h) * HD + d] = a / l;
    }
}

// Whether row rr of the tile attends to key j: its group's, causal, within its window.
bool seen(uint rr, uint j) {
    return rstate[rr] == 1u && j < rkeys[rr] && j >= attn_first_key(rkeys[rr], p.key_window);
}

// The next group: the pending rows sharing the first pending row's region and piece size
// (gbase, gper; gkeys: its rows' largest key count, gfirst: their smallest first key). False
// when no row is pending. Every thread calls it.
bool next_group(uint t) {
    if (t == 0u) {
        uint any = 0u, b = 0u, pr = 0u, km = 0u, kf = 0xFFFFFFFFu;
        for (uint i = 0u; i < BR; i++) {
            if (rstate[i] != 0u) continue;
            if (any == 0u) {
                any = 1u;
                b = rbase[i];
                pr = rper[i];
            }
            if (rbase[i] == b && rper[i] == pr) {
                rstate[i] = 1u;
                km = max(km, rkeys[i]);
                kf = min(kf, attn_first_key(rkeys[i], p.key_window));
            }
        }
        gany = any;
        gbase = b;
        gper = pr;
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
    uint z = gl_WorkGroupID.z;   // the piece of each row this workgroup takes

    load_rows(r0, t);
    // The whole workgroup leaves together: no row of the tile has piece z.
    if (z > 0u && z >= tnp) return;
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
        // The group's keys of piece z (a multiple of BC: tiles never cross pieces).
        uint lo = max(gfirst, z * gper);
        uint kmax = min(gkeys, (z + 1u) * gper);

        for (uint c0 = lo / BC * BC; c0 < kmax; c0 += BC) {
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

    // A row of one piece is done here; a split row's piece goes to wpart for the merge.
    for (uint i = 0u; i < MAXACC; i++) {
        uint e = t + i * WG;
        if (e >= BR * HD) break;
        uint rr = e / HD, d = e - rr * HD;
        uint r = r0 + rr;
        uint np = rnp[rr];
        if (r >= p.rows || z >= np) continue;
        if (np == 1u) {
            outv[(r * p.n_head + h) * HD + d] = acc[i] / ls[rr];
        } else {
            uint ob = win_part(r, h, z);
            wpart[ob + 2u + d] = acc[i];
            if (d == 0u) {
                wpart[ob] = ms[rr];
                wpart[ob + 1u] = ls[rr];
            }
        }
    }
    win_merge(r0, h, t);
}
#endif

#ifdef COOPMAT
// Each subgroup owns a strip of 16 query rows: their q as A matrices and their outputs as
// accumulators, held in registers across the whole key walk; the workgroup shares only the K
// and V tiles. A key tile: the strip's scores on the tensor tiles, stored to the strip's
// scratch; the online softmax by the strip's lanes (gl_SubgroupSize / 16 lanes a row, each a
// contiguous run of the tile's keys, the row's maximum and sum over them by a fixed
// shuffle-xor tree, so every lane of a row holds the same m and l); the outputs rescaled
// through the scratch only on tiles where a row's maximum moved (a rescale by 1 is exact, so
// skipping it changes no bit); then outputs += P V. Subgroup barriers order the strip's
// scratch; two workgroup barriers a tile order the shared K/V tiles, whose next tile each
// thread fetches into registers while the strip computes on the current one.
const uint PREF = (BC * (HD / 2u) + WG - 1u) / WG;   // words of a K (and of a V) tile a thread fetches

#define SGSYNC() subgroupMemoryBarrierShared(); subgroupBarrier()

// This thread's words of the K and V tile at key cs (zeros past kmax) into kw and vw.
#define FETCH_KV(cs)                                                                        \
    for (uint i = 0u; i < PREF; i++) {                                                      \
        uint e = t + i * WG, c = e / (HD / 2u), w = e - c * (HD / 2u), j = (cs) + c;        \
        kw[i] = 0u;                                                                         \
        vw[i] = 0u;                                                                         \
        if (e < BC * (HD / 2u) && j < kmax) {                                               \
            uint a = ((base + j * kv_dim) >> 1) + w;                                        \
            kw[i] = mk[a];                                                                  \
            vw[i] = mv[a];                                                                  \
        }                                                                                   \
    }

void main() {
    uint h = gl_WorkGroupID.x;
    uint r0 = gl_WorkGroupID.y * BR;
    uint t = gl_LocalInvocationIndex;
    uint sg = gl_SubgroupID;
    uint lane = gl_SubgroupInvocationID;
    uint L = gl_SubgroupSize / CM;     // lanes a row
    uint lr = lane / L, lp = lane - lr * L;
    uint kv_dim = p.n_head_kv * HD;
    uint g = h / (p.n_head / p.n_head_kv);
    // A subgroup a strip; a driver that cuts the workgroup into more (smaller) subgroups than
    // the host counted leaves the extra ones only loading tiles and meeting the barriers.
    bool own = sg < NSTRIP;
    uint sb = own ? sg * CM * SW : 0u;   // the strip's f32 scratch
    uint pb = own ? sg * CM * PW : 0u;   // its f16 scratch
    uint rr = own ? sg * CM + lr : 0u;   // the lane's row in the tile
    uint z = gl_WorkGroupID.z;         // the piece of each row this workgroup takes
    const float NEG = -1.0 / 0.0;

    load_rows(r0, t);
    // The whole workgroup leaves together: no row of the tile has piece z.
    if (z > 0u && z >= tnp) return;
    for (uint i = lane; own && i < CM * HD; i += gl_SubgroupSize) {
        uint k = i / HD, d = i - k * HD;
        uint r = r0 + sg * CM + k;
        float v = r < p.rows ? q[(r * p.n_head + h) * HD + d] : 0.0;
        phx[pb + k * PW + d] = float16_t(clamp(v, -F16MAX, F16MAX));
    }
    SGSYNC();
    MATA qa[HD / CM];
    for (uint kb = 0u; own && kb < HD / CM; kb++) coopMatLoad(qa[kb], phx, pb + kb * CM, PW, gl_CooperativeMatrixLayoutRowMajor);
    ACC o[HD / CM];
    for (uint db = 0u; db < HD / CM; db++) o[db] = ACC(0.0);
    float m = NEG, l = 0.0;
    barrier();

    while (next_group(t)) {
        uint base = gbase + g * HD;
        // The group's keys of piece z (a multiple of BC: tiles never cross pieces).
        uint lo = max(gfirst, z * gper);
        uint kmax = min(gkeys, (z + 1u) * gper);
        // The lane's row's keys in this group (none when the row is in another group), and the
        // strip's span of them: tiles outside it leave the strip's state as it is.
        bool live = own && rstate[rr] == 1u;
        uint kend = live ? rkeys[rr] : 0u;
        uint kbeg = live ? attn_first_key(rkeys[rr], p.key_window) : 0u;
        uint send = subgroupMax(kend);
        uint sbeg = subgroupMin(live ? kbeg : 0xFFFFFFFFu);
        uint kw[PREF], vw[PREF];
        uint c0 = lo / BC * BC;
        FETCH_KV(c0)
        for (; c0 < kmax; c0 += BC) {
            for (uint i = 0u; i < PREF; i++) {
                uint e = t + i * WG, c = e / (HD / 2u), w = e - c * (HD / 2u);
                if (e < BC * (HD / 2u)) {
                    f16vec2 a = unpackFloat2x16(kw[i]), b = unpackFloat2x16(vw[i]);
                    kh[c * HP + 2u * w] = a.x;
                    kh[c * HP + 2u * w + 1u] = a.y;
                    vh[c * HP + 2u * w] = b.x;
                    vh[c * HP + 2u * w + 1u] = b.y;
                }
            }
            barrier();
            // The next tile's words, in flight while this one is used.
            uint cn = c0 + BC;
            FETCH_KV(cn)
            if (c0 < send && cn > sbeg) {
                for (uint cb = 0u; cb < BC / CM; cb++) {
                    ACC s = ACC(0.0);
                    for (uint kb = 0u; kb < HD / CM; kb++) {
                        MATB b;
                        coopMatLoad(b, kh, cb * CM * HP + kb * CM, HP, gl_CooperativeMatrixLayoutColumnMajor);
                        s = coopMatMulAdd(qa[kb], b, s);
                    }
                    coopMatStore(s, sfx, sb + cb * CM, SW, gl_CooperativeMatrixLayoutRowMajor);
                }
                SGSYNC();
                uint n = BC / L, cf = lp * n;
                float pm = NEG;
                for (uint c = cf; c < cf + n; c++) {
                    uint j = c0 + c;
                    if (j >= kbeg && j < kend) pm = max(pm, sfx[sb + lr * SW + c] * p.scale);
                }
                for (uint x = 1u; x < L; x <<= 1) pm = max(pm, subgroupShuffleXor(pm, x));
                float mn = max(m, pm);
                float ps = 0.0;
                for (uint c = cf; c < cf + n; c++) {
                    uint j = c0 + c;
                    float w = 0.0;
                    if (j >= kbeg && j < kend) w = exp(sfx[sb + lr * SW + c] * p.scale - mn);
                    phx[pb + lr * PW + c] = float16_t(w);
                    ps += w;
                }
                for (uint x = 1u; x < L; x <<= 1) ps += subgroupShuffleXor(ps, x);
                // A row's first key tile scales zero outputs: nothing to do there either.
                float al = mn == NEG ? 1.0 : exp(m - mn);
                bool moved = al != 1.0 && m != NEG;
                l = l * al + ps;
                m = mn;
                SGSYNC();
                if (subgroupAny(moved)) {
                    for (uint db = 0u; db < HD / CM; db++) coopMatStore(o[db], sfx, sb + db * CM, SW, gl_CooperativeMatrixLayoutRowMajor);
                    SGSYNC();
                    for (uint d = lp; d < HD; d += L) sfx[sb + lr * SW + d] *= al;
                    SGSYNC();
                    for (uint db = 0u; db < HD / CM; db++) coopMatLoad(o[db], sfx, sb + db * CM, SW, gl_CooperativeMatrixLayoutRowMajor);
                }
                MATA pa[BC / CM];
                for (uint kb = 0u; kb < BC / CM; kb++) coopMatLoad(pa[kb], phx, pb + kb * CM, PW, gl_CooperativeMatrixLayoutRowMajor);
                for (uint db = 0u; db < HD / CM; db++) {
                    for (uint kb = 0u; kb < BC / CM; kb++) {
                        MATB b;
                        coopMatLoad(b, vh, kb * CM * HP + db * CM, HP, gl_CooperativeMatrixLayoutRowMajor);
                        o[db] = coopMatMulAdd(pa[kb], b, o[db]);
                    }
                }
                SGSYNC();
            }
            barrier();
        }
        end_group(t);
    }

    if (own) {
        for (uint db = 0u; db < HD / CM; db++) coopMatStore(o[db], sfx, sb + db * CM, SW, gl_CooperativeMatrixLayoutRowMajor);
    }
    SGSYNC();
    // A row of one piece is done here; a split row's piece goes to wpart for the merge.
    uint r = r0 + rr;
    uint np = rnp[rr];
    if (own && r < p.rows && z < np) {
        if (np == 1u) {
            for (uint d = lp; d < HD; d += L) outv[(r * p.n_head + h) * HD + d] = sfx[sb + lr * SW + d] / l;
        } else {
            uint ob = win_part(r, h, z);
            for (uint d = lp; d < HD; d += L) wpart[ob + 2u + d] = sfx[sb + lr * SW + d];
            if (lp == 0u) {
                wpart[ob] = m;
                wpart[ob + 1u] = l;
            }
        }
    }
    win_merge(r0, h, t);
}
#endif
