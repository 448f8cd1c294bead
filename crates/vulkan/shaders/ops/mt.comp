// y = W x in the canonical order (docs/canonical-order.md) for many activation rows, on int8
// tensor-core tiles finished in registers: the product of a wide step
// (src/mv.rs). Inputs and outputs are mv.comp's (XIN 0 or 2, OUT 0, 1 or 2: see there), and a
// row's result is the same bits as there, whatever rows share the pass.
//
// A workgroup owns TM x TN 16x16 regions of the output (TM * 16 weight rows; OUT 2: TM = 4, 32
// gate rows and their 32 up rows) and WK subgroups that split the row's chunk tree: subgroup w
// takes the LW = LPOW / WK consecutive leaves w * LW .. w * LW + LW - 1, whose blocks are one
// contiguous run of K. For each block it loads its weight tiles (16 rows x 32 int8 quants) and
// activation tiles (32 quants x 16 rows) as cooperative matrices straight from the buffers (no
// staging, no barrier in K), takes each region's exact integer sums as one 16x16x32 tile
// product, and finishes every element of it in registers: the tile product starts from the
// integer 1.5 * 2^23 (0x4B400000), so an element's bits, read as a float, are 1.5 * 2^23 + s
// exactly and one subtraction gives float(s) (|s| < 2^22); the element's row and column come
// from an index tile loaded once (the element order is the implementation's), and its weight
// and activation scales from the buffers. Each element sums its chunk's blocks left to right
// from +0.0 and its LW chunk sums by the pairwise tree (+0.0 for chunks past the row); the WK
// subtree roots meet in shared memory, where the tree's upper levels and the epilogue run. No
// float operation's order depends on the rows in the pass, TM, TN, WK or the subgroup size.
//
// Formats: Q8_0's weight tiles load in place (the device's rows hold a row's quants apart from
// its scales). Every other format's blocks are unpacked by the subgroup that reads them
// (dotfmt.glsl dot_load: int8 quants and the block's parameters) into its own slice of shared
// memory, a block ahead of the tile products (subgroup barriers only), and each element
// finishes with dotfmt.glsl's dot_finish. Q6_K (DOT_HALVES) takes a second tile product over
// its blocks' first halves.
#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_EXT_control_flow_attributes : require
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_int8 : require

layout(local_size_x_id = 8) in;
layout(constant_id = 0) const uint CB = 8;      // blocks a chunk
layout(constant_id = 1) const uint NCH = 8;     // chunks a row
layout(constant_id = 2) const uint LPOW = 8;    // NCH rounded up to a power of two
layout(constant_id = 3) const uint XIN = 0;     // 0: packed; 2: normpack's packs and r
layout(constant_id = 4) const uint OUT = 0;     // 0: store; 1: add; 2: SwiGLU packed
layout(constant_id = 5) const uint TM = 2;      // 16-row weight regions a workgroup (4 for OUT 2)
layout(constant_id = 6) const uint TN = 2;      // 16-column activation regions a workgroup
layout(constant_id = 7) const uint WK = 4;      // subgroups: the chunk tree's slices
layout(constant_id = 8) const uint WG = 128;    // threads: 32 WK
layout(constant_id = 9) const uint ACT = 0;     // OUT 2's gate activation: 0 silu (SwiGLU), 1 GELU's tanh form (GeGLU)

#define TMAX 4u        // TM and TN at most
#define WKMAX 8u       // WK at most
#define LW (LPOW / WK) // leaves a subgroup: 1, 2 or 4
#define E 8u           // elements a lane of a 16x16 region

layout(std430, set = 0, binding = 0) readonly buffer Wt { uint WDATA[]; };
layout(std430, set = 0, binding = 0) readonly buffer Wt4 { uvec4 WDATA4[]; };
layout(std430, set = 0, binding = 1) readonly buffer X { uint xp[]; };
layout(std430, set = 0, binding = 1) readonly buffer X4 { uvec4 xp4[]; };
layout(std430, set = 0, binding = 2) readonly buffer NR { float nr[]; };
layout(std430, set = 0, binding = 3) buffer Y { float y[]; };
layout(std430, set = 0, binding = 4) writeonly buffer P { uint pk[]; };

layout(push_constant) uniform Push {
    uint rows;
    uint cols;
    uint row_bytes;
    uint x_stride;
    uint y_stride;
    uint y_off;
    uint xd_off;
    uint xs_off;
    float eps;       // unused (mv.comp's folded norm)
    uint up_off;
    uint pd_off;
    uint ps_off;
    uint n;          // activation rows
} p;

#define HAVE_WDATA4
#define ROW_COLS p.cols
#include "formats.glsl"
#include "dotfmt.glsl"
#include "canon_epi.glsl"

#if !defined(FMT_Q8_0)
#define STAGED
#extension GL_KHR_shader_subgroup_basic : require
#endif

#define MA coopmat<int8_t, gl_ScopeSubgroup, 16, 32, gl_MatrixUseA>
#define MB coopmat<int8_t, gl_ScopeSubgroup, 32, 16, gl_MatrixUseB>
#define MC coopmat<int, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>

// Shared memory: STAGED, each subgroup's unpacked weight tiles (rows of SQ 16-byte words: the
// block's 32 quants and a pad word; DOT_HALVES, then the same with the second half zeroed) and
// their parameters; after the walk over K, the subgroups' subtree roots, [subgroup][output row
// of the tile][column of the tile] (RED), whose first slice then holds the finished tile for
// OUT 2's pack.
#define SQ 3u
#ifdef DOT_HALVES
#define QCOPIES 2u
#else
#define QCOPIES 1u
#endif
#define SROWS (TM * 16u)
#ifdef STAGED
#define STAGE4 (WK * SROWS * (QCOPIES * SQ + 1u))
#else
#define STAGE4 0u
#endif
#define RED4 (WK * TM * TN * 64u)
shared uvec4 sm[STAGE4 > RED4 ? STAGE4 : RED4];
float red_ld(uint k) { return uintBitsToFloat(sm[k >> 2][k & 3u]); }
void red_st(uint k, float v) { sm[k >> 2][k & 3u] = floatBitsToUint(v); }
shared int idxs[256];
#ifndef STAGED
// Each subgroup's two slots (blocks of even and odd parity) of its block's scales: the weight
// rows' (SROWS) then the activation rows' (TN * 16), as f32. A lane loads one or two of them
// a block; each element reads its row's and its column's back.
#define SCW (SROWS + TN * 16u)
shared float ssc[WK * 2u * SCW];
#endif

// Weight region i's first row (clamped so that the region lies within the matrix) and the byte
// offset of that row; OUT 2: regions 0 and 1 the gate rows, 2 and 3 their up rows.
uint reg_row(uint r0, uint i) {
    uint lo = OUT == 2u ? r0 + 16u * (i & 1u) : r0 + 16u * i;
    return min(lo, p.rows - 16u);
}
uint reg_off(uint r0, uint i) {
    uint off = reg_row(r0, i) * p.row_bytes;
    if (OUT == 2u && i >= 2u) off += p.up_off;
    return off;
}
// Activation region j's first row, clamped likewise.
uint reg_col(uint c0, uint j) { return min(c0 + 16u * j, p.n - 16u); }

uint pbase_g;   // STAGED: the subgroup's parameters in sm

// Element e's running chunk sum, pending tree operands and root, per region.
float acc[TMAX][TMAX][E];
float hold0[TMAX][TMAX][E];
float hold1[TMAX][TMAX][E];

// Leaf l of this subgroup's LW (its chunk sum in acc) into its subtree; the root ends in hold0.
void leaf_done(uint l) {
    [[unroll]] for (uint i = 0u; i < TM; i++)
        [[unroll]] for (uint j = 0u; j < TN; j++)
            [[unroll]] for (uint e = 0u; e < E; e++) {
                precise float v = acc[i][j][e];
                if (LW == 1u) {
                    hold0[i][j][e] = v;
                } else if ((l & 1u) == 0u) {
                    if (l == 0u) hold0[i][j][e] = v; else hold1[i][j][e] = v;
                } else {
                    precise float t = (l == 1u ? hold0[i][j][e] : hold1[i][j][e]) + v;
                    if (l == 1u) {
                        hold0[i][j][e] = t;
                    } else {
                        precise float r = hold0[i][j][e] + t;
                        hold0[i][j][e] = r;
                    }
                }
                acc[i][j][e] = 0.0;
            }
}

// The tiles are cooperative matrices named one by one (W<set><i>, X<set><j>: glslang makes
// arrays of them invalid), each set's loads and products written out for every i < TMAX and
// j < NMAX; those past TM and TN fall away once specialized.
#define NMAX 2u   // TN at most
// The tile product of weight tile W and activation tile X (regions i, j), its elements
// finished into the chunk sums (FIN: the format's finish of element e from s).
#define TILE(i, j, W, X, FIN) if (TM > i && TN > j) { \
    MC s = coopMatMulAdd(W, X, z); \
    [[unroll]] for (uint e = 0u; e < E; e++) { \
        precise float f = FIN(i, j, e); \
        precise float a2 = acc[i][j][e] + f; \
        acc[i][j][e] = a2; \
    } \
}
#define TILES(S, FIN) \
    TILE(0, 0, W##S##0, X##S##0, FIN) TILE(0, 1, W##S##0, X##S##1, FIN) \
    TILE(1, 0, W##S##1, X##S##0, FIN) TILE(1, 1, W##S##1, X##S##1, FIN) \
    TILE(2, 0, W##S##2, X##S##0, FIN) TILE(2, 1, W##S##2, X##S##1, FIN) \
    TILE(3, 0, W##S##3, X##S##0, FIN) TILE(3, 1, W##S##3, X##S##1, FIN)
// A finished chunk into the subtree.
#define CHUNK_END(B) if (((B) + 1u) % CB == 0u || (B) + 1u == nb) { \
    leaf_done(l); \
    l++; \
}
// Activation tile j of block B into X, with each element's d (and, STAGED, sum of quants).
#define LOAD_X(B, j, X, DX_, XS_) if (TN > j) { \
    uint c = reg_col(c0, j); \
    coopMatLoad(X, xp4, c * (p.x_stride / 16u) + 2u * (B), p.x_stride / 16u, gl_CooperativeMatrixLayoutColumnMajor); \
    [[unroll]] for (uint e = 0u; e < E; e++) { \
        uint xi = (c + ec[e]) * (p.x_stride / 32u) + (B); \
        DX_[j][e] = uintBitsToFloat(xp[p.xd_off + xi]); \
        XS_[j][e] = STAGED_SUMS ? int(xp[p.xs_off + xi]) : 0; \
    } \
}
#define LOAD_XS(B, S) LOAD_X(B, 0, X##S##0, dx##S, xs##S) LOAD_X(B, 1, X##S##1, dx##S, xs##S)

#ifndef STAGED
#define STAGED_SUMS false
// Weight tile i of block B into W.
#define LOAD_W(B, i, W) if (TM > i) { \
    coopMatLoad(W, WDATA4, (reg_off(r0, i) >> 4) + 2u * (B), p.row_bytes / 16u, gl_CooperativeMatrixLayoutRowMajor); \
}
// Activation tile j of block B into X.
#define LOAD_X8(B, j, X) if (TN > j) { \
    coopMatLoad(X, xp4, reg_col(c0, j) * (p.x_stride / 16u) + 2u * (B), p.x_stride / 16u, gl_CooperativeMatrixLayoutColumnMajor); \
}
// This lane's scales of block B: weight rows lane and lane + 32 of the workgroup's SROWS,
// activation row lane of its TN * 16.
#define LOAD_SC(B, S) { \
    if (lane < SROWS) sw##S[0] = rd_f16(reg_off(r0, lane / 16u) + (lane % 16u) * p.row_bytes + p.cols + 2u * (B)); \
    if (lane + 32u < SROWS) sw##S[1] = rd_f16(reg_off(r0, (lane + 32u) / 16u) + (lane % 16u) * p.row_bytes + p.cols + 2u * (B)); \
    if (lane < TN * 16u) sx##S = uintBitsToFloat(xp[p.xd_off + reg_col(c0, lane / 16u) * (p.x_stride / 32u) + lane % 16u * (p.x_stride / 32u) + (B)]); \
}
// Block B's operands into set S.
#define LOAD_OPS(B, S) { \
    LOAD_W(B, 0, W##S##0) LOAD_W(B, 1, W##S##1) LOAD_W(B, 2, W##S##2) LOAD_W(B, 3, W##S##3) \
    LOAD_X8(B, 0, X##S##0) LOAD_X8(B, 1, X##S##1) \
    LOAD_SC(B, S) \
}
// Set S's scales into slot S of the subgroup's shared scales (the slot's last reader, two
// blocks back, passed the barrier of the block between).
#define STORE_SC(S) { \
    uint so = scb + (S) * SCW; \
    if (lane < SROWS) ssc[so + lane] = sw##S[0]; \
    if (lane + 32u < SROWS) ssc[so + lane + 32u] = sw##S[1]; \
    if (lane < TN * 16u) ssc[so + SROWS + lane] = sx##S; \
    subgroupMemoryBarrierShared(); \
    subgroupBarrier(); \
}
// Q8_0: f = (dw * d) * float(s); the tile product started from 1.5 * 2^23, so s's float is
// its bits less that.
#define FIN_Q8(S, i, j, e) ((ssc[scb + (S) * SCW + 16u * (i) + er[e]] * ssc[scb + (S) * SCW + SROWS + 16u * (j) + ec[e]]) * (uintBitsToFloat(uint(s[e])) - 12582912.0))
#define FIN_Q8_0(i, j, e) FIN_Q8(0u, i, j, e)
#define FIN_Q8_1(i, j, e) FIN_Q8(1u, i, j, e)
#define STEP(B, S) { \
    STORE_SC(S) \
    TILES(S, FIN_Q8_##S) \
    CHUNK_END(B) \
}
#else
#define STAGED_SUMS true
// STAGED: block B's weight blocks into this lane's registers (the lane's rows of the
// workgroup's SROWS: lane, lane + 32).
#define RL ((SROWS + 31u) / 32u)
#define GLOAD(B) { \
    [[unroll]] for (uint r = 0u; r < RL; r++) { \
        uint ri = lane + 32u * r; \
        if (ri < SROWS) dot_load(reg_off(r0, ri / 16u) + (ri % 16u) * p.row_bytes, (B), pq[r], pwf[r], pwi[r]); \
    } \
}
// The registers' blocks into the subgroup's slice, once every lane is done with the last.
#define SSTORE() { \
    subgroupMemoryBarrierShared(); \
    subgroupBarrier(); \
    [[unroll]] for (uint r = 0u; r < RL; r++) { \
        uint ri = lane + 32u * r; \
        if (ri < SROWS) { \
            uint o = sbase + ri * SQ; \
            sm[o] = uvec4(pq[r][0], pq[r][1], pq[r][2], pq[r][3]); \
            sm[o + 1u] = uvec4(pq[r][4], pq[r][5], pq[r][6], pq[r][7]); \
            if (QCOPIES == 2u) { \
                sm[o + SROWS * SQ] = uvec4(pq[r][0], pq[r][1], pq[r][2], pq[r][3]); \
                sm[o + SROWS * SQ + 1u] = uvec4(0u); \
            } \
            sm[pbase_g + ri] = uvec4(floatBitsToUint(pwf[r]), uvec2(pwi[r])); \
        } \
    } \
    subgroupMemoryBarrierShared(); \
    subgroupBarrier(); \
}
// The weight tiles from the slice (and, DOT_HALVES, their first halves').
#define LOAD_W(i, W, WH) if (TM > i) { \
    coopMatLoad(W, sm, sbase + 16u * i * SQ, SQ, gl_CooperativeMatrixLayoutRowMajor); \
    if (QCOPIES == 2u) coopMatLoad(WH, sm, sbase + SROWS * SQ + 16u * i * SQ, SQ, gl_CooperativeMatrixLayoutRowMajor); \
}
// A staged element's finish: its row's parameters from the slice, the format's expression.
float fin_staged(uint row, int s0, int s1, float dx, int xs) {
    uvec4 wp = sm[pbase_g + row];
    ivec2 si = QCOPIES == 2u ? ivec2(s1, s0 - s1) : ivec2(s0, 0);
    return dot_finish(si, uintBitsToFloat(wp.xy), ivec2(wp.zw), dx, xs);
}
#define STILE(i, j, W, WH, X, DX_, XS_) if (TM > i && TN > j) { \
    MC s = coopMatMulAdd(W, X, z); \
    MC sh = z; \
    if (QCOPIES == 2u) sh = coopMatMulAdd(WH, X, z); \
    [[unroll]] for (uint e = 0u; e < E; e++) { \
        precise float f = fin_staged(16u * i + er[e], s[e], sh[e], DX_[j][e], XS_[j][e]); \
        precise float a2 = acc[i][j][e] + f; \
        acc[i][j][e] = a2; \
    } \
}
#define STEP(B, S) { \
    LOAD_W(0, W0, H0) LOAD_W(1, W1, H1) LOAD_W(2, W2, H2) LOAD_W(3, W3, H3) \
    STILE(0, 0, W0, H0, X##S##0, dx##S, xs##S) STILE(0, 1, W0, H0, X##S##1, dx##S, xs##S) \
    STILE(1, 0, W1, H1, X##S##0, dx##S, xs##S) STILE(1, 1, W1, H1, X##S##1, dx##S, xs##S) \
    STILE(2, 0, W2, H2, X##S##0, dx##S, xs##S) STILE(2, 1, W2, H2, X##S##1, dx##S, xs##S) \
    STILE(3, 0, W3, H3, X##S##0, dx##S, xs##S) STILE(3, 1, W3, H3, X##S##1, dx##S, xs##S) \
    CHUNK_END(B) \
}
#endif

void main() {
    uint t = gl_LocalInvocationIndex;
    uint sg = gl_SubgroupID;
    uint nb = p.cols / 32u;
    uint r0 = gl_WorkGroupID.x * (OUT == 2u ? 32u : 16u * TM);
    uint c0 = gl_WorkGroupID.y * 16u * TN;
    if (c0 >= p.n) return;   // the whole workgroup
    for (uint i = t; i < 256u; i += WG) idxs[i] = int(i);
    barrier();
    // Element e of a region: row er[e], column ec[e] (the same in every region: one type).
    uint er[E], ec[E];
    {
        MC ix;
        coopMatLoad(ix, idxs, 0, 16, gl_CooperativeMatrixLayoutRowMajor);
        [[unroll]] for (uint e = 0u; e < E; e++) {
            uint rc = uint(ix[e]);
            er[e] = rc / 16u;
            ec[e] = rc % 16u;
        }
    }
    [[unroll]] for (uint i = 0u; i < TM; i++)
        [[unroll]] for (uint j = 0u; j < TN; j++)
            [[unroll]] for (uint e = 0u; e < E; e++) {
                acc[i][j][e] = 0.0;
                hold0[i][j][e] = 0.0;
                hold1[i][j][e] = 0.0;
            }
    // This subgroup's leaves and their blocks (a contiguous run; none past the row).
    uint l0 = sg * LW;
    uint b_lo = min(l0 * CB, nb);
    uint b_hi = min((l0 + LW) * CB, nb);
    uint l = 0u;
    MB X00; MB X01; MB X10; MB X11;   // one a declaration: glslang drops the use of a list's later names
#ifndef STAGED
    MC z = MC(0x4B400000);
    // Two sets of operands: the next block's loads in flight while this one's products run.
    MA W00; MA W01; MA W02; MA W03; MA W10; MA W11; MA W12; MA W13;   // one a declaration: glslang drops the use of a list's later names
    uint lane = gl_SubgroupInvocationID;
    uint scb = sg * 2u * SCW;   // this subgroup's scale slots
    float sw0[2], sw1[2];
    float sx0 = 0.0, sx1 = 0.0;
    if (b_lo < b_hi) LOAD_OPS(b_lo, 0);
    for (uint b = b_lo; b < b_hi; b += 2u) {
        if (b + 1u < b_hi) LOAD_OPS(b + 1u, 1);
        STEP(b, 0);
        if (b + 1u >= b_hi) break;
        if (b + 2u < b_hi) LOAD_OPS(b + 2u, 0);
        STEP(b + 1u, 1);
    }
#else
    MC z = MC(0);
    // Each element's activation scale and quant sum, for the two blocks in flight.
    float dx0[NMAX][E], dx1[NMAX][E];
    int xs0[NMAX][E], xs1[NMAX][E];
    MA W0; MA W1; MA W2; MA W3; MA H0; MA H1; MA H2; MA H3;   // one a declaration: glslang drops the use of a list's later names
    uint lane = gl_SubgroupInvocationID;
    uint sbase = sg * SROWS * (QCOPIES * SQ + 1u);   // this subgroup's slice: tiles, then parameters
    pbase_g = sbase + QCOPIES * SROWS * SQ;
    uint pq[RL][8];
    vec2 pwf[RL];
    ivec2 pwi[RL];
    if (b_lo < b_hi) {
        GLOAD(b_lo);
        LOAD_XS(b_lo, 0);
    }
    for (uint b = b_lo; b < b_hi; b += 2u) {
        SSTORE();
        if (b + 1u < b_hi) {
            GLOAD(b + 1u);
            LOAD_XS(b + 1u, 1);
        }
        STEP(b, 0);
        if (b + 1u >= b_hi) break;
        SSTORE();
        if (b + 2u < b_hi) {
            GLOAD(b + 2u);
            LOAD_XS(b + 2u, 0);
        }
        STEP(b + 1u, 1);
    }
#endif
    // Leaves past the row: +0.0 each.
    for (; l < LW; l++) leaf_done(l);
    // The subtree roots to shared memory, [subgroup][row][column] of the workgroup's tile
    // (where the staged tiles were: every subgroup done with them first).
    barrier();
    uint tr = TM * 16u, tc = TN * 16u;
    [[unroll]] for (uint i = 0u; i < TM; i++)
        [[unroll]] for (uint j = 0u; j < TN; j++)
            [[unroll]] for (uint e = 0u; e < E; e++)
                red_st((sg * tr + 16u * i + er[e]) * tc + 16u * j + ec[e], hold0[i][j][e]);
    barrier();
    // The tree's levels above the subgroups (pairs of neighbouring slices), then the epilogue.
    for (uint q = t; q < tr * tc; q += WG) {
        float v[WKMAX];
        [[unroll]] for (uint w = 0u; w < WKMAX; w++) v[w] = w < WK ? red_ld(w * tr * tc + q) : 0.0;
        [[unroll]] for (uint h = 1u; h < WKMAX; h *= 2u) {
            if (h >= WK) break;
            [[unroll]] for (uint w = 0u; w < WKMAX; w += 2u * h) {
                precise float s = v[w] + v[w + h];
                v[w] = s;
            }
        }
        uint ri = q / tc, ci = q % tc;
        uint i = ri / 16u, j = ci / 16u;
        uint row = reg_row(r0, i) + ri % 16u;
        uint col = reg_col(c0, j) + ci % 16u;
        // A region clamped back over its neighbour's elements leaves those to it.
        bool own = row >= (OUT == 2u ? r0 + 16u * (i & 1u) : r0 + 16u * i) && col >= c0 + 16u * j && c0 + 16u * j < p.n;
        if (OUT == 2u) {
            red_st(q, v[0]);   // slice 0's own element: read back by this thread only
            continue;
        }
        if (!own) continue;
        precise float g = v[0];
        if (XIN != 0u) g = nr[col] * g;
        uint yi = col * p.y_stride + p.y_off + row;
        if (OUT == 0u) {
            y[yi] = g;
        } else {
            precise float s = g + y[yi];
            y[yi] = s;
        }
    }
    if (OUT != 2u) return;
    barrier();
    // SwiGLU: h of the tile's 32 rows a column, packed as one block of the next input.
    if (t >= tc) return;
    uint j = t / 16u;
    if (c0 + 16u * j >= p.n) return;
    uint col = reg_col(c0, j) + t % 16u;
    if (col < c0 + 16u * j) return;
    float r = XIN != 0u ? nr[col] : 1.0;
    float h[32];
    for (uint i = 0u; i < 32u; i++) h[i] = canon_glu(red_ld(i * tc + t), red_ld((32u + i) * tc + t), r, XIN != 0u, ACT == 1u);
    uint q[8];
    float d;
    int s;
    canon_pack(h, q, d, s);
    uint vo = col * p.y_stride + p.y_off + r0;   // value index, a multiple of 32
    for (uint jj = 0u; jj < 8u; jj++) pk[vo / 4u + jj] = q[jj];
    pk[p.pd_off + vo / 32u] = floatBitsToUint(d);
    pk[p.ps_off + vo / 32u] = uint(s);
}
