// Row r's argmax and log-sum-exp: ids[2r] = the index of its largest logit (ties: the lowest
// index; NaN ignored), ids[2r + 1] = the bits of ln(sum(exp(logit))) over the row (NaN and
// -inf skipped; -inf for a row with nothing else), in one dispatch whose workgroups read a
// vocabulary of 100k+ logits together:
//   workgroup (row, slice) takes values slice, slice + SLICES*256, ... of the row (coalesced)
//   and writes its best (value bits, index) and its (max, sum of exp(x - max)) to
//   part[(r * SLICES + slice) * 4];
//   the last of a row's SLICES workgroups to finish (common/last_wg.glsl, a word a row at
//   binding 3, left zero) merges the partials by the same tree and writes ids[2r], ids[2r + 1].
// Both merges apply the same rules, so the id is the single-pass argmax; the sum's order
// depends on the row's length alone (never on how many rows the pass holds).
#version 450
#extension GL_GOOGLE_include_directive : require

layout(local_size_x = 256) in;
#define SLICES 64u

layout(std430, set = 0, binding = 0) readonly buffer L { float logits[]; };
// Written by every workgroup, read by a row's last: coherent.
layout(std430, set = 0, binding = 1) coherent buffer Part { uint part[]; };
layout(std430, set = 0, binding = 2) writeonly buffer Ids { uint ids[]; };
layout(std430, set = 0, binding = 3) coherent buffer Done { uint done_wgs[]; };

layout(push_constant) uniform Push {
    uint n;
} p;

#include "last_wg.glsl"

shared float bv[256];
shared uint bi[256];
shared float bm[256];
shared float bs[256];

// Whether (v, i) beats (bv, bi) under the rule: a real value over none, larger, or equal and
// lower index; NaN never wins.
bool beats(float v, uint i, float cv, uint ci) {
    if (i == 0xFFFFFFFFu || isnan(v)) return false;
    return ci == 0xFFFFFFFFu || v > cv || (v == cv && i < ci);
}

// (m, s) += (m2, s2): running sums of exp(x - m); s == 0 holds nothing.
void lse_merge(inout float m, inout float s, float m2, float s2) {
    if (s2 == 0.0) return;
    if (s == 0.0) { m = m2; s = s2; return; }
    if (m2 > m) { s = s * exp(m - m2) + s2; m = m2; }
    else if (m2 < m) { s += s2 * exp(m2 - m); }
    else { s += s2; }
}

// The workgroup's 256 candidates and sums merged by the tree into bv[0], bi[0], bm[0], bs[0].
void reduce(uint t, float best, uint idx, float m, float s) {
    bv[t] = best;
    bi[t] = idx;
    bm[t] = m;
    bs[t] = s;
    barrier();
    for (uint h = 128u; h > 0u; h >>= 1) {
        if (t < h) {
            if (beats(bv[t + h], bi[t + h], bv[t], bi[t])) {
                bv[t] = bv[t + h];
                bi[t] = bi[t + h];
            }
            float mm = bm[t];
            float ss = bs[t];
            lse_merge(mm, ss, bm[t + h], bs[t + h]);
            bm[t] = mm;
            bs[t] = ss;
        }
        barrier();
    }
}

void main() {
    uint r = gl_WorkGroupID.x;
    uint slice = gl_WorkGroupID.y;
    uint t = gl_LocalInvocationID.x;
    float best = 0.0;
    uint idx = 0xFFFFFFFFu;
    float m = 0.0;
    float s = 0.0;
    for (uint i = slice * 256u + t; i < p.n; i += SLICES * 256u) {
        float v = logits[r * p.n + i];
        if (beats(v, i, best, idx)) { best = v; idx = i; }
        if (!isnan(v) && !(isinf(v) && v < 0.0)) lse_merge(m, s, v, 1.0);
    }
    reduce(t, best, idx, m, s);
    if (t == 0u) {
        uint o = (r * SLICES + slice) * 4u;
        part[o] = floatBitsToUint(bv[0]);
        part[o + 1u] = bi[0];
        part[o + 2u] = floatBitsToUint(bm[0]);
        part[o + 3u] = floatBitsToUint(bs[0]);
    }
    if (!finishes_last(r, SLICES, t)) return;
    best = 0.0;
    idx = 0xFFFFFFFFu;
    m = 0.0;
    s = 0.0;
    if (t < SLICES) {
        uint o = (r * SLICES + t) * 4u;
        best = uintBitsToFloat(part[o]);
        idx = part[o + 1u];
        m = uintBitsToFloat(part[o + 2u]);
        s = uintBitsToFloat(part[o + 3u]);
    }
    reduce(t, best, idx, m, s);
    if (t == 0u) {
        ids[2u * r] = bi[0];
        ids[2u * r + 1u] = floatBitsToUint(bs[0] == 0.0 ? uintBitsToFloat(0xFF800000u) : bm[0] + log(bs[0]));
    }
}
