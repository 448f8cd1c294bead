// RMS norm of each row, with the residual add fused in front (FUSE_ADD):
//   x[r] += add[r] (written back), out[r] = x[r] / rms(x[r]) * w
// One workgroup a row.
#version 450

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 64;

layout(std430, set = 0, binding = 0) buffer X { float x[]; };
layout(std430, set = 0, binding = 1) readonly buffer Add { float add[]; };
layout(std430, set = 0, binding = 2) readonly buffer Wn { float w[]; };
layout(std430, set = 0, binding = 3) writeonly buffer Out { float outv[]; };

layout(push_constant) uniform Push {
    uint n;
    float eps;
} p;

shared float red[256];

void main() {
    uint r = gl_WorkGroupID.x;
    uint t = gl_LocalInvocationID.x;
    uint base = r * p.n;
    precise float ss = 0.0;
    for (uint i = t; i < p.n; i += WG) {
#ifdef FUSE_ADD
        precise float v = x[base + i] + add[base + i];
        x[base + i] = v;
#else
        float v = x[base + i];
#endif
        ss += v * v;
    }
    red[t] = ss;
    barrier();
    for (uint s = WG / 2u; s > 0u; s >>= 1) {
        if (t < s) red[t] = red[t] + red[t + s];
        barrier();
    }
    float scale = 1.0 / sqrt(red[0] / float(p.n) + p.eps);
    for (uint i = t; i < p.n; i += WG) {
        precise float o = (x[base + i] * scale) * w[i];
        outv[base + i] = o;
    }
}
