// dst row j = src row list[1 + j], for j < list[0]: the whole logits rows a top step reads back
// for the streams that need them (src/kernels.rs `rows_copy`), recorded once with the step and
// steered by the list the host writes before each submit. Workgroup (slice, j) copies values
// slice * 256 + t, + SLICES * 256, ... of its row (coalesced); a slot past the count, or an
// index past the source's rows, copies nothing.
#version 450

layout(local_size_x = 256) in;
#define SLICES 64u

layout(std430, set = 0, binding = 0) readonly buffer Src { float src[]; };
layout(std430, set = 0, binding = 1) readonly buffer List { uint list[]; };
layout(std430, set = 0, binding = 2) writeonly buffer Dst { float dst[]; };

layout(push_constant) uniform Push {
    uint n;    // values a row
    uint rows; // rows of src
} p;

void main() {
    uint j = gl_WorkGroupID.y;
    if (j >= list[0]) return;
    uint r = list[1u + j];
    if (r >= p.rows) return;
    for (uint i = gl_WorkGroupID.x * 256u + gl_LocalInvocationID.x; i < p.n; i += SLICES * 256u) {
        dst[j * p.n + i] = src[r * p.n + i];
    }
}
