// g <- silu(g) * u over `count` values; GELU: gelu_tanh(g) * u (common/act.glsl).
#version 450
#extension GL_GOOGLE_include_directive : require
#include "act.glsl"

layout(local_size_x = 256) in;

layout(std430, set = 0, binding = 0) buffer G { float g[]; };
layout(std430, set = 0, binding = 1) readonly buffer U { float u[]; };

layout(push_constant) uniform Push {
    uint count;
} p;

void main() {
    uint i = gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * gl_NumWorkGroups.x * 256u;
    if (i >= p.count) return;
    float a = g[i];
#ifdef GELU
    precise float s = gelu_tanh(a) * u[i];
#else
    precise float s = a / (1.0 + exp(-a)) * u[i];
#endif
    g[i] = s;
}
