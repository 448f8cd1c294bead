// y = W x for NCOLS activation rows in one pass over the weights.
// W: `rows` rows in a GGUF block format (FMT_*), read in place. x: [NCOLS][cols] f32 at
// x_stride. y: [NCOLS][...] f32 at y_stride, row r written at y_off + r.
// Tiers:
// - portable (the default): one workgroup per weight row; thread t takes 32-value units t,
//   t + WG, ... (load_unit), then a shared-memory tree reduction.
// - TIER_SG (subgroup arithmetic): one subgroup per weight row, RPW rows a workgroup (constant
//   2; the workgroup size is RPW x the device's subgroup size). Lane l takes 8-value pieces
//   l, l + S, l + 2S, ... (load8, S = gl_SubgroupSize), so a subgroup's loads are neighbouring
//   bytes; each lane sums its products in a fixed order, then subgroupAdd. Subgroups
//   beyond RPW (a device running narrower subgroups than it reports) take rows in turn.
// (Formats with an int8 canonical product take mv.comp in the token command instead.)
// EXPERT (with FORM_ONE, portable and subgroup tiers): the weights are a mixture-of-experts
// stack of experts of `rows` rows each; workgroup z is slot s, which reads expert sel[s]'s rows
// only, activation row s / x_div and writes output row s (y_stride apart). A slot's sum runs
// in the same order whatever slots share the dispatch.
// In all, each column's sum runs in the same order whatever NCOLS is, so an N-row result
// equals the row run alone.
// Forms: FORM_ONE (NCOLS = 1 at compile time) and the N-row form (NCOLS a specialization
// constant, 1..8).
#version 450
#extension GL_GOOGLE_include_directive : require
#ifdef TIER_SG
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#endif

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 64;
layout(constant_id = 1) const uint NCOLS_SC = 1;
#ifdef TIER_SG
layout(constant_id = 2) const uint RPW = 4;
#endif
#ifdef FORM_ONE
#define NCOLS 1u
#else
#define NCOLS NCOLS_SC
#endif
#define NMAX 8u

layout(std430, set = 0, binding = 0) readonly buffer Wt { uint WDATA[]; };
layout(std430, set = 0, binding = 1) readonly buffer X { float x[]; };
layout(std430, set = 0, binding = 2) writeonly buffer Y { float y[]; };
#ifdef EXPERT
layout(std430, set = 0, binding = 3) readonly buffer Sel { uint sel[]; };
#endif

layout(push_constant) uniform Push {
    uint rows;
    uint cols;
    uint row_bytes;
    uint x_stride;
    uint y_stride;
    uint y_off;
#ifdef EXPERT
    uint x_div;  // slots a row of activations (k for gate/up, 1 for down)
#endif
} p;

#define ROW_COLS p.cols   // formats.glsl: the device's Q8_0 rows hold their scales after the quants
#include "formats.glsl"

#ifdef EXPERT
#define EROW(row) (sel[gl_WorkGroupID.z] * p.rows + (row))
#define XAT(o) (gl_WorkGroupID.z / p.x_div * p.x_stride + (o))
#define YAT(o) (gl_WorkGroupID.z * p.y_stride + (o))
#else
#define EROW(row) (row)
#define XAT(o) (o)
#define YAT(o) (o)
#endif

#ifdef TIER_SG
void main() {
    uint wg = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
    uint lane = gl_SubgroupInvocationID;
    uint groups = p.cols / 8u;
    float v[8];
    // Every lane of a subgroup has the same row: the loop and the early exit are uniform
    // within it, and no barrier is used.
    for (uint k = gl_SubgroupID; k < RPW; k += gl_NumSubgroups) {
        uint row = wg * RPW + k;
        if (row >= p.rows) break;
        uint row_off = EROW(row) * p.row_bytes;
        precise float acc[NMAX];
        for (uint c = 0u; c < NMAX; c++) acc[c] = 0.0;
        for (uint g = lane; g < groups; g += gl_SubgroupSize) {
            load8(row_off, g, v);
            for (uint c = 0u; c < NCOLS; c++) {
                uint xo = XAT(c * p.x_stride + g * 8u);
                precise float s = 0.0;
                for (uint l = 0u; l < 8u; l++) s += v[l] * x[xo + l];
                acc[c] += s;
            }
        }
        for (uint c = 0u; c < NCOLS; c++) {
            float t = subgroupAdd(acc[c]);
            if (lane == 0u) y[YAT(c * p.y_stride + p.y_off + row)] = t;
        }
    }
}
#else
shared float red[NMAX * 256];

void main() {
    uint row = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
    if (row >= p.rows) return;
    uint t = gl_LocalInvocationID.x;
    precise float acc[NMAX];
    for (uint c = 0u; c < NMAX; c++) acc[c] = 0.0;
    uint units = p.cols / 32u;
    uint row_off = EROW(row) * p.row_bytes;
    float v[32];
    for (uint u = t; u < units; u += WG) {
        load_unit(row_off, u, v);
        for (uint c = 0u; c < NCOLS; c++) {
            uint xo = XAT(c * p.x_stride + u * 32u);
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
        for (uint c = 0u; c < NCOLS; c++) y[YAT(c * p.y_stride + p.y_off + row)] = red[c * WG];
    }
}
#endif
