// The small steps of the mixture-of-experts FFN (src/home/pass.rs moe_ffn); the experts' own
// products are gemv.comp's EXPERT form, or the canonical product's (mv.comp / mr.comp /
// mm.comp EXPERT) over the slot lists GROUP writes.
// - ROUTE: a subgroup a row. From the row's router logits (the F32 router's product with the
//   row's normed input), the softmax over every expert, the k largest probabilities (ties: the
//   lower index) and their weights divided by their sum (clamped below at 2^-14), as
//   crates/cpu/src/moe.rs `route`; lane l holds experts l, l + S, ... in registers, every
//   reduction is by shuffles over the subgroup's S lanes (no barrier), the softmax's sum each
//   lane's experts in index order, then the pairwise tree over the lanes. Writes the row's
//   slots r * k + j, j in rank order: sel (expert ids) and wt (weights).
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
// - ROUTER: a token command's router, route and group in one dispatch (up to 8 rows: the
//   stages between the norm and the experts' products are one). Each workgroup takes EPW
//   experts' logits for every row (an expert's SPAN threads each sum their vec4 units of the
//   row in order, then the pairwise tree over the threads: the same operations for a row
//   whatever the rows beside it); the workgroup that finishes last (a counter in `done`, left
//   zero) routes the rows, a subgroup a row, and groups their slots as GROUP does. SS_IN:
//   the normed rows are not given but made as the product reads them, from the residual rows
//   x, their 32-value blocks' sums of squares (what mv.comp OUT 5 wrote beside the experts'
//   packs) and the norm's weights: each row's r from the chunks' sums left to right and the
//   tree (common/canon_norm.glsl), then (x * r) * w, normpack.comp WRITE_XN's expression, so
//   the logits are the bits the normed rows would give.
// Either way a row's result depends on that row alone.
#version 450
#extension GL_GOOGLE_include_directive : require
#if defined(ROUTE) || defined(ROUTER)
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#endif
#if defined(GROUP) || defined(ROUTER)
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#endif

#if defined(GROUP) || defined(ROUTER)
// A thread a slot of a tile, and a thread an expert in the prefix sums (MAX_EXPERTS of them).
#define GROUP_WG 256u
layout(local_size_x = 256) in;
#else
// ROUTE: subgroups of 8 to 64 lanes (src/kernels.rs), a row each.
#define RWG 64u
layout(local_size_x = 64) in;
#endif

// Experts a router takes at most (src/kernels.rs MOE_MAX_EXPERTS).
#define MAX_EXPERTS 256u

#ifdef ROUTE
layout(std430, set = 0, binding = 0) readonly buffer L { float logits[]; };
layout(std430, set = 0, binding = 1) writeonly buffer S { uint sel[]; };
layout(std430, set = 0, binding = 2) writeonly buffer W { float wt[]; };
layout(push_constant) uniform Push {
    uint rows;
    uint n_expert;
    uint k;
} p;
#endif

#ifdef ROUTER
layout(std430, set = 0, binding = 0) readonly buffer RW { vec4 rw[]; };   // [n_expert][d]
layout(std430, set = 0, binding = 1) readonly buffer XN { vec4 xn[]; };   // [rows][d]
// Written by every workgroup, read by the last one: coherent.
layout(std430, set = 0, binding = 2) coherent buffer L { float logits[]; };
layout(std430, set = 0, binding = 3) coherent buffer S { uint sel[]; };
layout(std430, set = 0, binding = 4) writeonly buffer W { float wt[]; };
layout(std430, set = 0, binding = 5) writeonly buffer G { uint grp[]; };
layout(std430, set = 0, binding = 6) coherent buffer Done { uint done_wgs[]; };
#ifdef SS_IN
layout(std430, set = 0, binding = 7) readonly buffer SS { float bss[]; };   // [rows][d / 32]
layout(std430, set = 0, binding = 8) readonly buffer NW { vec4 nw[]; };     // [d]
layout(constant_id = 0) const uint LPOW = 8;   // NCH rounded up to a power of two
layout(constant_id = 1) const uint CB = 8;     // blocks a chunk
layout(constant_id = 2) const uint NCH = 8;    // chunks a row
#endif
layout(push_constant) uniform Push {
    uint rows;
    uint n_expert;
    uint k;
    uint d;
    float eps;   // SS_IN: the norm's
} p;
#endif

#if defined(ROUTE) || defined(ROUTER)
// Experts a lane holds (l, l + S, ...: ceil(n_expert / S)) and a row's chosen experts, fixed
// when the pipeline is made so the route's loops unroll over registers.
layout(constant_id = 3) const uint PER = 32;
layout(constant_id = 4) const uint KU = 8;
layout(constant_id = 5) const uint SGE = 4;   // ROUTER: subgroups an expert's threads make (SPAN / S)

// The better of two candidates (NONE: no candidate): the larger probability, the lower index
// on a tie, a total order (a NaN probability counts as -inf), so every lane of a reduction
// ends with the same pick whichever lane held which expert; a candidate is taken over none
// (k distinct experts).
#define NONE 0xFFFFFFFFu
bool better(uint ib, float vb0, uint ia, float va0) {
    if (ib == NONE) return false;
    if (ia == NONE) return true;
    float vb = isnan(vb0) ? -1.0 / 0.0 : vb0;
    float va = isnan(va0) ? -1.0 / 0.0 : va0;
    return vb > va || (vb == va && ib < ia);
}

// The largest of the lanes' v, in every lane (max's order does not matter).
float sg_max(float v) {
    for (uint h = 1u; h < gl_SubgroupSize; h <<= 1) v = max(v, subgroupShuffleXor(v, h));
    return v;
}

// The sum of the lanes' v by the pairwise tree over lane index (lane 2j with 2j + 1, then
// pairs of those, ...), in every lane (both lanes of a pair add the same two values).
float sg_sum(float v0) {
    precise float v = v0;
    for (uint h = 1u; h < gl_SubgroupSize; h <<= 1) {
        precise float s = v + subgroupShuffleXor(v, h);
        v = s;
    }
    return v;
}

// The best of the lanes' candidates, in every lane (better() is a total order on distinct
// experts, so the order of the comparisons does not matter).
void sg_best(inout uint bi, inout float bv) {
    for (uint h = 1u; h < gl_SubgroupSize; h <<= 1) {
        uint oi = subgroupShuffleXor(bi, h);
        float ov = subgroupShuffleXor(bv, h);
        if (better(oi, ov, bi, bv)) {
            bi = oi;
            bv = ov;
        }
    }
}

// Row `row`'s route by the calling subgroup (every lane of it), its KU experts.
void route_row(uint row, uint ne) {
    uint k = KU;
    uint S = gl_SubgroupSize;
    uint lane = gl_SubgroupInvocationID;
    float pr[PER];
    float mx = -1.0 / 0.0;
    for (uint j = 0u; j < PER; j++) {
        uint e = lane + j * S;
        pr[j] = e < ne ? logits[row * ne + e] : 0.0;
        if (e < ne) mx = max(mx, pr[j]);
    }
    mx = sg_max(mx);
    // The softmax: each lane's experts in index order, then the tree over the lanes.
    precise float part = 0.0;
    for (uint j = 0u; j < PER; j++) {
        if (lane + j * S < ne) {
            float v = exp(pr[j] - mx);
            pr[j] = v;
            part += v;
        }
    }
    float inv = 1.0 / sg_sum(part);
    for (uint j = 0u; j < PER; j++) pr[j] *= inv;
    // The k largest, one round each: every lane's best untaken expert, then the subgroup's.
    uint taken = 0u;   // a bit an expert of this lane's
    uint chosen[KU];
    float cp[KU];
    for (uint r = 0u; r < k; r++) {
        uint bi = NONE;
        float bv = 0.0;
        for (uint j = 0u; j < PER; j++) {
            uint e = lane + j * S;
            if (e < ne && (taken & (1u << j)) == 0u && better(e, pr[j], bi, bv)) {
                bi = e;
                bv = pr[j];
            }
        }
        sg_best(bi, bv);
        chosen[r] = bi;
        cp[r] = bv;
        if (bi != NONE && bi % S == lane) taken |= 1u << (bi / S);
    }
    if (lane == 0u) {
        precise float csum = 0.0;
        for (uint j = 0u; j < k; j++) csum += cp[j];
        float norm = 1.0 / max(csum, 6.103516e-5);
        for (uint j = 0u; j < k; j++) {
            sel[row * k + j] = chosen[j];
            wt[row * k + j] = cp[j] * norm;
        }
    }
}
#endif

#ifdef ROUTE
void main() {
    uint wg = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
    uint row = wg * (RWG / gl_SubgroupSize) + gl_SubgroupID;
    if (row < p.rows) route_row(row, p.n_expert);
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
#endif

#if defined(GROUP) || defined(ROUTER)

// Words of a tile's bits per expert.
#define TILE_WORDS (GROUP_WG / 32u)

// Each expert's count, then its cursor: where its next slot goes in its list.
shared uint cursor[MAX_EXPERTS];
shared uint sgs[GROUP_WG];   // each subgroup's total count, and its total of chosen experts
shared uint sgc[GROUP_WG];
#include "experts.glsl"
// Per expert, a bit for each slot of the current tile that chose it.
shared uint tile[MAX_EXPERTS * TILE_WORDS];

// GROUP's lists of `slots` slots' ids over `ne` experts, by the workgroup's thread t.
void group(uint slots, uint ne, uint t) {
    cursor[t] = 0u;
    for (uint i = t; i < MAX_EXPERTS * TILE_WORDS; i += GROUP_WG) tile[i] = 0u;
    barrier();
    for (uint s = t; s < slots; s += GROUP_WG) {
        uint e = sel[s];
        if (e < ne) atomicAdd(cursor[e], 1u);
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
    if (t < ne) grp[t] = start;
    if (t == 0u) grp[ne] = total;
    uint act = ne + 1u + slots;
    if (used == 1u) grp[act + inclc - 1u] = t;
    if (t >= nact && t < min(slots, ne)) grp[act + t] = NO_EXPERT;
    barrier();
    uint lists = ne + 1u;
    uint word = t / 32u;
    uint bit = 1u << (t % 32u);
    for (uint base = 0u; base < slots; base += GROUP_WG) {
        uint s = base + t;
        uint e = ne;
        if (s < slots) e = sel[s];
        bool listed = e < ne;
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

#ifdef GROUP
void main() {
    group(p.slots, p.n_expert, gl_LocalInvocationID.x);
}
#endif

#ifdef ROUTER
#define EPW 2u                 // experts a workgroup
#define SPAN (GROUP_WG / EPW)  // threads an expert
#define NMAX 8u                // rows at most
shared float red[NMAX * (GROUP_WG / 8u)];   // [row][subgroup] partial sums (subgroups of 8+ lanes)
#include "last_wg.glsl"
#ifdef SS_IN
#include "canon_norm.glsl"
shared float rrow[NMAX];   // each row's r
#endif

void main() {
    uint t = gl_LocalInvocationIndex;
    uint ne = p.n_expert;
    uint d4 = p.d / 4u;
#ifdef SS_IN
    if (t < p.rows) {
        uint nb = p.d / 32u;
        float v[32];
        for (uint l = 0u; l < LPOW; l++) {
            precise float a = 0.0;
            for (uint j = 0u; j < CB; j++) {
                uint b = l * CB + j;
                if (l < NCH && b < nb) a = a + bss[t * nb + b];
            }
            v[l] = a;
        }
        rrow[t] = canon_r(v, LPOW, p.d, p.eps);
    }
    barrier();
#endif
    uint el = t / SPAN;
    uint e = gl_WorkGroupID.x * EPW + el;
    // The expert's logit of each row: this thread's units i0, i0 + SPAN, ... in order, then
    // the tree over the subgroup's lanes, then over the expert's subgroups.
    precise float acc[NMAX];
    for (uint r = 0u; r < NMAX; r++) acc[r] = 0.0;
    if (e < ne) {
        for (uint i = t % SPAN; i < d4; i += SPAN) {
            vec4 w = rw[e * d4 + i];
            for (uint r = 0u; r < NMAX; r++) {
                if (r < p.rows) {
#ifdef SS_IN
                    precise vec4 x = (xn[r * d4 + i] * rrow[r]) * nw[i];
#else
                    vec4 x = xn[r * d4 + i];
#endif
                    precise float s = w.x * x.x + w.y * x.y + w.z * x.z + w.w * x.w;
                    acc[r] = acc[r] + s;
                }
            }
        }
    }
    uint S = gl_SubgroupSize;
    uint nsg = GROUP_WG / S;
    for (uint r = 0u; r < NMAX; r++) {
        if (r < p.rows) {
            precise float v = sg_sum(acc[r]);
            if (gl_SubgroupInvocationID == 0u) red[r * nsg + gl_SubgroupID] = v;
        }
    }
    barrier();
    if (t < EPW * p.rows) {
        uint le = t % EPW;
        uint r = t / EPW;
        uint ge = gl_WorkGroupID.x * EPW + le;
        float v[SGE];
        for (uint g = 0u; g < SGE; g++) v[g] = red[r * nsg + le * SGE + g];
        for (uint dd = 1u; dd < SGE; dd <<= 1)
            for (uint g = 0u; g < SGE; g += 2u * dd) {
                precise float a = v[g] + v[g + dd];
                v[g] = a;
            }
        if (ge < ne) logits[r * ne + ge] = v[0];
    }
    // The last workgroup to finish routes and groups: no dispatch and barrier of their own.
    if (!finishes_last(0u, gl_NumWorkGroups.x, t)) return;
    for (uint row = gl_SubgroupID; row < p.rows; row += gl_NumSubgroups) route_row(row, ne);
    memoryBarrierBuffer();
    barrier();
    group(p.rows * p.k, ne, t);
}
#endif
