// Decode attention, split over keys: a row's keys first..keys(row) of its region (first 0, or
// the start of its sliding window: meta.glsl attn_first_key) are cut into pieces of
// attn_piece_keys(keys - first) keys (meta.glsl: at least one chunk, at most ATTN_SLOTS
// pieces, from the key count alone), so a piece beyond the keys costs nothing and a row's
// result is the same whatever rows and n_pieces the command has. Workgroup (head, slot, row)
// takes pieces slot, slot + n_pieces, ... and writes each one's partial: the running max m,
// the sum l of exp(s - m) and acc = sum exp(s - m) v. attn_combine merges the pieces, or with
// COMBINE (QACT, QPACK: its rounded forms) the workgroup that finishes a head group last.
// Scores are q.k * scale over head_dim, keys and values read from the layer's mirror buffers
// (f16 pairs, KV_F32, or KV_Q8: q8_0 blocks read back as d * q in f32, as the CPU home's). A chunk of WG keys: one key's score a thread, then each thread
// accumulates its dims over the chunk; loads go out in batches so their latencies overlap.
// Within a chunk the arithmetic is the CPU home's (attention.rs: ops::dot's order, the weights
// summed in key order, the values by fused multiply-adds), so up to 64 keys differ from the
// oracle by exp's ulps alone: fewer flips of the 8-bit roundings downstream.
// ROPE_IN (with COMBINE; f16 and f32 mirrors): the rope-and-store of the rows' q, k and v
// happens here, not in a dispatch before: each workgroup norms (the QK norm where the model
// has one: common/qk_norm.glsl) and ropes its head of q (common/rope.glsl, rope_store.comp's
// arithmetic). A row reads its own key (at pos = keys - 1) and, in a peel, the keys of the
// rows of its region just before it in the pass (up to FMAX keys in all: the rows r - j at
// positions pos - j, found by their metadata; the host passes a region's rows of a pass as
// one run of consecutive positions, in order): those keys are not in the mirror yet, so a
// workgroup whose pieces hold any of them ropes each from k and takes its value from v,
// rounded as the mirror holds them, and reads them from shared memory. The first head of
// each kv group, in the workgroup whose pieces hold the row's own key, writes that key and
// value into the mirror; the other rows write theirs.
#version 450
#extension GL_GOOGLE_include_directive : require

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 64;   // == ATTN_CHUNK (checked on the host)

layout(std430, set = 0, binding = 0) readonly buffer Q { float q[]; };
// MK4: the key mirror read 16 bytes at a time (key16) where a head's keys start 16-byte
// aligned (head_dim a multiple of 8 halves / 4 floats): a thread's key row in 4-8 requests.
#ifdef KV_F32
layout(std430, set = 0, binding = 1) readonly buffer MK { float mk[]; };
layout(std430, set = 0, binding = 1) readonly buffer MK4 { vec4 mk4[]; };
layout(std430, set = 0, binding = 2) readonly buffer MV { float mv[]; };
#elif defined(KV_Q8)
layout(std430, set = 0, binding = 1) readonly buffer MK { uint mk[]; };
layout(std430, set = 0, binding = 2) readonly buffer MV { uint mv[]; };
#else
layout(std430, set = 0, binding = 1) readonly buffer MK { uint mk[]; };
layout(std430, set = 0, binding = 1) readonly buffer MK4 { uvec4 mk4[]; };
layout(std430, set = 0, binding = 2) readonly buffer MV { uint mv[]; };
#endif
#ifdef ROPE_IN
// The newest key and value are stored through these (the reads above never reach them:
// they come from kf and vf), so the reads keep the read-only path.
#ifdef KV_F32
layout(std430, set = 0, binding = 1) writeonly buffer MKW { float mkw[]; };
layout(std430, set = 0, binding = 2) writeonly buffer MVW { float mvw[]; };
#else
layout(std430, set = 0, binding = 1) writeonly buffer MKW { uint mkw[]; };
layout(std430, set = 0, binding = 2) writeonly buffer MVW { uint mvw[]; };
#endif
// The rows' k and v projections, the biases [q_dim | kv_dim | kv_dim] and the (cos, sin)
// table [n_ctx][rope_dims / 2][2], as rope_store.comp reads them.
layout(std430, set = 0, binding = 8) readonly buffer K { float kin[]; };
layout(std430, set = 0, binding = 9) readonly buffer V { float vin[]; };
layout(std430, set = 0, binding = 10) readonly buffer Bias { float bias[]; };
layout(std430, set = 0, binding = 11) readonly buffer Rope { float cs[]; };
// The QK norm's weights, q's head_dim then k's (rflags & 4; qwen3, gemma3).
layout(std430, set = 0, binding = 12) readonly buffer QkNorm { float qkn[]; };
#endif
layout(std430, set = 0, binding = 3) readonly buffer Meta { uint meta[]; };
// Partials: [row][head][ATTN_SLOTS] -> (m, l) and acc[head_dim].
#ifdef COMBINE
// Read back by the workgroup that merges them (common/combine.glsl): coherent.
layout(std430, set = 0, binding = 4) coherent buffer Part { float part[]; };
layout(std430, set = 0, binding = 5) writeonly buffer Out { float outv[]; };
#ifdef QPACK
layout(std430, set = 0, binding = 6) writeonly buffer Packed { uint pk[]; };
#elif defined(QACT)
layout(std430, set = 0, binding = 6) writeonly buffer Rounded { float y[]; };
#endif
// Workgroups finished, a row and head group (zero between dispatches: the last sets it back).
layout(std430, set = 0, binding = 7) coherent buffer Done { uint done_wgs[]; };
layout(constant_id = 1) const uint QB = 32;
#ifdef ROPE_IN
layout(constant_id = 2) const uint FMAX = 1;   // keys of the pass a row reads, its own included
#endif
#else
layout(std430, set = 0, binding = 4) writeonly buffer Part { float part[]; };
#endif

layout(push_constant) uniform Push {
    uint n_head;
    uint n_head_kv;
    uint head_dim;
    uint n_pieces;
    float scale;
    uint key_window;   // a sliding-window layer's keys a row (0: all)
#ifdef COMBINE
    uint heads;   // heads a merge (1 without QACT)
    uint count;   // values of the pass (rows * n_head * head_dim): the packed layout's offsets
#endif
#ifdef ROPE_IN
    uint rope_dims;
    uint rflags;  // 1: add the q/k/v bias, 2: NEOX pairs (halves), else NORM (neighbours), 4: the QK norm
    float qk_eps;
#endif
} p;

#include "meta.glsl"
#ifdef COMBINE
#include "combine.glsl"
#include "last_wg.glsl"
#endif
#ifdef KV_Q8
#include "kvq8.glsl"
Q8_READER(q8k, mk)
Q8_READER(q8v, mv)
#endif

shared float qs[256];
#ifdef ROPE_IN
#include "rope.glsl"
shared float rin[512];        // the q head, then a k head, before the rotation
shared float kf[FMAX * 256u];  // the pass's keys and values the row reads, as the mirror holds them
shared float vf[FMAX * 256u];
shared uint hw[256];          // a key's and value's f16 words (KV f16)
bool fresh_wg;   // this workgroup's pieces hold a key of the pass
uint fresh_first;  // the first key of the pass the row reads (the last ones: fresh_first..keys)
#endif
shared float sc[256];   // the chunk's scores
#ifdef ROPE_IN
// The QK norm runs before the first chunk, its tree in the scores' array.
#define QK_H rin
#define QK_W qkn
#define QK_RED sc
#include "qk_norm.glsl"
#endif
shared float pe[256];   // the chunk's exp(s - max) (0 past the keys)

#define MAXD 4u   // dims a thread accumulates: head_dim <= MAXD * WG
#define VB 16u    // values a dim loads at once

float kval(uint e) {
#ifdef KV_F32
    return mk[e];
#elif defined(KV_Q8)
    return q8k(e);
#else
    return unpackHalf2x16(mk[e >> 1] >> ((e & 1u) * 16u)).x;
#endif
}

float vval(uint e) {
#ifdef KV_F32
    return mv[e];
#elif defined(KV_Q8)
    return q8v(e);
#else
    return unpackHalf2x16(mv[e >> 1] >> ((e & 1u) * 16u)).x;
#endif
}

// 16 lanes of the dot product: acc[k] += q[i + k] * kk[k] (fused).
void lanes(inout float acc[16], uint i, float kk[16]) {
    for (uint k = 0u; k < 16u; k++) acc[k] = fma(qs[i + k], kk[k], acc[k]);
}

// Key dims i..i+16 of the key row at element e (even: rows and heads start at even elements).
float[16] key16(uint e, uint i) {
    float kk[16];
#ifdef KV_F32
    if ((p.head_dim & 3u) == 0u) {
        for (uint k = 0u; k < 4u; k++) {
            vec4 w = mk4[((e + i) >> 2) + k];
            kk[4u * k] = w.x; kk[4u * k + 1u] = w.y; kk[4u * k + 2u] = w.z; kk[4u * k + 3u] = w.w;
        }
        return kk;
    }
    for (uint k = 0u; k < 16u; k++) kk[k] = mk[e + i + k];
#elif defined(KV_Q8)
    // 16 dims of one block (e + i is a multiple of 16): its scale, then four words of quants.
    float d = q8k_d(e + i);
    uint o = q8_qbyte(e + i);
    for (uint k = 0u; k < 4u; k++) {
        uint w = q8k_w32(o + 4u * k);
        for (uint b = 0u; b < 4u; b++) kk[4u * k + b] = q8_value(d, q8_sbyte(w, b));
    }
#else
    if ((p.head_dim & 7u) == 0u) {
        uvec4 a = mk4[(e + i) >> 3], b = mk4[((e + i) >> 3) + 1u];
        uint w[8] = uint[8](a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w);
        for (uint k = 0u; k < 8u; k++) {
            vec2 h = unpackHalf2x16(w[k]);
            kk[2u * k] = h.x;
            kk[2u * k + 1u] = h.y;
        }
        return kk;
    }
    for (uint k = 0u; k < 8u; k++) {
        vec2 w = unpackHalf2x16(mk[((e + i) >> 1) + k]);
        kk[2u * k] = w.x;
        kk[2u * k + 1u] = w.y;
    }
#endif
    return kk;
}

// q . k in the CPU home's order (ops::dot): 16 lanes of fused multiply-adds over the dims, its
// reduction tree, then the dims past a multiple of 16 one by one. Loads go out 32 dims at once.
#ifdef ROPE_IN
// The pass's keys from kf (the same values the mirror will hold), any other from the mirror.
float[16] key16s(uint key, uint e, uint i) {
    if (fresh_wg && key >= fresh_first) {
        float kk[16];
        for (uint k = 0u; k < 16u; k++) kk[k] = kf[(key - fresh_first) * 256u + i + k];
        return kk;
    }
    return key16(e, i);
}
float kvals(uint key, uint e, uint i) { return fresh_wg && key >= fresh_first ? kf[(key - fresh_first) * 256u + i] : kval(e + i); }
#else
#define key16s(key, e, i) key16(e, i)
#define kvals(key, e, i) kval((e) + (i))
#endif

// Key `key`'s score; e: its mirror element.
float score(uint key, uint e, uint hd) {
    float acc[16];
    for (uint k = 0u; k < 16u; k++) acc[k] = 0.0;
    uint i = 0u;
    for (; i + 32u <= hd; i += 32u) {
        float k0[16] = key16s(key, e, i);
        float k1[16] = key16s(key, e, i + 16u);
        lanes(acc, i, k0);
        lanes(acc, i + 16u, k1);
    }
    if (i + 16u <= hd) {
        lanes(acc, i, key16s(key, e, i));
        i += 16u;
    }
    precise float t0 = acc[0] + acc[8], t1 = acc[1] + acc[9], t2 = acc[2] + acc[10], t3 = acc[3] + acc[11];
    precise float t4 = acc[4] + acc[12], t5 = acc[5] + acc[13], t6 = acc[6] + acc[14], t7 = acc[7] + acc[15];
    precise float u0 = t0 + t4, u1 = t1 + t5, u2 = t2 + t6, u3 = t3 + t7;
    precise float sum = (u0 + u2) + (u1 + u3);
    for (; i < hd; i++) {
        precise float pr = qs[i] * kvals(key, e, i);
        sum = sum + pr;
    }
    return sum;
}

void main() {
    uint h = gl_WorkGroupID.x;
    uint slot = gl_WorkGroupID.y;
    uint r = gl_WorkGroupID.z;
    uint t = gl_LocalInvocationID.x;
    uint hd = p.head_dim;
    uint kv_dim = p.n_head_kv * hd;
    uint g = h / (p.n_head / p.n_head_kv);
    uint keys = meta[r * META_WORDS + META_KEYS];
    uint first = attn_first_key(keys, p.key_window);
    uint base = meta[r * META_WORDS + META_KV_BASE] + g * hd;
    uint per = attn_piece_keys(keys - first);
    uint npc = (keys - first + per - 1u) / per;
    // The whole workgroup leaves together, before any barrier.
    if (slot >= npc) return;

#ifdef ROPE_IN
    {
        uint pos = keys - 1u;
        uint q_dim = p.n_head * hd;
        bool bias_on = (p.rflags & 1u) != 0u;
        bool neox = (p.rflags & 2u) != 0u;
        uint half_r = p.rope_dims / 2u;
        // The rows of the row's region just before it in the pass, at the positions just
        // before its own: their keys and its own are the pass's keys it reads.
        uint fn = 1u;
        uint region = meta[r * META_WORDS + META_KV_BASE];
        while (fn < FMAX && fn <= r && meta[(r - fn) * META_WORDS + META_KV_BASE] == region && meta[(r - fn) * META_WORDS + META_KEYS] == keys - fn) fn++;
        fresh_first = keys - fn;
        fresh_wg = false;
        for (uint pc = slot; pc < npc; pc += p.n_pieces) fresh_wg = fresh_wg || first + (pc + 1u) * per > fresh_first;
        bool own_wg = (npc - 1u) % p.n_pieces == slot;   // its pieces hold the row's own key
        for (uint i = t; i < hd; i += WG) {
            float a = q[(r * p.n_head + h) * hd + i];
            if (bias_on) a = with_bias(a, bias[h * hd + i]);
            rin[i] = a;
        }
        barrier();
        if ((p.rflags & 4u) != 0u) qk_norm_head(t, hd, 0u, 0u, p.qk_eps);
        for (uint i = t; i < hd; i += WG) {
            if (i < half_r) {
                uint i0, i1;
                rope_pair(i, half_r, neox, i0, i1);
                float c = cs[2u * (pos * half_r + i)];
                float s = cs[2u * (pos * half_r + i) + 1u];
                float o0, o1;
                rope_rotate(rin[i0], rin[i1], c, s, o0, o1);
                qs[i0] = o0;
                qs[i1] = o1;
            } else if (i >= p.rope_dims) {
                qs[i] = rin[i];
            }
        }
        // Key j of the pass's keys the row reads: row r - (fn - 1 - j)'s, at fresh_first + j.
        for (uint j = 0u; fresh_wg && j < fn; j++) {
            uint rj = r - (fn - 1u - j);
            uint kp = fresh_first + j;
            for (uint i = t; i < hd; i += WG) {
                float kk = kin[rj * kv_dim + g * hd + i];
                float vv = vin[rj * kv_dim + g * hd + i];
                if (bias_on) {
                    kk = with_bias(kk, bias[q_dim + g * hd + i]);
                    vv = with_bias(vv, bias[q_dim + kv_dim + g * hd + i]);
                }
                rin[256u + i] = kk;
                vf[j * 256u + i] = vv;
            }
            barrier();
            if ((p.rflags & 4u) != 0u) qk_norm_head(t, hd, 256u, hd, p.qk_eps);
            for (uint i = t; i < hd; i += WG) {
                if (i < half_r) {
                    uint i0, i1;
                    rope_pair(i, half_r, neox, i0, i1);
                    float c = cs[2u * (kp * half_r + i)];
                    float s = cs[2u * (kp * half_r + i) + 1u];
                    float o0, o1;
                    rope_rotate(rin[256u + i0], rin[256u + i1], c, s, o0, o1);
                    kf[j * 256u + i0] = o0;
                    kf[j * 256u + i1] = o1;
                } else if (i >= p.rope_dims) {
                    kf[j * 256u + i] = rin[256u + i];
                }
            }
            barrier();
            // The group's first head writes the row's own key and value into the mirror (in
            // the workgroup whose pieces hold it); every workgroup reads each key and value
            // back as the mirror holds them.
            bool writer = j + 1u == fn && own_wg && h % (p.n_head / p.n_head_kv) == 0u;
            uint ke = base + kp * kv_dim;
#ifdef KV_F32
            if (writer) {
                for (uint i = t; i < hd; i += WG) {
                    mkw[ke + i] = kf[j * 256u + i];
                    mvw[ke + i] = vf[j * 256u + i];
                }
            }
#else
            for (uint jj = t; jj < hd / 2u; jj += WG) {
                uint i = 2u * jj;
                uint wk = packHalf2x16(vec2(clamp_half(kf[j * 256u + i]), clamp_half(kf[j * 256u + i + 1u])));
                uint wv = packHalf2x16(vec2(clamp_half(vf[j * 256u + i]), clamp_half(vf[j * 256u + i + 1u])));
                if (writer) {
                    mkw[(ke + i) >> 1] = wk;
                    mvw[(ke + i) >> 1] = wv;
                }
                hw[jj] = wk;
                hw[128u + jj] = wv;
            }
            barrier();
            // Unpacked from the words in shared memory (a compiler may fold an unpack of the
            // pack just made into the unrounded value, which the mirror does not hold).
            for (uint i = t; i < hd; i += WG) {
                kf[j * 256u + i] = unpackHalf2x16(hw[i >> 1] >> ((i & 1u) * 16u)).x;
                vf[j * 256u + i] = unpackHalf2x16(hw[128u + (i >> 1)] >> ((i & 1u) * 16u)).x;
            }
#endif
            barrier();
        }
        barrier();
    }
#else
    for (uint i = t; i < hd; i += WG) qs[i] = q[(r * p.n_head + h) * hd + i];
    barrier();
#endif

    for (uint pc = slot; pc < npc; pc += p.n_pieces) {
        uint k0 = first + pc * per;
        uint k1 = min(k0 + per, keys);
        float m = -1.0 / 0.0;
        float l = 0.0;
        float acc[MAXD];
        for (uint d = 0u; d < MAXD; d++) acc[d] = 0.0;

        for (uint c0 = k0; c0 < k1; c0 += WG) {
            uint cn = min(WG, k1 - c0);
#ifdef ROPE_IN
            // The chunk's keys of the pass (the last ones, fresh_first..keys: a suffix of it).
            uint cf = fresh_wg && c0 + cn > fresh_first ? c0 + cn - max(c0, fresh_first) : 0u;
#else
            const uint cf = 0u;
#endif
            float s = -1.0 / 0.0;
            // precise: no contraction of the scaling with the max's subtraction below, which a
            // compiler could otherwise choose differently in each form of this kernel.
            if (t < cn) {
                precise float sv = score(c0 + t, base + (c0 + t) * kv_dim, hd) * p.scale;
                s = sv;
            }
            sc[t] = s;
            // Also: every thread is done reading the previous chunk's pe.
            barrier();
            // The chunk's max in four independent chains (max is exact in any order).
            float c4[4] = float[4](m, m, m, m);
            for (uint i = 0u; i < WG; i += 4u)
                for (uint k = 0u; k < 4u; k++) c4[k] = max(c4[k], sc[i + k]);
            float cmax = max(max(c4[0], c4[1]), max(c4[2], c4[3]));
            precise float dm = m - cmax;
            precise float ds = s - cmax;
            float rescale = exp(dm);
            pe[t] = t < cn ? exp(ds) : 0.0;
            barrier();
            // The weights' sum in key order (pe is 0 past cn), taken inside the first dim's
            // value loop so its chain of adds overlaps the value loads (thread 0's is the one
            // written; threads past head_dim have no value loop and no use for it).
            float psum = 0.0;
            for (uint d = 0u; d < MAXD; d++) {
                uint dim = t + d * WG;
                if (dim >= hd) break;
                precise float a = acc[d] * rescale;
                uint e0 = base + c0 * kv_dim + dim;
                uint i = 0u;
                // The keys from the mirror (ROPE_IN: all but the pass's, the chunk's last cf).
                uint cm = cn - cf;
                for (; i + VB <= cm; i += VB) {
                    float vv[VB];
                    for (uint k = 0u; k < VB; k++) vv[k] = vval(e0 + (i + k) * kv_dim);
                    for (uint k = 0u; k < VB; k++) {
                        a = fma(pe[i + k], vv[k], a);
                        if (d == 0u) psum += pe[i + k];
                    }
                }
                for (; i < cm; i++) {
                    a = fma(pe[i], vval(e0 + i * kv_dim), a);
                    if (d == 0u) psum += pe[i];
                }
#ifdef ROPE_IN
                // Then the pass's keys' values, in their places in the order (the last).
                for (uint j = cm; j < cn; j++) {
                    a = fma(pe[j], vf[(c0 + j - fresh_first) * 256u + dim], a);
                    if (d == 0u) psum += pe[j];
                }
#endif
                acc[d] = a;
            }
            precise float lr = l * rescale + psum;
            l = lr;
            m = cmax;
        }
        uint ob = ((r * p.n_head + h) * ATTN_SLOTS + pc) * (hd + 2u);
        if (t == 0u) {
            part[ob] = m;
            part[ob + 1u] = l;
        }
        for (uint d = 0u; d < MAXD; d++) {
            uint dim = t + d * WG;
            if (dim < hd) part[ob + 2u + dim] = acc[d];
        }
    }
#ifdef COMBINE
    // The workgroup that finishes its head group's pieces last merges them: no dispatch and
    // barrier for the combine. Every workgroup of the group with a piece counts itself.
    uint groups = p.n_head / p.heads;
    if (!finishes_last(r * groups + h / p.heads, p.heads * min(p.n_pieces, npc), t)) return;
    combine(r, h / p.heads, t);
#endif
}
