// y = W x for NCOLS activation rows in one pass over the weights.
// W: `rows` rows in a GGUF block format (FMT_*), read in place. x: [NCOLS][cols] f32 at
// x_stride. y: [NCOLS][...] f32 at y_stride, row r written at y_off + r.
// One workgroup per weight row; thread t takes 32-value units t, t + WG, ...; each column's
// sum runs in the same order whatever NCOLS is, so an N-row result equals the row run alone.
// Forms: FORM_ONE (NCOLS = 1 at compile time) and the N-row form (NCOLS a specialization
// constant, 1..8).
#version 450
#extension GL_GOOGLE_include_directive : require

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 64;
layout(constant_id = 1) const uint NCOLS_SC = 1;
#ifdef FORM_ONE
#define NCOLS 1u
#else
#define NCOLS NCOLS_SC
#endif
#define NMAX 8u

layout(std430, set = 0, binding = 0) readonly buffer Wt { uint WDATA[]; };
layout(std430, set = 0, binding = 1) readonly buffer X { float x[]; };
layout(std430, set = 0, binding = 2) writeonly buffer Y { float y[]; };

layout(push_constant) uniform Push {
    uint rows;
    uint cols;
    uint row_bytes;
    uint x_stride;
    uint y_stride;
    uint y_off;
} p;

#include "formats.glsl"

shared float red[NMAX * 256];

void main() {
    uint row = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
    if (row >= p.rows) return;
    uint t = gl_LocalInvocationID.x;
    precise float acc[NMAX];
    for (uint c = 0u; c < NMAX; c++) acc[c] = 0.0;
    uint units = p.cols / 32u;
    uint row_off = row * p.row_bytes;
    float v[32];
    for (uint u = t; u < units; u += WG) {
        load_unit(row_off, u, v);
        for (uint c = 0u; c < NCOLS; c++) {
            uint xo = c * p.x_stride + u * 32u;
            precise float s = 0.0;
            for (uint l = 0u; l < 32u; l++) s += v[l] * x[xo + l];
            acc[c] += s;
        }
    }
    for (uint c = 0u; c < NCOLS; c++) red[c * WG + t] = acc[c];
    barrier();
    for (uint s = WG / 2u; s > 0u; s >>= 1) {
        if (t < s) {
            for (uint c = 0u; c < NCOLS; c++) {
                precise float r = red[c * WG + t] + red[c * WG + t + s];
                red[c * WG + t] = r;
            }
        }
        barrier();
    }
    if (t == 0u) {
        for (uint c = 0u; c < NCOLS; c++) y[c * p.y_stride + p.y_off + row] = red[c * WG];
    }
}
