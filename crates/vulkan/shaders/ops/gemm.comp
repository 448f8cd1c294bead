// The prefill GEMM: y = W x for n activation rows (any n >= 1), the GEMV's semantics:
//   y[c * y_stride + y_off + r] = sum_j W[r][j] * x[c * x_stride + j]   (r < rows, c < n)
// W: `rows` rows in a GGUF block format (FMT_*), read in place through formats.glsl's
// load_unit. x, y: f32. cols a multiple of 32 (256 for K-quants).
//
// A workgroup owns a tile of BM weight rows x BN activation rows and walks K in steps of 32
// values (the coopmat tier: KU x 32): each step dequantizes the tile's weights into shared
// memory once, stages the activations beside them, then multiplies. Grid: x = weight-row
// tiles, y = activation-row tiles, z = K pieces. Edges (rows, n not multiples of the tile; a
// last K step past the row's or the piece's end) read zeros and write nothing.
//
// Split K (p.pieces > 1, chosen by the host from the matrix's shape alone, never from n, so a
// row's result does not depend on the rows beside it): workgroup z walks units
// [z * upp, (z + 1) * upp) and writes its tile's partial sums to `part`; the workgroup that
// finishes a tile's pieces last (counted in `done`, set back to zero after) adds them in
// piece order 0, 1, ... and writes y. A matrix of few weight-row tiles (a wide step's or a
// small model's) then spreads over enough workgroups to fill the device.
//
// Two tiers from this one body:
// - the portable tier (default): f32 in shared memory (BK*(BM+BN)*4, at most 16 KiB), 128
//   threads, each accumulating a TM x TN register block in f32 (BN 8..64: specialization
//   constant 0). A thread's weight rows and activation rows are neighbours, and the staged
//   weights hold four values of K a vector, so its shared reads are 16-byte vectors (a
//   software device such as lavapipe does each shared access lane by lane). Runs on every
//   Vulkan 1.1 device.
// - COOPMAT (GL_KHR_cooperative_matrix, compiled for vulkan1.3): weights dequantized to f16
//   and activations converted to f16 (both clamped to +-65504) in shared memory, rows padded
//   against bank conflicts; KU units a K step (specialization constant 1), the weights read
//   by 32-value units (load_unit: a block's scales read once a unit, neighbouring threads on
//   neighbouring units of a row), the activations 4 values a load; 16x16x16
//   f16 x f16 -> f32 tiles. The workgroup is WG threads (specialization constant 0, meant to
//   be a subgroup a region); each subgroup owns a 32x32 region (2x2 accumulators) of the
//   64 x BN tile (BN 64 or 128: specialization constant 2).
//   With fewer subgroups than regions the K walk repeats until every region is done, so the
//   result never depends on the subgroup size the driver picks, nor on KU.
#version 450
#extension GL_GOOGLE_include_directive : require
#ifdef COOPMAT
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_shader_subgroup_basic : require
#endif

#define BM 64u
#define BK 32u

#ifdef COOPMAT
layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 128;
layout(constant_id = 1) const uint KU = 2;      // 32-value units a K step (1, 2 or 4)
// 32-row regions of activation rows a tile (2 or 4): BN = 32 RN, a region a subgroup. The
// wider tile dequantizes each weight unit once for twice the activation rows (gemm.rs
// coopmat_tile_n chooses it for passes of more than 64 rows).
layout(constant_id = 2) const uint RN = 2;
#define BN (32u * RN)
#else
// Activation rows a thread (1, 2, 4 or 8): BN = 8 TN, the pass's rows rounded up to a power
// of two (gemm.rs tiled_tile_n), so a short window does not multiply a 64-row tile of zeros.
// Each output's sum runs over K in the same order whatever the tile, so the bits do not
// depend on it.
layout(constant_id = 0) const uint TN = 8;
#define BN (8u * TN)
#define TM 4u                                   // weight rows a thread
#define THREADS ((BM / TM) * (BN / TN))         // 128
layout(local_size_x = 128) in;
#endif

layout(std430, set = 0, binding = 0) readonly buffer Wt { uint WDATA[]; };
// The same weights 16 bytes a load where a format's blocks allow (formats.glsl load_unit;
// the host binds W 16-byte aligned).
layout(std430, set = 0, binding = 0) readonly buffer Wt4 { uvec4 WDATA4[]; };
#define HAVE_WDATA4
#ifdef COOPMAT
// Read 4 values at a time: the host binds x 16-byte aligned with x_stride a multiple of 4.
layout(std430, set = 0, binding = 1) readonly buffer X { vec4 x4[]; };
#else
layout(std430, set = 0, binding = 1) readonly buffer X { float x[]; };
#endif
layout(std430, set = 0, binding = 2) writeonly buffer Y { float y[]; };
// Split K: [piece][tile][activation row of the tile][weight row of the tile] partial sums, and
// the pieces finished a tile (read and written across workgroups: coherent).
layout(std430, set = 0, binding = 3) coherent buffer Part { float part[]; };
layout(std430, set = 0, binding = 4) coherent buffer Done { uint done_wgs[]; };

layout(push_constant) uniform Push {
    uint rows;
    uint cols;
    uint row_bytes;
    uint x_stride;
    uint y_stride;
    uint y_off;
    uint n;
    uint upp;      // 32-value units a K piece
    uint pieces;
} p;

#define ROW_COLS p.cols   // formats.glsl: the device's Q8_0 rows hold their scales after the quants
#include "formats.glsl"

#define TILE (BM * BN)
#include "last_wg.glsl"

// The tile's offset in `part` for piece z.
uint part_base(uint z) {
    uint tiles = gl_NumWorkGroups.x * gl_NumWorkGroups.y;
    return (z * tiles + gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * TILE;
}

// After a workgroup wrote its piece of the tile to `part`: the last one to finish adds the
// pieces in order and writes y. Every thread of the workgroup calls it (barriers).
void finish_split(uint r0, uint c0, uint t, uint nthreads) {
    uint tile = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    if (!finishes_last(tile, p.pieces, t)) return;
    for (uint e = t; e < TILE; e += nthreads) {
        uint r = r0 + e % BM;
        uint c = c0 + e / BM;
        precise float s = 0.0;
        for (uint z = 0u; z < p.pieces; z++) s = s + part[part_base(z) + e];
        if (r < p.rows && c < p.n) y[c * p.y_stride + p.y_off + r] = s;
    }
}

#ifndef COOPMAT
// ---------------------------------------------------------------- portable tier
shared vec4 ws4[BK / 4u * BM];   // [k / 4][weight row]: k % 4 in the vector
shared vec4 xs4[BK * BN / 4u];   // [k][activation row]

void main() {
    uint tile_m = gl_WorkGroupID.x;
    if (tile_m * BM >= p.rows) return;          // whole workgroup: no barrier is skipped by part of it
    uint r0 = tile_m * BM;
    uint c0 = gl_WorkGroupID.y * BN;
    uint t = gl_LocalInvocationID.x;
    uint tr = t % (BM / TM);                    // rows tr * TM + i
    uint tc = t / (BM / TM);                    // activation rows tc * TN + j
    float acc[TM][TN];
    for (uint i = 0u; i < TM; i++)
        for (uint j = 0u; j < TN; j++) acc[i][j] = 0.0;
    uint units = p.cols / 32u;
    uint u_lo = gl_WorkGroupID.z * p.upp;
    uint u_hi = min(units, u_lo + p.upp);
    float v[32];
    for (uint u = u_lo; u < u_hi; u++) {
        // Threads 0..BM-1 dequantize one weight row's unit each; the rest stage activations.
        if (t < BM) {
            uint r = r0 + t;
            if (r < p.rows) {
                load_unit(r * p.row_bytes, u, v);
            } else {
                for (uint l = 0u; l < 32u; l++) v[l] = 0.0;
            }
            for (uint q = 0u; q < 8u; q++) ws4[q * BM + t] = vec4(v[4u * q], v[4u * q + 1u], v[4u * q + 2u], v[4u * q + 3u]);
        } else {
            // Four activation rows' values of one k a store (BN is 8 or more).
            for (uint e = t - BM; e < BN / 4u * BK; e += THREADS - BM) {
                uint c = e / BK * 4u;
                uint l = e % BK;
                vec4 xv;
                for (uint i = 0u; i < 4u; i++) {
                    uint cc = c0 + c + i;
                    xv[i] = cc < p.n ? x[cc * p.x_stride + u * 32u + l] : 0.0;
                }
                xs4[(l * BN + c) / 4u] = xv;
            }
        }
        barrier();
        for (uint q = 0u; q < BK / 4u; q++) {
            vec4 a[TM];
            for (uint i = 0u; i < TM; i++) a[i] = ws4[q * BM + tr * TM + i];
            for (uint kk = 0u; kk < 4u; kk++) {
                uint l = 4u * q + kk;
                float b[TN];
                if (TN >= 4u) {
                    for (uint j = 0u; j < TN; j += 4u) {
                        vec4 bv = xs4[(l * BN + tc * TN + j) / 4u];
                        b[j] = bv.x;
                        b[j + 1u] = bv.y;
                        b[j + 2u] = bv.z;
                        b[j + 3u] = bv.w;
                    }
                } else {
                    // A quarter or half of a vec4: selects, not a dynamic component index
                    // (b[1u % TN]: an index in range even at TN 1, where it is never taken).
                    vec4 bv = xs4[(l * BN + tc * TN) / 4u];
                    uint o = (tc * TN) % 4u;
                    vec2 h = o >= 2u ? bv.zw : bv.xy;
                    if (TN == 2u) {
                        b[0] = h.x;
                        b[1u % TN] = h.y;
                    } else {
                        b[0] = (o & 1u) == 1u ? h.y : h.x;
                    }
                }
                for (uint i = 0u; i < TM; i++)
                    for (uint j = 0u; j < TN; j++) acc[i][j] += a[i][kk] * b[j];
            }
        }
        barrier();
    }
    if (p.pieces > 1u) {
        uint pb = part_base(gl_WorkGroupID.z);
        for (uint j = 0u; j < TN; j++)
            for (uint i = 0u; i < TM; i++) part[pb + (tc * TN + j) * BM + tr * TM + i] = acc[i][j];
        finish_split(r0, c0, t, THREADS);
        return;
    }
    for (uint j = 0u; j < TN; j++) {
        uint c = c0 + tc * TN + j;
        if (c >= p.n) continue;
        for (uint i = 0u; i < TM; i++) {
            uint r = r0 + tr * TM + i;
            if (r < p.rows) y[c * p.y_stride + p.y_off + r] = acc[i][j];
        }
    }
}

#else
// ---------------------------------------------------------------- cooperative-matrix tier
#define CM 16u
#define NREG (2u * RN)                           // 32x32 regions of the 64 x BN tile
#define F16MAX 65504.0
#define CBK (KU * 32u)                           // values a K step
// Shared rows are CBK + 8 halves (144 bytes) apart: the 8 rows of a cooperative load's phase
// then fall on different banks (at 128 bytes they would all hit the same four). Held as
// f16vec4, so a thread stores its 8 weights or 4 activations in one or two writes.
#define ST4 ((CBK + 8u) / 4u)                    // a row's stride in f16vec4
shared f16vec4 wsh[BM * ST4];                    // [weight row][k], row-major A
shared f16vec4 xsh[BN * ST4];                    // [activation row][k], column-major B
shared float stage[NREG * CM * CM];              // one 16x16 accumulator per region, on its way out

#define ACC coopmat<float, gl_ScopeSubgroup, CM, CM, gl_MatrixUseAccumulator>
#define MATA coopmat<float16_t, gl_ScopeSubgroup, CM, CM, gl_MatrixUseA>
#define MATB coopmat<float16_t, gl_ScopeSubgroup, CM, CM, gl_MatrixUseB>

// A K step's global reads go to registers (fetch), all of a thread's loads out at once, then
// to shared memory (stash). A thread takes weight units t, t + WG, ... (at most MAXWT, 32
// values each) and activation quads likewise (at most MAXXP): the host keeps BN * KU * 8 <= 16 WG
// so both fit. (Fetching the next step while this one multiplies lost: the registers it holds
// cost occupancy; docs/lessons.md.)
#define MAXWT 2u
#define MAXXP 16u
f16vec4 wreg[MAXWT * 8u];
f16vec4 xreg[MAXXP];

void fetch(uint u0, uint r0, uint c0, uint t, uint units) {   // units: the piece's end
    for (uint i = 0u; i < MAXWT; i++) {
        uint e = t + i * WG;
        if (e >= BM * KU) break;
        // Weights: unit e % KU of tile row e / KU (load_unit: a block's scales read once for
        // its 32 values), so neighbouring threads read neighbouring units of a row; units
        // past the row's end read as zeros.
        uint r = r0 + e / KU;
        uint k = e % KU;
        float v[32];
        for (uint l = 0u; l < 32u; l++) v[l] = 0.0;
        if (r < p.rows && u0 + k < units) load_unit(r * p.row_bytes, u0 + k, v);
        for (uint j = 0u; j < 8u; j++)
            wreg[8u * i + j] = f16vec4(clamp(vec4(v[4u * j], v[4u * j + 1u], v[4u * j + 2u], v[4u * j + 3u]), -F16MAX, F16MAX));
    }
    for (uint i = 0u; i < MAXXP; i++) {
        uint e = t + i * WG;
        if (e >= BN * CBK / 4u) break;
        // Activations: 4 neighbouring values of an activation row.
        uint c = e / (CBK / 4u);
        uint l = (e % (CBK / 4u)) * 4u;
        uint cc = c0 + c;
        vec4 xv = vec4(0.0);
        if (cc < p.n && u0 * 32u + l < units * 32u) {
            xv = x4[(cc * p.x_stride + u0 * 32u + l) / 4u];
        }
        xreg[i] = f16vec4(clamp(xv, -F16MAX, F16MAX));
    }
}

void stash(uint t) {
    for (uint i = 0u; i < MAXWT; i++) {
        uint e = t + i * WG;
        if (e >= BM * KU) break;
        for (uint j = 0u; j < 8u; j++) wsh[(e / KU) * ST4 + (e % KU) * 8u + j] = wreg[8u * i + j];
    }
    for (uint i = 0u; i < MAXXP; i++) {
        uint e = t + i * WG;
        if (e >= BN * CBK / 4u) break;
        xsh[(e / (CBK / 4u)) * ST4 + e % (CBK / 4u)] = xreg[i];
    }
}

// Write accumulator `a` (weight rows r, activation rows c of its 16x16 block, tile at r0,
// c0) through the region's staging slot: to y, edges dropped, or with split K to the tile's
// piece in `part`. Subgroup-uniform control flow.
void write_out(ACC a, uint slot, uint r, uint c, uint r0, uint c0) {
    coopMatStore(a, stage, slot * CM * CM, CM, gl_CooperativeMatrixLayoutColumnMajor);
    subgroupMemoryBarrierShared();
    subgroupBarrier();
    uint pb = part_base(gl_WorkGroupID.z);
    for (uint e = gl_SubgroupInvocationID; e < CM * CM; e += gl_SubgroupSize) {
        uint rr = r + e % CM;
        uint cc = c + e / CM;
        if (p.pieces > 1u) part[pb + (cc - c0) * BM + rr - r0] = stage[slot * CM * CM + e];
        else if (rr < p.rows && cc < p.n) y[cc * p.y_stride + p.y_off + rr] = stage[slot * CM * CM + e];
    }
    subgroupMemoryBarrierShared();
    subgroupBarrier();
}

void main() {
    uint tile_m = gl_WorkGroupID.x;
    if (tile_m * BM >= p.rows) return;
    uint r0 = tile_m * BM;
    uint c0 = gl_WorkGroupID.y * BN;
    uint t = gl_LocalInvocationIndex;
    uint sg = gl_SubgroupID;
    uint ns = gl_NumSubgroups;
    uint u_lo = gl_WorkGroupID.z * p.upp;
    uint units = min(p.cols / 32u, u_lo + p.upp);   // this piece's end
    for (uint base = 0u; base < NREG; base += ns) {
        uint reg = base + sg;
        bool mine = reg < NREG;                  // uniform within the subgroup
        uint rm = (reg & 1u) * 32u;
        uint rn = (reg >> 1) * 32u;
        ACC a00 = ACC(0.0);
        ACC a01 = ACC(0.0);
        ACC a10 = ACC(0.0);
        ACC a11 = ACC(0.0);
        for (uint u0 = u_lo; u0 < units; u0 += KU) {
            fetch(u0, r0, c0, t, units);
            stash(t);
            barrier();
            if (mine) {
                for (uint kk = 0u; kk < CBK; kk += CM) {
                    MATA w0;
                    MATA w1;
                    MATB x0;
                    MATB x1;
                    coopMatLoad(w0, wsh, rm * ST4 + kk / 4u, ST4, gl_CooperativeMatrixLayoutRowMajor);
                    coopMatLoad(w1, wsh, (rm + CM) * ST4 + kk / 4u, ST4, gl_CooperativeMatrixLayoutRowMajor);
                    coopMatLoad(x0, xsh, rn * ST4 + kk / 4u, ST4, gl_CooperativeMatrixLayoutColumnMajor);
                    coopMatLoad(x1, xsh, (rn + CM) * ST4 + kk / 4u, ST4, gl_CooperativeMatrixLayoutColumnMajor);
                    a00 = coopMatMulAdd(w0, x0, a00);
                    a01 = coopMatMulAdd(w0, x1, a01);
                    a10 = coopMatMulAdd(w1, x0, a10);
                    a11 = coopMatMulAdd(w1, x1, a11);
                }
            }
            barrier();
        }
        if (mine) {
            write_out(a00, reg, r0 + rm, c0 + rn, r0, c0);
            write_out(a01, reg, r0 + rm, c0 + rn + CM, r0, c0);
            write_out(a10, reg, r0 + rm + CM, c0 + rn, r0, c0);
            write_out(a11, reg, r0 + rm + CM, c0 + rn + CM, r0, c0);
        }
    }
    if (p.pieces > 1u) finish_split(r0, c0, t, WG);
}
#endif
