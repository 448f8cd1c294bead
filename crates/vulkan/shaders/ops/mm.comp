// y = W x in the canonical order (docs/canonical-order.md) for any number of activation rows in
// one pass over the weights: the product of a wide step or a prefill window (src/mv.rs; mv.comp
// takes 1..8 rows). Its inputs and outputs are mv.comp's (XIN 0 or 2, OUT 0, 1 or 2: see there),
// and a row's result is the same bits as there, whatever rows share the pass.
//
// A workgroup owns a tile of WR (16, 32 or 64) staged weight rows x BN activation rows (for
// SwiGLU 64: 32 gate rows and their 32 up rows, 32 output rows; the host takes smaller tiles
// where few tiles would leave the device idle; no element's arithmetic depends on the tile) and walks the row's blocks in steps of SB,
// staging each step's weight blocks (dotfmt.glsl dot_load: int8 quants and the block's
// parameters) and activation blocks in shared memory. Every output element keeps its chunk's
// running sum (the chunk's blocks left to right) and, as chunks end, folds it into the
// pairwise tree over the chunk index: slot k holds the pending left operand of level k, so
// chunk c's sum meets the sums it pairs with in the spec's order (+0.0 for the chunks past
// the row, up to LPOW). The roots go to shared memory and the epilogue runs from there.
//
// The integer products are 16x16x32 int8 cooperative-matrix tiles (GL_KHR_cooperative_matrix,
// subgroups of 32): a subgroup owns a 16x16 region and takes each block's integer dot products
// as one tile product (two for DOT_HALVES: the whole blocks and their first halves), whose
// elements it then finishes one by one, knowing each element's row and column from an index
// tile loaded once (the element order is the implementation's). The portable tiers of the same
// product are mr.comp's (src/mv.rs picks by rows).
//
// EXPERT: the weights are a mixture-of-experts stack of experts of `rows` rows each, and the
// product's columns are slots (a step's (row, chosen expert) pairs): workgroup z takes the
// z-th chosen expert e = grp[act_off + z] (moe.comp GROUP, common/experts.glsl; none past the
// last, and the workgroup leaves), its rows once for the slots that chose it,
// grp[list_off + grp[e] .. list_off + grp[e + 1]) in slot order. Slot s reads activation row
// s / x_div (and its r) and writes output row s. The host sizes the grid for the most slots an
// expert can have (a step's row count: a row's slots choose distinct experts), as the counts
// live on the device; tiles past an expert's count leave at once. A slot's result is the bits the plain product gives its
// activation row, however many slots share its expert.
#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_EXT_control_flow_attributes : require
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_int8 : require

layout(local_size_x_id = 7) in;
layout(constant_id = 0) const uint CB = 8;      // blocks a chunk
layout(constant_id = 1) const uint NCH = 8;     // chunks a row
layout(constant_id = 2) const uint LPOW = 8;    // NCH rounded up to a power of two
layout(constant_id = 3) const uint LOG = 3;     // log2(LPOW)
layout(constant_id = 4) const uint XIN = 0;     // 0: packed; 2: normpack's packs and r
layout(constant_id = 5) const uint OUT = 0;     // 0: store; 1: add; 2: SwiGLU packed
layout(constant_id = 6) const uint RT = 4;      // 16-row regions of weight rows a tile (4 for SwiGLU)
layout(constant_id = 7) const uint WG = 256;    // threads: 2 RT subgroups of 32
layout(constant_id = 8) const uint ACT = 0;     // OUT 2's gate activation: 0 silu (SwiGLU), 1 GELU's tanh form (GeGLU)

#define WR (16u * RT)   // weight rows staged a tile
#define BN 32u     // activation rows a tile
#define SB 4u      // blocks a step
#define E 8u       // output elements a thread (WR x BN / WG)
#define NLV 6u     // tree slots: levels 0..4 of a 32-chunk tree, and the root
// A staged row's stride in 16-byte words: SB blocks of 2, and 1 more so that the rows of a
// tile load fall on different banks (144 bytes).
#define ST4 (SB * 2u + 1u)

layout(std430, set = 0, binding = 0) readonly buffer Wt { uint WDATA[]; };
layout(std430, set = 0, binding = 0) readonly buffer Wt4 { uvec4 WDATA4[]; };
layout(std430, set = 0, binding = 1) readonly buffer X { uint xp[]; };
layout(std430, set = 0, binding = 1) readonly buffer X4 { uvec4 xp4[]; };
layout(std430, set = 0, binding = 2) readonly buffer NR { float nr[]; };
layout(std430, set = 0, binding = 3) buffer Y { float y[]; };
layout(std430, set = 0, binding = 4) writeonly buffer P { uint pk[]; };
#ifdef EXPERT
layout(std430, set = 0, binding = 5) readonly buffer G { uint grp[]; };
#endif

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
    uint n;          // activation rows (EXPERT: the most slots an expert can have)
#ifdef EXPERT
    uint x_div;      // slots a row of activations
    uint list_off;   // word offset of the slot lists in grp
    uint act_off;    // word offset of the chosen experts in grp
#endif
} p;
#ifdef EXPERT
#include "experts.glsl"
#endif

#define HAVE_WDATA4
#define ROW_COLS p.cols
#include "formats.glsl"
#include "dotfmt.glsl"
#include "canon_epi.glsl"

#if defined(DOT_HALVES)
#define XCOPIES 2u   // the blocks whole, and their first halves alone
#else
#define XCOPIES 1u
#endif
// Every operand in as few shared loads as it takes (16 bytes at most each).
shared uvec4 wq[64u * ST4];           // [weight row][block of the step][2] int8 quants
shared uvec4 wpar[64u * SB];          // [weight row][block] the block's parameters: wf bits, wi
shared uvec4 xqs[XCOPIES * BN * ST4]; // [copy][activation row][block][2]
shared vec2 xpar[BN * SB];            // [activation row][block] d, the sum of the quants (bits)
shared float res[64u * BN];          // [weight row][activation row] the finished sums
shared int idxs[256];
#define MA coopmat<int8_t, gl_ScopeSubgroup, 16, 32, gl_MatrixUseA>
#define MB coopmat<int8_t, gl_ScopeSubgroup, 32, 16, gl_MatrixUseB>
#define MC coopmat<int, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>

uint ncols;   // columns of this workgroup's product
uint ebase;   // EXPERT: the expert's first weight row
uint lbase;   // EXPERT: its first slot in the lists

// Column c's slot (EXPERT) or activation row, and the activation row it reads.
uint col_out(uint c) {
#ifdef EXPERT
    return grp[p.list_off + lbase + c];
#else
    return c;
#endif
}
uint col_x(uint c) {
#ifdef EXPERT
    return col_out(c) / p.x_div;
#else
    return c;
#endif
}

// The staged weight row i of this tile: its byte offset in binding 0 and whether it exists.
uint row_off(uint r0, uint i, out bool live) {
    if (OUT == 2u) {
        uint row = r0 + (i & 31u);
        live = row < p.rows;
        return (i >> 5) * p.up_off + (ebase + row) * p.row_bytes;
    }
    uint row = r0 + i;
    live = row < p.rows;
    return (ebase + row) * p.row_bytes;
}

// Stage blocks b0 .. b0 + SB of the tile's weight and activation rows (zeros past the rows,
// the activation rows and the row's blocks).
void stage(uint r0, uint c0, uint b0, uint nb, uint t) {
    for (uint e = t; e < WR * SB; e += WG) {
        uint i = e / SB;
        uint j = e % SB;
        bool live;
        uint ro = row_off(r0, i, live);
        uint qw[8] = uint[8](0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u);
        vec2 wf = vec2(0.0);
        ivec2 wi = ivec2(0);
        if (live && b0 + j < nb) dot_load(ro, b0 + j, qw, wf, wi);
        wq[i * ST4 + j * 2u] = uvec4(qw[0], qw[1], qw[2], qw[3]);
        wq[i * ST4 + j * 2u + 1u] = uvec4(qw[4], qw[5], qw[6], qw[7]);
        wpar[e] = uvec4(floatBitsToUint(wf), uvec2(wi));
    }
    for (uint e = t; e < BN * SB; e += WG) {
        uint c = e / SB;
        uint j = e % SB;
        uint q[8] = uint[8](0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u);
        float d = 0.0;
        int s = 0;
        if (c0 + c < ncols && b0 + j < nb) {
            uint v = col_x(c0 + c) * p.x_stride + (b0 + j) * 32u;   // value index, a multiple of 32
            uvec4 a = xp4[v >> 4], b = xp4[(v >> 4) + 1u];
            q = uint[8](a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w);
            d = uintBitsToFloat(xp[p.xd_off + v / 32u]);
            s = int(xp[p.xs_off + v / 32u]);
        }
        xqs[c * ST4 + j * 2u] = uvec4(q[0], q[1], q[2], q[3]);
        xqs[c * ST4 + j * 2u + 1u] = uvec4(q[4], q[5], q[6], q[7]);
        if (XCOPIES == 2u) {
            xqs[BN * ST4 + c * ST4 + j * 2u] = uvec4(q[0], q[1], q[2], q[3]);
            xqs[BN * ST4 + c * ST4 + j * 2u + 1u] = uvec4(0u);
        }
        xpar[e] = vec2(d, intBitsToFloat(s));
    }
}

// Each element's pending tree sums: slot k holds level k's left operand.
float lv[NLV][E];

// Chunk ch's sum v into element e's tree (ch the same in every thread; e and the slots
// constant once unrolled, so the slots stay in registers).
void tree_push(uint e, float v0, uint ch) {
    precise float v = v0;
    [[unroll]] for (uint k = 0u; k < NLV; k++) {
        if (((ch >> k) & 1u) == 0u) {
            lv[k][e] = v;
            return;
        }
        precise float s = lv[k][e] + v;
        v = s;
    }
}

void main() {
    uint t = gl_LocalInvocationIndex;
    uint nb = p.cols / 32u;
    uint outs = OUT == 2u ? 32u : WR;   // output rows a tile
    uint r0 = gl_WorkGroupID.x * outs;
    uint c0 = gl_WorkGroupID.y * BN;
#ifdef EXPERT
    if (!expert_slice(ebase, lbase, ncols)) return;   // the whole workgroup: past the chosen experts
#else
    ebase = 0u;
    lbase = 0u;
    ncols = p.n;
#endif
    if (c0 >= ncols) return;   // the whole workgroup: past its expert's slots
    // Element e of this thread: staged weight row er[e], activation row ec[e] of the tile.
    uint er[E], ec[E];
    uint sg = gl_SubgroupID;              // region: rows 16 (sg % RT), columns 16 (sg / RT)
    uint rg = (sg % RT) * 16u;
    uint cg = (sg / RT) * 16u;
    for (uint i = t; i < 256u; i += WG) idxs[i] = int(i);
    barrier();
    MC ix;
    coopMatLoad(ix, idxs, 0, 16, gl_CooperativeMatrixLayoutRowMajor);
    [[unroll]] for (uint e = 0u; e < E; e++) {
        uint rc = uint(ix[e]);
        er[e] = rg + rc / 16u;
        ec[e] = cg + rc % 16u;
    }
    precise float acc[E];
    [[unroll]] for (uint e = 0u; e < E; e++) {
        acc[e] = 0.0;
        [[unroll]] for (uint k = 0u; k < NLV; k++) lv[k][e] = 0.0;
    }
    for (uint b0 = 0u; b0 < nb; b0 += SB) {
        stage(r0, c0, b0, nb, t);
        barrier();
        [[unroll]] for (uint j = 0u; j < SB; j++) {
            uint b = b0 + j;
            if (b >= nb) break;
            MA a;
            MB xb;
            coopMatLoad(a, wq, rg * ST4 + j * 2u, ST4, gl_CooperativeMatrixLayoutRowMajor);
            coopMatLoad(xb, xqs, cg * ST4 + j * 2u, ST4, gl_CooperativeMatrixLayoutColumnMajor);
            MC s0 = coopMatMulAdd(a, xb, MC(0));
#ifdef DOT_HALVES
            coopMatLoad(xb, xqs, BN * ST4 + cg * ST4 + j * 2u, ST4, gl_CooperativeMatrixLayoutColumnMajor);
            MC s1 = coopMatMulAdd(a, xb, MC(0));   // the first halves' sums
#endif
            [[unroll]] for (uint e = 0u; e < E; e++) {
#ifdef DOT_HALVES
                ivec2 si = ivec2(s1[e], s0[e] - s1[e]);
#else
                ivec2 si = ivec2(s0[e], 0);
#endif
                uvec4 wp = wpar[er[e] * SB + j];
                vec2 xv = xpar[ec[e] * SB + j];
                precise float f = dot_finish(si, uintBitsToFloat(wp.xy), ivec2(wp.zw), xv.x, floatBitsToInt(xv.y));
                acc[e] = acc[e] + f;
            }
            if ((b + 1u) % CB == 0u || b + 1u == nb) {
                [[unroll]] for (uint e = 0u; e < E; e++) {
                    tree_push(e, acc[e], b / CB);
                    acc[e] = 0.0;
                }
            }
        }
        barrier();
    }
    for (uint ch = NCH; ch < LPOW; ch++)
        [[unroll]] for (uint e = 0u; e < E; e++) tree_push(e, 0.0, ch);
    // The root sits in slot LOG (a constant index for each LOG, so lv needs no addressing).
    [[unroll]] for (uint e = 0u; e < E; e++) {
        float root = lv[0][e];
        [[unroll]] for (uint k = 1u; k < NLV; k++)
            if (k == LOG) root = lv[k][e];
        res[er[e] * BN + ec[e]] = root;
    }
    barrier();
    if (OUT != 2u) {
        for (uint e = t; e < WR * BN; e += WG) {
            uint i = e % WR;
            uint c = e / WR;
            uint row = r0 + i;
            uint col = c0 + c;
            if (row >= p.rows || col >= ncols) continue;
            precise float g = res[i * BN + c];
            if (XIN != 0u) g = nr[col_x(col)] * g;
            uint yi = col_out(col) * p.y_stride + p.y_off + row;
            if (OUT == 0u) {
                y[yi] = g;
            } else {
                precise float s = g + y[yi];
                y[yi] = s;
            }
        }
        return;
    }
    // SwiGLU: h of the tile's 32 rows a column, packed as one block of the next input.
    if (t >= BN || r0 >= p.rows || c0 + t >= ncols) return;
    uint col = c0 + t;
    float r = XIN != 0u ? nr[col_x(col)] : 1.0;
    float h[32];
    for (uint i = 0u; i < 32u; i++) h[i] = canon_glu(res[i * BN + t], res[(32u + i) * BN + t], r, XIN != 0u, ACT == 1u);
    uint q[8];
    float d;
    int s;
    canon_pack(h, q, d, s);
    uint vo = col_out(col) * p.y_stride + p.y_off + r0;   // value index, a multiple of 32
    for (uint j = 0u; j < 8u; j++) pk[vo / 4u + j] = q[j];
    pk[p.pd_off + vo / 32u] = floatBitsToUint(d);
    pk[p.ps_off + vo / 32u] = uint(s);
}
