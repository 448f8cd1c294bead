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
// - TIER_DOT (int8 dot product; src/gemv_dot.rs): TIER_SG's shape, but x is the packed int8
//   activations of qact.comp's QPACK form (quants, block scales d_x, int sums of each 32 or
//   16 quants) and lane l takes 32-value units l, l + S, ... of SGR neighbouring rows: per
//   unit the weight quants are packed as int8 (dot_load), the unit's activations loaded
//   once for the SGR rows (x_unit), an exact integer dot with the activation quants, then
//   the float part (dot_term), a fixed-order sum per lane and row, subgroupAdd (with KS > 1
//   the units of a row split over KS subgroups, their sums added in order). DOT_HW uses OpSDot
//   (SPV_KHR_integer_dot_product through GL_EXT_spirv_intrinsics: glslang 13.1.1 has no
//   GL_EXT_integer_dot_product); without it the same integer math by bitfieldExtract.
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
#if defined(TIER_SG) || defined(TIER_DOT)
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#endif
#ifdef DOT_HW
#extension GL_EXT_spirv_intrinsics : require
#endif

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 64;
layout(constant_id = 1) const uint NCOLS_SC = 1;
#if defined(TIER_SG) || defined(TIER_DOT)
layout(constant_id = 2) const uint RPW = 4;
#endif
#ifdef TIER_DOT
// Rows a subgroup takes together (1..SGR_MAX); a workgroup takes RPW x SGR rows.
layout(constant_id = 3) const uint SGR = 1;
#define SGR_MAX 4u
// Units a lane loads before it computes (UNR x SGR <= SGR_MAX): more bytes in flight a lane
// where few rows a subgroup leave it few loads (a lane's units still add up in order).
layout(constant_id = 4) const uint UNR = 1;
// Subgroups a row group's units are split over (1, 2 or 4, dividing RPW): subgroup k takes
// units of slice k % KS of row group k / KS, and the KS sums of a row are added in slice
// order through shared memory (more subgroups at work where a matrix has few rows).
layout(constant_id = 5) const uint KS = 1;
#endif
#ifdef FORM_ONE
#define NCOLS 1u
#else
#define NCOLS NCOLS_SC
#endif
#define NMAX 8u
#ifdef TIER_DOT
shared float kpart[RPW * SGR_MAX * NMAX];   // [subgroup][row][column] slice sums (KS > 1)
#endif

layout(std430, set = 0, binding = 0) readonly buffer Wt { uint WDATA[]; };
#ifdef TIER_DOT
layout(std430, set = 0, binding = 1) readonly buffer X { uint xp[]; };
// The same bindings read 16 bytes at a time (dotfmt.glsl: activation units, K-quant quants).
layout(std430, set = 0, binding = 1) readonly buffer X4 { uvec4 xp4[]; };
layout(std430, set = 0, binding = 0) readonly buffer Wt4 { uvec4 WDATA4[]; };
#else
layout(std430, set = 0, binding = 1) readonly buffer X { float x[]; };
#endif
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
#ifdef TIER_DOT
    uint d_off;  // word offset of the d_x floats in xp
    uint s_off;  // word offset of the int sums in xp
#endif
} p;

#define ROW_COLS p.cols   // formats.glsl: the device's Q8_0 rows hold their scales after the quants
#include "formats.glsl"
#ifdef TIER_DOT
#include "dotfmt.glsl"
#endif

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
#elif defined(TIER_DOT)
void main() {
    uint wg = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
    uint lane = gl_SubgroupInvocationID;
    uint units = p.cols / 32u;
    uint qw[SGR_MAX][8];
    vec2 wf[SGR_MAX];
    ivec2 wi[SGR_MAX];
    // Workgroup g takes row groups g, g + groups, ... (one where the grid covers the rows).
    uint groups = gl_NumWorkGroups.x * gl_NumWorkGroups.y;
    uint rgs = RPW / KS;   // row groups a workgroup
    uint ustep = gl_SubgroupSize * KS;
    for (uint g = wg; g * rgs * SGR < p.rows; g += groups) {
        // Subgroup k takes SGR neighbouring rows together: each activation unit is loaded once
        // for all of them (an N-row pass reads N units a weight unit).
        for (uint k = gl_SubgroupID; k < RPW; k += gl_NumSubgroups) {
            uint row0 = (g * rgs + k / KS) * SGR;
            if (row0 >= p.rows) break;
            uint nr = min(SGR, p.rows - row0);
            precise float acc[SGR_MAX][NMAX];
            for (uint r = 0u; r < SGR_MAX; r++)
                for (uint c = 0u; c < NMAX; c++) acc[r][c] = 0.0;
            for (uint u0 = lane + (k % KS) * gl_SubgroupSize; u0 < units; u0 += ustep * UNR) {
                // Slot j * SGR + r: unit u0 + j * ustep of row r.
                for (uint j = 0u; j < UNR; j++) {
                    uint u = u0 + j * ustep;
                    for (uint r = 0u; r < SGR; r++)
                        if (r < nr && u < units) dot_load((row0 + r) * p.row_bytes, u, qw[j * SGR + r], wf[j * SGR + r], wi[j * SGR + r]);
                }
                for (uint j = 0u; j < UNR; j++) {
                    uint u = u0 + j * ustep;
                    if (u >= units) break;
                    for (uint c = 0u; c < NCOLS; c++) {
                        XUnit x = x_unit(c * p.x_stride + u * 32u);
                        for (uint r = 0u; r < SGR; r++) {
                            if (r < nr) {
                                precise float t = dot_term(qw[j * SGR + r], wf[j * SGR + r], wi[j * SGR + r], x);
                                acc[r][c] += t;
                            }
                        }
                    }
                }
            }
            for (uint r = 0u; r < SGR_MAX; r++) {
                if (r >= nr) break;
                for (uint c = 0u; c < NCOLS; c++) {
                    float t = subgroupAdd(acc[r][c]);
                    if (lane != 0u) continue;
                    if (KS == 1u) {
                        y[c * p.y_stride + p.y_off + row0 + r] = t;
                    } else {
                        kpart[(k * SGR_MAX + r) * NMAX + c] = t;
                    }
                }
            }
        }
        if (KS > 1u) {
            barrier();
            for (uint e = gl_LocalInvocationIndex; e < rgs * SGR * NCOLS; e += WG) {
                uint rg = e / (SGR * NCOLS);
                uint r = (e / NCOLS) % SGR;
                uint c = e % NCOLS;
                uint row = (g * rgs + rg) * SGR + r;
                if (row >= p.rows) continue;
                precise float sum = 0.0;
                for (uint sl = 0u; sl < KS; sl++) sum += kpart[((rg * KS + sl) * SGR_MAX + r) * NMAX + c];
                y[c * p.y_stride + p.y_off + row] = sum;
            }
            barrier();   // kpart is read before a next row group writes it
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
