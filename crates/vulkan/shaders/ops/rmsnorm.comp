// RMS norm of each row, one workgroup a row (common/norm.glsl), with the residual add fused
// in front (FUSE_ADD): x[r] += add[r] (written back), out[r] = x[r] / rms(x[r]) * w.
// QACT: also write out rounded through 8-bit blocks (qact.comp's arithmetic, bit for bit) to
// q32 (blocks of 32, when QMASK & 1) and q256 (blocks of 256, when QMASK & 2), so the
// rounding needs no dispatch and barrier of its own.
#version 450
#extension GL_GOOGLE_include_directive : require

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 256;

#ifdef QACT
layout(constant_id = 1) const uint QMASK = 3;
layout(std430, set = 0, binding = 4) writeonly buffer Q32 { float nq32[]; };
layout(std430, set = 0, binding = 5) writeonly buffer Q256 { float nq256[]; };
layout(std430, set = 0, binding = 4) writeonly buffer Q32v { vec4 nq32_4[]; };
layout(std430, set = 0, binding = 5) writeonly buffer Q256v { vec4 nq256_4[]; };
shared float pm[2048];
#endif
layout(std430, set = 0, binding = 0) buffer X { float nx[]; };
layout(std430, set = 0, binding = 1) readonly buffer Add { float nadd[]; };
layout(std430, set = 0, binding = 2) readonly buffer Wn { float nw[]; };
layout(std430, set = 0, binding = 3) writeonly buffer Out { float nout[]; };
// The same buffers 16 bytes a load or store, where a row is whole chunks of 8 values (every
// binding starts 16-byte aligned): a subgroup's accesses then touch a quarter of the memory
// sectors one float at a time did (norm.glsl).
layout(std430, set = 0, binding = 0) buffer X4 { vec4 nx4[]; };
layout(std430, set = 0, binding = 1) readonly buffer Add4 { vec4 nadd4[]; };
layout(std430, set = 0, binding = 2) readonly buffer Wn4 { vec4 nw4[]; };
layout(std430, set = 0, binding = 3) writeonly buffer Out4 { vec4 nout4[]; };

layout(push_constant) uniform Push {
    uint n;
    float eps;
} p;

shared float red[256];

#include "norm.glsl"

void main() {
    norm_row(gl_WorkGroupID.x, gl_LocalInvocationID.x, p.n, p.eps);
}
