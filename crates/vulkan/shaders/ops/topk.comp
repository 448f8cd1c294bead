// The TOPK largest finite logits of each row, best first, for a sampler that keeps at most
// that many (top_k): the read-back of a sampled row shrinks from the vocabulary to TOPK
// pairs. The order is the host sampler's (`resin_core::candidate_key`): a key of two words,
// ascending: hi = the logit's bits made monotonic then inverted (descending logits; -0.0
// after 0.0), lo = the id (ties by id). Non-finite logits are never candidates: key
// (~0, ~0), after every other.
// The selection (three stages, a few microseconds each; TOPK up to 64, p.slices = 64):
//   THRESH:  workgroup (slice, row) of p.slices (>= TOPK) finds the best key among the row's
//            logits slice * 256 + t + m * p.slices * 256 (coalesced), and zeroes the row's
//            candidate count;
//   GATHER:  tau = the worst of the row's slice bests: at least p.slices >= TOPK keys are at
//            or before it, so the row's TOPK best are among the keys up to tau. Workgroup
//            (slice, row) appends those of its logits (a few hundred a row where the logits
//            are spread) to the row's candidates, counting all of them;
//   SELECT:  one workgroup a row ranks its candidates (a total order: ranks are distinct)
//            and writes those ranked below TOPK in rank order: the same keys a full sort
//            puts first.
// A row with more than CAP candidates (a row of many equal or non-finite logits) is left to
// the sort, whose workgroups pass over every other row (p.slices = 0: no selection ran, the
// sort takes every row; a larger TOPK would leave too many candidates a row):
//   PARTIAL: workgroup (slice, row) sorts logits slice * SPAN .. + SPAN of its row and writes
//            its first TOPK keys as list `slice` of the row;
//   MERGE:   workgroup (group, row) sorts the TOPK keys of lists group * FAN .. + FAN of its
//            row (p.lists of them) and writes its first TOPK as list `group`.
// Each sort stage sorts SPAN keys in shared memory (bitonic, a total order, so the result is
// the same whatever the split); the host runs MERGE until one list is left (kernels.rs
// `topk`). Every stage's grid is (x, rows): `sel` is laid out by gl_NumWorkGroups.y.
#version 450

layout(local_size_x = 256) in;
#define SPAN 2048u
layout(constant_id = 0) const uint TOPK = 64u;   // <= SPAN / FAN
#define FAN (SPAN / TOPK)

// Candidates a row's SELECT takes at most (its shared arrays).
#define CAP SPAN

#ifdef MERGE
layout(std430, set = 0, binding = 0) readonly buffer In { uvec2 lin[]; };
#else
layout(std430, set = 0, binding = 0) readonly buffer L { float logits[]; };
#endif
layout(std430, set = 0, binding = 1) writeonly buffer Out { uvec2 lout[]; };
// Words: the rows' candidate counts, then p.slices best keys a row (THRESH), then CAP
// candidate keys a row (GATHER).
layout(std430, set = 0, binding = 2) buffer Sel { uint sel[]; };

layout(push_constant) uniform Push {
    uint n;       // logits a row (MERGE: unused)
    uint lists;   // lists a row read (MERGE), or written (PARTIAL)
    uint out_lists;   // lists a row written
    uint slices;  // THRESH and GATHER workgroups a row (>= TOPK); 0: no selection
} p;

shared uint khi[SPAN];
shared uint klo[SPAN];
// A row's candidate count, read by one thread: every branch on it is uniform.
shared uint row_count;

uint rows() { return gl_NumWorkGroups.y; }
uint best_at(uint r, uint s) { return rows() + (r * p.slices + s) * 2u; }
uint cand_at(uint r, uint j) { return rows() + rows() * p.slices * 2u + (r * CAP + j) * 2u; }

// The sampler's key of logit v at id i.
uvec2 key_of(float v, uint i) {
    if (isnan(v) || isinf(v)) return uvec2(~0u, ~0u);
    uint b = floatBitsToUint(v);
    uint mono = (b >> 31) == 1u ? ~b : (b | 0x80000000u);
    return uvec2(~mono, i);
}

bool after(uint ahi, uint alo, uint bhi, uint blo) {
    return ahi > bhi || (ahi == bhi && alo > blo);
}

bool before(uvec2 a, uvec2 b) {
    return a.x < b.x || (a.x == b.x && a.y < b.y);
}

#if defined(THRESH) || defined(GATHER)
void main() {
    uint g = gl_WorkGroupID.x;
    uint r = gl_WorkGroupID.y;
    uint t = gl_LocalInvocationID.x;
    uint stride = p.slices * 256u;
#ifdef THRESH
    uvec2 best = uvec2(~0u, ~0u);
    for (uint i = g * 256u + t; i < p.n; i += stride) {
        uvec2 k = key_of(logits[r * p.n + i], i);
        if (before(k, best)) best = k;
    }
    khi[t] = best.x;
    klo[t] = best.y;
    barrier();
    for (uint s = 128u; s > 0u; s >>= 1) {
        if (t < s && before(uvec2(khi[t + s], klo[t + s]), uvec2(khi[t], klo[t]))) {
            khi[t] = khi[t + s];
            klo[t] = klo[t + s];
        }
        barrier();
    }
    if (t == 0u) {
        sel[best_at(r, g)] = khi[0];
        sel[best_at(r, g) + 1u] = klo[0];
        if (g == 0u) sel[r] = 0u;
    }
#else
    // tau: the worst slice best (every thread reads the same few words).
    uvec2 tau = uvec2(0u, 0u);
    for (uint s = 0u; s < p.slices; s++) {
        uvec2 b = uvec2(sel[best_at(r, s)], sel[best_at(r, s) + 1u]);
        if (before(tau, b)) tau = b;
    }
    for (uint i = g * 256u + t; i < p.n; i += stride) {
        uvec2 k = key_of(logits[r * p.n + i], i);
        if (k.x != ~0u && !before(tau, k)) {
            uint j = atomicAdd(sel[r], 1u);
            if (j < CAP) {
                sel[cand_at(r, j)] = k.x;
                sel[cand_at(r, j) + 1u] = k.y;
            }
        }
    }
#endif
}
#elif defined(SELECT)
void main() {
    uint r = gl_WorkGroupID.y;
    uint t = gl_LocalInvocationID.x;
    if (t == 0u) row_count = sel[r];
    barrier();
    uint c = row_count;
    if (c > CAP) return;   // the sort serves this row
    for (uint j = t; j < c; j += 256u) {
        khi[j] = sel[cand_at(r, j)];
        klo[j] = sel[cand_at(r, j) + 1u];
    }
    barrier();
    for (uint j = t; j < c; j += 256u) {
        uvec2 k = uvec2(khi[j], klo[j]);
        uint rank = 0u;
        for (uint m = 0u; m < c; m++) rank += before(uvec2(khi[m], klo[m]), k) ? 1u : 0u;
        if (rank < TOPK) lout[r * TOPK + rank] = k;
    }
    // Fewer finite logits than keys: the rest say "no candidate".
    for (uint j = c + t; j < TOPK; j += 256u) lout[r * TOPK + j] = uvec2(~0u, ~0u);
}
#else
void main() {
    uint g = gl_WorkGroupID.x;
    uint r = gl_WorkGroupID.y;
    uint t = gl_LocalInvocationID.x;
    if (t == 0u) row_count = p.slices == 0u ? ~0u : sel[r];
    barrier();
    if (row_count <= CAP) return;   // SELECT served this row
    for (uint j = t; j < SPAN; j += 256u) {
        uvec2 k = uvec2(~0u, ~0u);
#ifndef MERGE
        uint i = g * SPAN + j;
        if (i < p.n) k = key_of(logits[r * p.n + i], i);
#else
        uint l = g * FAN + j / TOPK;
        if (l < p.lists) k = lin[(r * p.lists + l) * TOPK + j % TOPK];
#endif
        khi[j] = k.x;
        klo[j] = k.y;
    }
    barrier();
    // Bitonic sort, ascending.
    for (uint k = 2u; k <= SPAN; k <<= 1) {
        for (uint s = k >> 1; s > 0u; s >>= 1) {
            for (uint i = t; i < SPAN; i += 256u) {
                uint l = i ^ s;
                if (l > i) {
                    bool up = (i & k) == 0u;
                    if (after(khi[i], klo[i], khi[l], klo[l]) == up) {
                        uint a = khi[i], b = klo[i];
                        khi[i] = khi[l];
                        klo[i] = klo[l];
                        khi[l] = a;
                        klo[l] = b;
                    }
                }
            }
            barrier();
        }
    }
    for (uint j = t; j < TOPK; j += 256u) lout[(r * p.out_lists + g) * TOPK + j] = uvec2(khi[j], klo[j]);
}
#endif
