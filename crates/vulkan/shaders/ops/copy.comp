// dst = src, n 16-byte words: the yardstick the matrix stages' bandwidth is held against
// (src/kernels.rs `copy16`, `Profile::copy_bandwidth`): each invocation loads 4 words of
// 16 bytes, strided across the grid so every load of a subgroup is coalesced, before it
// stores any, as a bandwidth-bound kernel keeps its loads in flight.
#version 450

layout(local_size_x = 256) in;

layout(std430, set = 0, binding = 0) readonly buffer Src { uvec4 src[]; };
layout(std430, set = 0, binding = 1) writeonly buffer Dst { uvec4 dst[]; };

layout(push_constant) uniform Push {
    uint n; // 16-byte words
} p;

void main() {
    uint stride = gl_NumWorkGroups.x * 256u;
    uint i = gl_WorkGroupID.x * 256u + gl_LocalInvocationID.x;
    for (; i + 3u * stride < p.n; i += 4u * stride) {
        uvec4 a = src[i];
        uvec4 b = src[i + stride];
        uvec4 c = src[i + 2u * stride];
        uvec4 d = src[i + 3u * stride];
        dst[i] = a;
        dst[i + stride] = b;
        dst[i + 2u * stride] = c;
        dst[i + 3u * stride] = d;
    }
    for (; i < p.n; i += stride) {
        dst[i] = src[i];
    }
}
