// Merge the key pieces of decode attention (common/combine.glsl) as a dispatch of its own:
// workgroup (head group, row). attn.comp COMBINE runs the same merge in its last workgroup.
#version 450
#extension GL_GOOGLE_include_directive : require

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 64;
layout(constant_id = 1) const uint QB = 32;

layout(std430, set = 0, binding = 0) readonly buffer Part { float part[]; };
layout(std430, set = 0, binding = 1) readonly buffer Meta { uint meta[]; };
layout(std430, set = 0, binding = 2) writeonly buffer Out { float outv[]; };
#ifdef QPACK
layout(std430, set = 0, binding = 3) writeonly buffer Packed { uint pk[]; };
#elif defined(QACT)
layout(std430, set = 0, binding = 3) writeonly buffer Rounded { float y[]; };
#endif

layout(push_constant) uniform Push {
    uint n_head;
    uint head_dim;
    uint heads;   // heads a workgroup (1 without QACT)
    uint count;   // values of the pass (rows * n_head * head_dim): the packed layout's offsets
    uint key_window;   // a sliding-window layer's keys a row (0: all), as the attention's
} p;

#include "meta.glsl"
#include "combine.glsl"

void main() {
    combine(gl_WorkGroupID.y, gl_WorkGroupID.x, gl_LocalInvocationID.x);
}
