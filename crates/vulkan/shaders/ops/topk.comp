// The TOPK largest finite logits of each row, best first, for a sampler that keeps at most
// that many (top_k): the read-back of a sampled row shrinks from the vocabulary to TOPK
// pairs. The order is the host sampler's (engine sampling.rs `Cand`): a key of two words,
// ascending: hi = the logit's bits made monotonic then inverted (descending logits; -0.0
// after 0.0), lo = the id (ties by id). Non-finite logits are never candidates: key
// (~0, ~0), after every other.
//   PARTIAL: workgroup (slice, row) sorts logits slice * SPAN .. + SPAN of its row and writes
//            its first TOPK keys as list `slice` of the row;
//   MERGE:   workgroup (group, row) sorts the TOPK keys of lists group * FAN .. + FAN of its
//            row (p.lists of them) and writes its first TOPK as list `group`.
// Each stage sorts SPAN keys in shared memory (bitonic, a total order, so the result is the
// same whatever the split); the host runs MERGE until one list is left (kernels.rs `topk`).
#version 450

layout(local_size_x = 256) in;
#define SPAN 2048u
layout(constant_id = 0) const uint TOPK = 64u;   // <= SPAN / FAN
#define FAN (SPAN / TOPK)

#ifdef PARTIAL
layout(std430, set = 0, binding = 0) readonly buffer L { float logits[]; };
#else
layout(std430, set = 0, binding = 0) readonly buffer In { uvec2 lin[]; };
#endif
layout(std430, set = 0, binding = 1) writeonly buffer Out { uvec2 lout[]; };

layout(push_constant) uniform Push {
    uint n;       // PARTIAL: logits a row; MERGE: unused
    uint lists;   // lists a row read (MERGE), or written (PARTIAL)
    uint out_lists;   // lists a row written
} p;

shared uint khi[SPAN];
shared uint klo[SPAN];

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

void main() {
    uint g = gl_WorkGroupID.x;
    uint r = gl_WorkGroupID.y;
    uint t = gl_LocalInvocationID.x;
    for (uint j = t; j < SPAN; j += 256u) {
        uvec2 k = uvec2(~0u, ~0u);
#ifdef PARTIAL
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
