// x[r] = row `token(r)` of the embedding matrix (a GGUF block format) times `scale` (gemma:
// sqrt(n_embd); else 1), one workgroup a row.
// A matrix past the device's storage range is bound in parts: this dispatch holds rows
// row_start .. row_start + part_rows and writes only the rows whose token falls there.
#version 450
#extension GL_GOOGLE_include_directive : require

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 64;

layout(std430, set = 0, binding = 0) readonly buffer Wt { uint WDATA[]; };
layout(std430, set = 0, binding = 1) readonly buffer Meta { uint meta[]; };
layout(std430, set = 0, binding = 2) writeonly buffer X { float x[]; };

layout(push_constant) uniform Push {
    uint cols;
    uint row_bytes;
    uint row_start;
    uint part_rows;
    float scale;
} p;

#define ROW_COLS p.cols   // formats.glsl: the device's Q8_0 rows hold their scales after the quants
#include "formats.glsl"
#include "meta.glsl"

void main() {
    uint r = gl_WorkGroupID.x;
    uint token = meta[r * META_WORDS + META_TOKEN];
    if (token < p.row_start || token - p.row_start >= p.part_rows) return;
    uint row_off = (token - p.row_start) * p.row_bytes;
    float v[32];
    for (uint u = gl_LocalInvocationID.x; u < p.cols / 32u; u += WG) {
        load_unit(row_off, u, v);
        for (uint l = 0u; l < 32u; l++) {
            precise float s = v[l] * p.scale;
            x[r * p.cols + u * 32u + l] = s;
        }
    }
}
