// The small steps of the mixture-of-experts FFN (src/home/pass.rs moe_ffn); the experts' own
// products are gemv.comp's EXPERT form, or the canonical product's (mm.comp EXPERT) over the
// slot lists GROUP writes.
// - ROUTE: one workgroup a row. The router's logits (F32 weights [n_expert][d] . the row's
//   normed input; each logit one thread's sum in index order), the softmax over every expert,
//   the k largest probabilities (ties: the lower index) and their weights divided by their
//   sum (clamped below at 2^-14), as crates/cpu/src/moe.rs `route`. Writes the row's slots
//   r * k + j, j in rank order: sel (expert ids) and wt (weights).
// - COMBINE: out[r][i] = the sum over j, in rank order, of wt[r*k + j] * y[r*k + j][i].
// - GROUP: one workgroup. The slots that chose each expert, from the expert ids of `slots`
//   slots: grp[e] .. grp[e + 1] is expert e's range of the lists at grp[n_expert + 1 ..], each
//   expert's slots in slot order (a thread an expert counts them, one thread takes the prefix
//   sums, then each expert's thread writes its list), so the lists depend on the ids alone.
// Either way a row's result depends on that row alone.
#version 450

layout(local_size_x = 64) in;

// Experts a router takes at most (src/kernels.rs MOE_MAX_EXPERTS), chosen at most (MOE_MAX_USED).
#define MAX_EXPERTS 256u
#define MAX_USED 8u

#ifdef ROUTE
layout(std430, set = 0, binding = 0) readonly buffer R { float router[]; };
layout(std430, set = 0, binding = 1) readonly buffer X { float x[]; };
layout(std430, set = 0, binding = 2) writeonly buffer S { uint sel[]; };
layout(std430, set = 0, binding = 3) writeonly buffer W { float wt[]; };
layout(push_constant) uniform Push {
    uint d;
    uint n_expert;
    uint k;
} p;

shared float prob[MAX_EXPERTS];

void main() {
    uint row = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
    uint t = gl_LocalInvocationID.x;
    for (uint e = t; e < p.n_expert; e += gl_WorkGroupSize.x) {
        precise float acc = 0.0;
        for (uint i = 0u; i < p.d; i++) {
            precise float m = router[e * p.d + i] * x[row * p.d + i];
            acc += m;
        }
        prob[e] = acc;
    }
    barrier();
    if (t != 0u) return;
    float mx = prob[0];
    for (uint e = 1u; e < p.n_expert; e++) mx = max(mx, prob[e]);
    precise float sum = 0.0;
    for (uint e = 0u; e < p.n_expert; e++) {
        float v = exp(prob[e] - mx);
        prob[e] = v;
        sum += v;
    }
    float inv = 1.0 / sum;
    for (uint e = 0u; e < p.n_expert; e++) prob[e] *= inv;
    uint taken[MAX_EXPERTS / 32u];
    for (uint w = 0u; w < MAX_EXPERTS / 32u; w++) taken[w] = 0u;
    uint chosen[MAX_USED];
    precise float csum = 0.0;
    for (uint j = 0u; j < p.k; j++) {
        // The first expert not yet taken, then any later one strictly larger: ties keep the
        // lower index, and a NaN probability never displaces a pick (k distinct experts).
        uint best = 0u;
        while ((taken[best >> 5] & (1u << (best & 31u))) != 0u) best++;
        for (uint e = best + 1u; e < p.n_expert; e++) {
            if ((taken[e >> 5] & (1u << (e & 31u))) == 0u && prob[e] > prob[best]) best = e;
        }
        taken[best >> 5] |= 1u << (best & 31u);
        chosen[j] = best;
        csum += prob[best];
    }
    float norm = 1.0 / max(csum, 6.103516e-5);
    for (uint j = 0u; j < p.k; j++) {
        sel[row * p.k + j] = chosen[j];
        wt[row * p.k + j] = prob[chosen[j]] * norm;
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

shared uint start[MAX_EXPERTS];

void main() {
    uint t = gl_LocalInvocationID.x;
    for (uint e = t; e < p.n_expert; e += gl_WorkGroupSize.x) {
        uint c = 0u;
        for (uint s = 0u; s < p.slots; s++) c += sel[s] == e ? 1u : 0u;
        start[e] = c;
    }
    barrier();
    if (t == 0u) {
        uint o = 0u;
        for (uint e = 0u; e < p.n_expert; e++) {
            uint c = start[e];
            start[e] = o;
            grp[e] = o;
            o += c;
        }
        grp[p.n_expert] = o;
    }
    barrier();
    uint lists = p.n_expert + 1u;
    for (uint e = t; e < p.n_expert; e += gl_WorkGroupSize.x) {
        uint o = start[e];
        for (uint s = 0u; s < p.slots; s++) {
            if (sel[s] == e) {
                grp[lists + o] = s;
                o++;
            }
        }
    }
}
#endif
