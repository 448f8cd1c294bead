// The small steps of the mixture-of-experts FFN (src/home/pass.rs moe_ffn); the experts' own
// products are gemv.comp's EXPERT form, or the canonical product's (mm.comp EXPERT) over the
// slot lists GROUP writes.
// - ROUTE: one workgroup a row. From the row's router logits (the F32 router's product with
//   the row's normed input, a matrix product ahead of this: src/home/pass.rs moe_ffn), the
//   softmax over every expert, the k largest probabilities (ties: the lower index) and their
//   weights divided by their sum (clamped below at 2^-14), as crates/cpu/src/moe.rs `route`;
//   each by the workgroup's threads together, each thread's experts in registers, every
//   reduction by subgroup shuffles and then across the subgroups (one barrier each), the
//   softmax's sum by the pairwise tree over the threads. Writes the row's slots r * k + j, j
//   in rank order: sel (expert ids) and wt (weights).
// - COMBINE: out[r][i] = the sum over j, in rank order, of wt[r*k + j] * y[r*k + j][i].
// - GROUP: one workgroup. The slots that chose each expert, from the expert ids of `slots`
//   slots: grp[e] .. grp[e + 1] is expert e's range of the lists at grp[n_expert + 1 ..], each
//   expert's slots in slot order; ids out of range are in no list. Then, from word
//   n_expert + 1 + slots, the experts some slot chose in index order and NO_EXPERT up to
//   min(slots, n_expert) entries (common/experts.glsl): the expert products take a workgroup
//   an entry, so a decode step's few experts are not found among idle workgroups of every
//   expert. A prefill window holds thousands of slots, so no thread walks them all: the
//   threads count every expert's slots together (shared atomics), take the prefix sums of the
//   counts by subgroups (integer sums, exact in any order), then place the
//   slots a tile of GROUP_WG at a time, each slot at its expert's cursor plus the number of the
//   tile's earlier slots with its expert (a bit a slot of the tile, per expert), which keeps
//   each list in slot order. Counts and bits do not depend on the order the atomics land, so
//   the lists depend on the ids alone.
// Either way a row's result depends on that row alone.
#version 450
#ifdef ROUTE
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#endif
#ifdef GROUP
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#endif

#ifdef GROUP
// A thread a slot of a tile, and a thread an expert in the prefix sums (MAX_EXPERTS of them).
#define GROUP_WG 256u
layout(local_size_x = 256) in;
#else
layout(local_size_x = 64) in;
#endif

// Experts a router takes at most (src/kernels.rs MOE_MAX_EXPERTS), chosen at most (MOE_MAX_USED).
#define MAX_EXPERTS 256u
#define MAX_USED 8u

#ifdef ROUTE
layout(std430, set = 0, binding = 0) readonly buffer L { float logits[]; };
layout(std430, set = 0, binding = 1) writeonly buffer S { uint sel[]; };
layout(std430, set = 0, binding = 2) writeonly buffer W { float wt[]; };
layout(push_constant) uniform Push {
    uint n_expert;
    uint k;
    uint unused;
} p;

#define RWG 64u   // the workgroup's threads
#define PER (MAX_EXPERTS / RWG)   // experts a thread holds at most: t, t + RWG, ...
// A subgroup's results where a reduction crosses subgroups: two sets (by round parity), so a
// round needs one barrier (a thread reading round j's set is past it before any thread can
// write that set again, in round j + 2, behind round j + 1's barrier).
shared float xv[2][RWG];
shared uint xi[2][RWG];

// The better of two candidates (NONE: no candidate): the larger probability, the lower index
// on a tie, so the pick does not depend on which thread held which expert. A NaN probability
// wins no comparison, but a candidate is still taken over none (k distinct experts).
#define NONE 0xFFFFFFFFu
bool better(uint ib, float vb, uint ia, float va) {
    if (ib == NONE) return false;
    if (ia == NONE) return true;
    return vb > va || (vb == va && ib < ia);
}

// Subgroups of the workgroup and the lanes a reduction pairs within one.
uint nsg() { return max(RWG / gl_SubgroupSize, 1u); }
uint width() { return min(gl_SubgroupSize, RWG); }

// The largest of the threads' v, in every thread (max's order does not matter).
float all_max(float v, uint set) {
    for (uint h = 1u; h < width(); h <<= 1) v = max(v, subgroupShuffleXor(v, h));
    if (gl_SubgroupInvocationID == 0u) xv[set][gl_SubgroupID] = v;
    barrier();
    v = xv[set][0];
    for (uint g = 1u; g < nsg(); g++) v = max(v, xv[set][g]);
    return v;
}

// The sum of the threads' v by the pairwise tree over thread index (thread 2j with 2j + 1,
// then pairs of those, ...), in every thread: the pairs within a subgroup by shuffles (both
// lanes of a pair add the same two values), the subgroups' sums by the same tree after.
float all_sum(float v0, uint set) {
    precise float v = v0;
    for (uint h = 1u; h < width(); h <<= 1) {
        precise float s = v + subgroupShuffleXor(v, h);
        v = s;
    }
    if (gl_SubgroupInvocationID == 0u) xv[set][gl_SubgroupID] = v;
    barrier();
    float w[RWG];
    uint n = nsg();
    for (uint g = 0u; g < n; g++) w[g] = xv[set][g];
    for (uint d = 1u; d < n; d <<= 1)
        for (uint g = 0u; g < n; g += 2u * d) {
            precise float s = w[g] + w[g + d];
            w[g] = s;
        }
    return w[0];
}

// The best of the threads' candidates, in every thread (better() is a total order on distinct
// experts, so the order of the comparisons does not matter).
void all_best(inout uint bi, inout float bv, uint set) {
    for (uint h = 1u; h < width(); h <<= 1) {
        uint oi = subgroupShuffleXor(bi, h);
        float ov = subgroupShuffleXor(bv, h);
        if (better(oi, ov, bi, bv)) {
            bi = oi;
            bv = ov;
        }
    }
    if (gl_SubgroupInvocationID == 0u) {
        xi[set][gl_SubgroupID] = bi;
        xv[set][gl_SubgroupID] = bv;
    }
    barrier();
    bi = xi[set][0];
    bv = xv[set][0];
    for (uint g = 1u; g < nsg(); g++)
        if (better(xi[set][g], xv[set][g], bi, bv)) {
            bi = xi[set][g];
            bv = xv[set][g];
        }
}

void main() {
    uint row = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
    uint t = gl_LocalInvocationIndex;
    uint ne = p.n_expert;
    // This thread's experts t, t + RWG, ... in registers.
    float pr[PER];
    float mx = -1.0 / 0.0;
    for (uint j = 0u; j < PER; j++) {
        uint e = t + j * RWG;
        pr[j] = e < ne ? logits[row * ne + e] : 0.0;
        if (e < ne) mx = max(mx, pr[j]);
    }
    mx = all_max(mx, 0u);
    // The softmax: each thread's experts in index order, then the tree over the threads.
    precise float part = 0.0;
    for (uint j = 0u; j < PER; j++) {
        if (t + j * RWG >= ne) break;
        float v = exp(pr[j] - mx);
        pr[j] = v;
        part += v;
    }
    float inv = 1.0 / all_sum(part, 1u);
    for (uint j = 0u; j < PER; j++) pr[j] *= inv;
    // The k largest, one round each: every thread's best untaken expert, then the workgroup's.
    uint taken = 0u;   // a bit an expert of this thread's
    uint chosen[MAX_USED];
    float cp[MAX_USED];
    for (uint r = 0u; r < p.k; r++) {
        uint bi = NONE;
        float bv = 0.0;
        for (uint j = 0u; j < PER; j++) {
            uint e = t + j * RWG;
            if (e < ne && (taken & (1u << j)) == 0u && better(e, pr[j], bi, bv)) {
                bi = e;
                bv = pr[j];
            }
        }
        all_best(bi, bv, r & 1u);
        chosen[r] = bi;
        cp[r] = bv;
        if (bi != NONE && bi % RWG == t) taken |= 1u << (bi / RWG);
    }
    if (t != 0u) return;
    precise float csum = 0.0;
    for (uint j = 0u; j < p.k; j++) csum += cp[j];
    float norm = 1.0 / max(csum, 6.103516e-5);
    for (uint j = 0u; j < p.k; j++) {
        sel[row * p.k + j] = chosen[j];
        wt[row * p.k + j] = cp[j] * norm;
    }
}
#endif

#ifdef COMBINE
layout(std430, set = 0, binding = 0) readonly buffer W { float wt[]; };
layout(std430, set = 0, binding = 1) readonly buffer Y { float y[]; };
layout(std430, set = 0, binding = 2) writeonly buffer O { float o[]; };
layout(push_constant) uniform Push {
    uint count;  // rows * d
    uint d;
    uint k;
} p;

void main() {
    uint i = (gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x) * gl_WorkGroupSize.x + gl_LocalInvocationID.x;
    if (i >= p.count) return;
    uint r = i / p.d;
    uint c = i - r * p.d;
    precise float acc = 0.0;
    for (uint j = 0u; j < p.k; j++) {
        uint s = r * p.k + j;
        precise float m = wt[s] * y[s * p.d + c];
        acc += m;
    }
    o[i] = acc;
}
#endif

#ifdef GROUP
layout(std430, set = 0, binding = 0) readonly buffer S { uint sel[]; };
layout(std430, set = 0, binding = 1) writeonly buffer G { uint grp[]; };
layout(push_constant) uniform Push {
    uint slots;
    uint n_expert;
    uint unused;
} p;

// Words of a tile's bits per expert.
#define TILE_WORDS (GROUP_WG / 32u)

// Each expert's count, then its cursor: where its next slot goes in its list.
shared uint cursor[MAX_EXPERTS];
shared uint sgs[GROUP_WG];   // each subgroup's total count, and its total of chosen experts
shared uint sgc[GROUP_WG];
#include "experts.glsl"
// Per expert, a bit for each slot of the current tile that chose it.
shared uint tile[MAX_EXPERTS * TILE_WORDS];

void main() {
    uint t = gl_LocalInvocationID.x;
    cursor[t] = 0u;
    for (uint i = t; i < MAX_EXPERTS * TILE_WORDS; i += GROUP_WG) tile[i] = 0u;
    barrier();
    for (uint s = t; s < p.slots; s += GROUP_WG) {
        uint e = sel[s];
        if (e < p.n_expert) atomicAdd(cursor[e], 1u);
    }
    barrier();
    // Inclusive prefix sums of the counts and of "some slot chose it", a thread an expert
    // (the experts past n_expert counted none): within each subgroup (integer sums, exact in
    // any order), then the earlier subgroups' totals.
    uint count = cursor[t];
    uint used = count > 0u ? 1u : 0u;
    uint incl = subgroupInclusiveAdd(count);
    uint inclc = subgroupInclusiveAdd(used);
    if (gl_SubgroupInvocationID == gl_SubgroupSize - 1u) {
        sgs[gl_SubgroupID] = incl;
        sgc[gl_SubgroupID] = inclc;
    }
    barrier();
    uint total = 0u;
    uint nact = 0u;
    for (uint g = 0u; g < gl_NumSubgroups; g++) {
        if (g == gl_SubgroupID) {
            incl += total;
            inclc += nact;
        }
        total += sgs[g];
        nact += sgc[g];
    }
    uint start = incl - count;
    cursor[t] = start;
    if (t < p.n_expert) grp[t] = start;
    if (t == 0u) grp[p.n_expert] = total;
    uint act = p.n_expert + 1u + p.slots;
    if (used == 1u) grp[act + inclc - 1u] = t;
    if (t >= nact && t < min(p.slots, p.n_expert)) grp[act + t] = NO_EXPERT;
    barrier();
    uint lists = p.n_expert + 1u;
    uint word = t / 32u;
    uint bit = 1u << (t % 32u);
    for (uint base = 0u; base < p.slots; base += GROUP_WG) {
        uint s = base + t;
        uint e = p.n_expert;
        if (s < p.slots) e = sel[s];
        bool listed = e < p.n_expert;
        if (listed) atomicOr(tile[e * TILE_WORDS + word], bit);
        barrier();
        // The tile's slots before this one that chose its expert, and all the tile's.
        uint before = 0u;
        uint all = 0u;
        if (listed) {
            for (uint w = 0u; w < TILE_WORDS; w++) {
                uint m = tile[e * TILE_WORDS + w];
                uint n = uint(bitCount(m));
                all += n;
                before += w < word ? n : (w == word ? uint(bitCount(m & (bit - 1u))) : 0u);
            }
            grp[lists + cursor[e] + before] = s;
        }
        barrier();
        // The tile's first slot of each expert moves the expert's cursor past the tile's slots
        // and clears its bits for the next tile.
        if (listed && before == 0u) {
            cursor[e] += all;
            for (uint w = 0u; w < TILE_WORDS; w++) tile[e * TILE_WORDS + w] = 0u;
        }
        barrier();
    }
}
#endif
