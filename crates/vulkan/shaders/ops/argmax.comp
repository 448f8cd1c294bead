// ids[r] = the index of the largest logit of row r (ties: the lowest index; NaN ignored).
#version 450

layout(local_size_x = 256) in;

layout(std430, set = 0, binding = 0) readonly buffer L { float logits[]; };
layout(std430, set = 0, binding = 1) writeonly buffer Ids { uint ids[]; };

layout(push_constant) uniform Push {
    uint n;
} p;

shared float bv[256];
shared uint bi[256];

void main() {
    uint r = gl_WorkGroupID.x;
    uint t = gl_LocalInvocationID.x;
    float best = -1.0 / 0.0;
    uint idx = 0xFFFFFFFFu;
    for (uint i = t; i < p.n; i += 256u) {
        float v = logits[r * p.n + i];
        if (v > best || (idx == 0xFFFFFFFFu && !isnan(v))) { best = v; idx = i; }
    }
    bv[t] = best;
    bi[t] = idx;
    barrier();
    for (uint s = 128u; s > 0u; s >>= 1) {
        if (t < s) {
            float ov = bv[t + s];
            uint oi = bi[t + s];
            if (oi != 0xFFFFFFFFu && (bi[t] == 0xFFFFFFFFu || ov > bv[t] || (ov == bv[t] && oi < bi[t]))) {
                bv[t] = ov;
                bi[t] = oi;
            }
        }
        barrier();
    }
    if (t == 0u) ids[r] = bi[0];
}
