// RMS norm of each row, with the residual add fused in front (FUSE_ADD):
//   x[r] += add[r] (written back), out[r] = x[r] / rms(x[r]) * w
// One workgroup a row.
// QACT: also write out rounded through 8-bit blocks (qact.comp's arithmetic, bit for bit) to
// q32 (blocks of 32, when QMASK & 1) and q256 (blocks of 256, when QMASK & 2), so the rounding
// needs no dispatch and barrier of its own. A thread takes whole blocks and recomputes their
// out values (the same precise expression); the row must hold whole blocks.
#version 450

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 64;

#ifdef QACT
layout(constant_id = 1) const uint QMASK = 3;
layout(std430, set = 0, binding = 0) coherent buffer X { float x[]; };
layout(std430, set = 0, binding = 4) writeonly buffer Q32 { float q32[]; };
layout(std430, set = 0, binding = 5) writeonly buffer Q256 { float q256[]; };
#else
layout(std430, set = 0, binding = 0) buffer X { float x[]; };
#endif
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
#ifdef QACT
    memoryBarrierBuffer();
#endif
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
#ifdef QACT
    for (uint k = 0u; k < 2u; k++) {
        uint qb = k == 0u ? 32u : 256u;
        if ((QMASK & (1u << k)) == 0u) continue;
        for (uint b = t; b < p.n / qb; b += WG) {
            uint o0 = base + b * qb;
            float amax = 0.0;
            for (uint i = 0u; i < qb; i++) {
                precise float o = (x[o0 + i] * scale) * w[b * qb + i];
                amax = max(amax, abs(o));
            }
            float d = amax / 127.0;
            float id = amax > 0.0 ? 127.0 / amax : 0.0;
            for (uint i = 0u; i < qb; i++) {
                precise float o = (x[o0 + i] * scale) * w[b * qb + i];
                precise float q = roundEven(o * id);
                precise float v = q * d;
                if (k == 0u) q32[o0 + i] = v; else q256[o0 + i] = v;
            }
        }
    }
#endif
}
