// ids[r] = the index of the largest logit of row r (ties: the lowest index; NaN ignored), in
// two stages so a vocabulary of 100k+ logits is read by many workgroups:
//   PARTIAL: workgroup (row, slice) takes values slice, slice + SLICES*256, ... of the row
//            (coalesced) and writes its best (value bits, index) to part[(r * SLICES + slice) * 2];
//   final:   one workgroup a row merges the SLICES partials and writes ids[r].
// Both stages apply the same rule, so the result is the single-pass argmax.
#version 450

layout(local_size_x = 256) in;
#define SLICES 64u

layout(std430, set = 0, binding = 0) readonly buffer L { float logits[]; };
layout(std430, set = 0, binding = 1) buffer Part { uint part[]; };
layout(std430, set = 0, binding = 2) writeonly buffer Ids { uint ids[]; };

layout(push_constant) uniform Push {
    uint n;
} p;

shared float bv[256];
shared uint bi[256];

// Whether (v, i) beats (bv, bi) under the rule: a real value over none, larger, or equal and
// lower index; NaN never wins.
bool beats(float v, uint i, float cv, uint ci) {
    if (i == 0xFFFFFFFFu || isnan(v)) return false;
    return ci == 0xFFFFFFFFu || v > cv || (v == cv && i < ci);
}

void main() {
    uint r = gl_WorkGroupID.x;
    uint t = gl_LocalInvocationID.x;
    float best = 0.0;
    uint idx = 0xFFFFFFFFu;
#ifdef PARTIAL
    uint slice = gl_WorkGroupID.y;
    for (uint i = slice * 256u + t; i < p.n; i += SLICES * 256u) {
        float v = logits[r * p.n + i];
        if (beats(v, i, best, idx)) { best = v; idx = i; }
    }
#else
    if (t < SLICES) {
        uint o = (r * SLICES + t) * 2u;
        best = uintBitsToFloat(part[o]);
        idx = part[o + 1u];
    }
#endif
    bv[t] = best;
    bi[t] = idx;
    barrier();
    for (uint s = 128u; s > 0u; s >>= 1) {
        if (t < s && beats(bv[t + s], bi[t + s], bv[t], bi[t])) {
            bv[t] = bv[t + s];
            bi[t] = bi[t + s];
        }
        barrier();
    }
    if (t == 0u) {
#ifdef PARTIAL
        uint o = (r * SLICES + gl_WorkGroupID.y) * 2u;
        part[o] = floatBitsToUint(bv[0]);
        part[o + 1u] = bi[0];
#else
        ids[r] = bi[0];
#endif
    }
}
