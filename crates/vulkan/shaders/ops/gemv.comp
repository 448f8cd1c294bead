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
//   the float part (dot_term), a fixed-order sum per lane and row, subgroupAdd. DOT_HW uses OpSDot
//   (SPV_KHR_integer_dot_product through GL_EXT_spirv_intrinsics: glslang 13.1.1 has no
//   GL_EXT_integer_dot_product); without it the same integer math by bitfieldExtract.
// NORM_IN (TIER_DOT): the GEMV's input is the RMS norm of a residual row (x + add), which
// every workgroup first computes itself into the packed activations in shared memory
// (common/norm.glsl, bit for bit what rmsnorm.comp QPACK writes), so the norm needs no
// dispatch and barrier of its own; workgroup 0 also writes x + add (flags & 2). The
// workgroups then take their rows in turn (a grid smaller than the rows: fewer norms).
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
layout(constant_id = 5) const uint UNR = 1;
#endif
#ifdef FORM_ONE
#define NCOLS 1u
#else
#define NCOLS NCOLS_SC
#endif
#define NMAX 8u

layout(std430, set = 0, binding = 0) readonly buffer Wt { uint WDATA[]; };
#if defined(NORM_IN)
layout(std430, set = 0, binding = 1) readonly buffer NX { float nx[]; };
layout(std430, set = 0, binding = 2) writeonly buffer Y { float y[]; };
layout(std430, set = 0, binding = 3) readonly buffer NAdd { float nadd[]; };
layout(std430, set = 0, binding = 4) readonly buffer NW { float nw[]; };
layout(std430, set = 0, binding = 5) writeonly buffer NXO { float nxo[]; };
// Words of the packed activations (gemv_dot.rs QPack over NCOLS x cols values).
layout(constant_id = 4) const uint XPW = 1;
shared uint xp[XPW];
#define np32 xp
#define np256 xp
#define QMASK (XBLOCK == 32u ? 1u : 2u)
#define NORM_SHARED
#define QACT
#define QPACK
#define NORM_ADD ((p.flags & 1u) != 0u)
#define NORM_WRITE ((p.flags & 2u) != 0u && gl_WorkGroupID.x == 0u && gl_WorkGroupID.y == 0u)
#define NORM_MAXCH 512u   // chunks a row: cols <= 4096 (checked on the host)
shared float red[256];
shared float pm[NORM_MAXCH];
shared int ps[NORM_MAXCH];
#else
#ifdef TIER_DOT
layout(std430, set = 0, binding = 1) readonly buffer X { uint xp[]; };
#else
layout(std430, set = 0, binding = 1) readonly buffer X { float x[]; };
#endif
layout(std430, set = 0, binding = 2) writeonly buffer Y { float y[]; };
#endif

layout(push_constant) uniform Push {
    uint rows;
    uint cols;
    uint row_bytes;
    uint x_stride;
    uint y_stride;
    uint y_off;
#ifdef TIER_DOT
    uint d_off;  // word offset of the d_x floats in xp
    uint s_off;  // word offset of the int sums in xp
#endif
#ifdef NORM_IN
    float eps;
    uint count;  // values packed (NCOLS * cols): the layout's offsets
    uint flags;  // 1: add nadd to nx; 2: workgroup 0 writes the sum to nxo
#endif
} p;

#include "formats.glsl"
#ifdef TIER_DOT
#include "dotfmt.glsl"
#endif
#ifdef NORM_IN
#include "norm.glsl"
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
        uint row_off = row * p.row_bytes;
        precise float acc[NMAX];
        for (uint c = 0u; c < NMAX; c++) acc[c] = 0.0;
        for (uint g = lane; g < groups; g += gl_SubgroupSize) {
            load8(row_off, g, v);
            for (uint c = 0u; c < NCOLS; c++) {
                uint xo = c * p.x_stride + g * 8u;
                precise float s = 0.0;
                for (uint l = 0u; l < 8u; l++) s += v[l] * x[xo + l];
                acc[c] += s;
            }
        }
        for (uint c = 0u; c < NCOLS; c++) {
            float t = subgroupAdd(acc[c]);
            if (lane == 0u) y[c * p.y_stride + p.y_off + row] = t;
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
#ifdef NORM_IN
    for (uint c = 0u; c < NCOLS; c++) norm_row(c, gl_LocalInvocationIndex, p.cols, p.eps, p.count);
    barrier();
#endif
    // Workgroup g takes row groups g, g + groups, ... (one where the grid covers the rows).
    uint groups = gl_NumWorkGroups.x * gl_NumWorkGroups.y;
    for (uint g = wg; g * RPW * SGR < p.rows; g += groups) {
        // Subgroup k takes SGR neighbouring rows together: each activation unit is loaded once
        // for all of them (an N-row pass reads N units a weight unit).
        for (uint k = gl_SubgroupID; k < RPW; k += gl_NumSubgroups) {
            uint row0 = (g * RPW + k) * SGR;
            if (row0 >= p.rows) break;
            uint nr = min(SGR, p.rows - row0);
            precise float acc[SGR_MAX][NMAX];
            for (uint r = 0u; r < SGR_MAX; r++)
                for (uint c = 0u; c < NMAX; c++) acc[r][c] = 0.0;
            for (uint u0 = lane; u0 < units; u0 += gl_SubgroupSize * UNR) {
                // Slot k * SGR + r: unit u0 + k S of row r.
                for (uint k = 0u; k < UNR; k++) {
                    uint u = u0 + k * gl_SubgroupSize;
                    for (uint r = 0u; r < SGR; r++)
                        if (r < nr && u < units) dot_load((row0 + r) * p.row_bytes, u, qw[k * SGR + r], wf[k * SGR + r], wi[k * SGR + r]);
                }
                for (uint k = 0u; k < UNR; k++) {
                    uint u = u0 + k * gl_SubgroupSize;
                    if (u >= units) break;
                    for (uint c = 0u; c < NCOLS; c++) {
                        XUnit x = x_unit(c * p.x_stride + u * 32u);
                        for (uint r = 0u; r < SGR; r++) {
                            if (r < nr) {
                                precise float t = dot_term(qw[k * SGR + r], wf[k * SGR + r], wi[k * SGR + r], x);
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
                    if (lane == 0u) y[c * p.y_stride + p.y_off + row0 + r] = t;
                }
            }
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
#endif
