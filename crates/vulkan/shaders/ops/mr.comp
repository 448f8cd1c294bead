// y = W x in the canonical order (docs/canonical-order.md) for more activation rows than mv.comp
// takes, in one pass over the weights, with nothing staged between barriers: the weights go
// from memory straight to registers and the activation blocks are read where every lane of a
// subgroup wants the same one. Inputs and outputs are mv.comp's (XIN 0 or 2, OUT 0, 1 or 2: see
// there), and a row's result is the same bits as there, whatever rows share the pass.
//
// A workgroup owns 32 * NV weight rows (OUT 2: 32 gate rows and their 32 up rows) and NC
// columns (activation rows). Thread t takes row slot t % 32 (NV rows: slot, slot + 32, or the
// gate and up row) and chunk slot t / 32, so the 32 lanes of a subgroup are 32 weight rows at
// the same block: their activation loads are one address. Chunk slot s owns the G = LPOW / CS
// consecutive chunks s * G .. s * G + G - 1 (CS chunk slots a workgroup): it sums each chunk's
// blocks left to right from +0.0 for its rows and columns in registers, and adds its G chunk
// sums by the pairwise tree (+0.0 for chunks past the row), which is the subtree of the spec's
// tree over those chunks. The CS subtree roots meet in shared memory, where one thread an
// output element adds them by the tree's upper levels and runs the epilogue. No float
// operation's order depends on the column count, NC, CS, the subgroup size or which thread
// loaded a block.
//
// EXPERT: mm.comp's EXPERT form (see there): workgroup z takes the z-th chosen expert e's rows
// for the slots that chose it, grp[list_off + grp[e] ..] in slot order; column tiles past its
// count leave.
#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#ifdef DOT_HW
#extension GL_EXT_spirv_intrinsics : require
#endif

layout(local_size_x_id = 7) in;
layout(constant_id = 0) const uint CB = 8;      // blocks a chunk
layout(constant_id = 1) const uint NCH = 8;     // chunks a row
layout(constant_id = 2) const uint LPOW = 8;    // NCH rounded up to a power of two
layout(constant_id = 3) const uint CS = 8;      // chunk slots a workgroup (a power of two, LPOW / 4 .. LPOW)
layout(constant_id = 4) const uint XIN = 0;     // 0: packed; 2: normpack's packs and r
layout(constant_id = 5) const uint OUT = 0;     // 0: store; 1: add; 2: SwiGLU packed
layout(constant_id = 6) const uint NV = 1;      // weight rows a thread (2 for OUT 2: gate and up)
layout(constant_id = 7) const uint WG = 256;    // threads: 32 CS
layout(constant_id = 8) const uint NC = 16;     // columns a workgroup (at most NCMAX)
layout(constant_id = 9) const uint ACT = 0;     // OUT 2's gate activation: 0 silu (SwiGLU), 1 GELU's tanh form (GeGLU)

#define NVMAX 2u
#define NCMAX 16u
#define GMAX 4u        // chunks a thread at most (LPOW / CS)

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

// [chunk slot][weight row k][column][row slot] subtree roots; after the upper levels, chunk
// slot 0's holds each element's sum.
shared float res[CS * NV * NC * 32u];

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

XUnit x_block(uint col, uint b) {
    XUnit x;
    uint v = col_x(col) * p.x_stride + b * 32u;   // value index, a multiple of 32
    uvec4 a = xp4[v >> 4], e = xp4[(v >> 4) + 1u];
    x.q = uint[8](a.x, a.y, a.z, a.w, e.x, e.y, e.z, e.w);
    x.d = uintBitsToFloat(xp[p.xd_off + v / 32u]);
    x.s = int(xp[p.xs_off + v / 32u]);
    return x;
}

void main() {
    uint t = gl_LocalInvocationIndex;
    uint rs = t % 32u;
    uint cs = t / 32u;
    uint nb = p.cols / 32u;
    uint outs = OUT == 2u ? 32u : 32u * NV;   // output rows a workgroup
    uint c0 = gl_WorkGroupID.x * NC;
    uint r0 = gl_WorkGroupID.y * outs;
#ifdef EXPERT
    if (!expert_slice(ebase, lbase, ncols)) return;   // the whole workgroup: past the chosen experts
#else
    ebase = 0u;
    lbase = 0u;
    ncols = p.n;
#endif
    if (c0 >= ncols) return;   // the whole workgroup: past its expert's slots
    uint nc = min(NC, ncols - c0);
    uint roff[NVMAX];
    bool live[NVMAX];
    [[unroll]] for (uint k = 0u; k < NVMAX; k++) {
        uint row = OUT == 2u ? r0 + rs : r0 + k * 32u + rs;
        live[k] = k < NV && row < p.rows;
        roff[k] = (OUT == 2u ? k * p.up_off : 0u) + (ebase + row) * p.row_bytes;
    }
    uint gc = LPOW / CS;   // chunks a thread
    precise float acc[NVMAX][NCMAX];
    precise float lv[2][NVMAX][NCMAX];   // the subtree's pending left operands, levels 0 and 1
    [[unroll]] for (uint g = 0u; g < GMAX; g++) {
        if (g >= gc) break;
        uint ch = cs * gc + g;
        [[unroll]] for (uint k = 0u; k < NVMAX; k++)
            [[unroll]] for (uint c = 0u; c < NCMAX; c++) acc[k][c] = 0.0;
        if (ch < NCH) {
            uint b1 = min(ch * CB + CB, nb);
            for (uint b = ch * CB; b < b1; b++) {
                uint qw[NVMAX][8];
                vec2 wf[NVMAX];
                ivec2 wi[NVMAX];
                [[unroll]] for (uint k = 0u; k < NVMAX; k++)
                    if (live[k]) dot_load(roff[k], b, qw[k], wf[k], wi[k]);
                [[unroll]] for (uint c = 0u; c < NCMAX; c++) {
                    if (c >= nc) break;
                    XUnit x = x_block(c0 + c, b);
                    [[unroll]] for (uint k = 0u; k < NVMAX; k++)
                        if (k < NV) {
                            precise float f = dot_term(qw[k], wf[k], wi[k], x);
                            acc[k][c] = acc[k][c] + f;
                        }
                }
            }
        }
        // Chunk g of this slot's gc into the subtree: g's bits say where it pairs.
        [[unroll]] for (uint k = 0u; k < NVMAX; k++)
            [[unroll]] for (uint c = 0u; c < NCMAX; c++) {
                if (k >= NV || c >= NC) continue;
                precise float v = acc[k][c];
                if ((g & 1u) == 0u) {
                    lv[0][k][c] = v;
                } else {
                    v = lv[0][k][c] + v;
                    if ((g & 2u) == 0u && gc > 2u) {
                        lv[1][k][c] = v;
                    } else if (gc > 2u) {
                        v = lv[1][k][c] + v;
                    }
                }
                if (g + 1u == gc) res[((cs * NV + k) * NC + c) * 32u + rs] = gc == 1u ? acc[k][c] : v;
            }
    }
    barrier();
    // The tree's levels above the chunk slots, one thread an element, and the epilogue.
    for (uint e = t; e < NV * NC * 32u; e += WG) {
        uint i = e % 32u;
        uint kc = e / 32u;
        float v[8];
        [[unroll]] for (uint s = 0u; s < 8u; s++) v[s] = s < CS ? res[(s * NV * NC + kc) * 32u + i] : 0.0;
        [[unroll]] for (uint dd = 1u; dd < 8u; dd <<= 1)
            [[unroll]] for (uint s = 0u; s < 8u; s += 2u * dd)
                if (s + dd < CS) {
                    precise float a = v[s] + v[s + dd];
                    v[s] = a;
                }
        if (OUT == 2u) {
            res[kc * 32u + i] = v[0];
            continue;
        }
        uint k = kc / NC;
        uint c = kc % NC;
        uint row = r0 + k * 32u + i;
        if (row >= p.rows || c >= nc) continue;
        uint col = c0 + c;
        precise float g = v[0];
        if (XIN != 0u) g = nr[col_x(col)] * g;
        uint yi = col_out(col) * p.y_stride + p.y_off + row;
        if (OUT == 0u) {
            y[yi] = g;
        } else {
            precise float s = g + y[yi];
            y[yi] = s;
        }
    }
    if (OUT != 2u) return;
    // SwiGLU: h of the 32 rows a column, packed as one block of the next input.
    barrier();
    if (t >= nc || r0 >= p.rows) return;
    uint col = c0 + t;
    float r = XIN != 0u ? nr[col_x(col)] : 1.0;
    float h[32];
    for (uint i = 0u; i < 32u; i++) h[i] = canon_glu(res[t * 32u + i], res[(NC + t) * 32u + i], r, XIN != 0u, ACT == 1u);
    uint q[8];
    float d;
    int s;
    canon_pack(h, q, d, s);
    uint vo = col_out(col) * p.y_stride + p.y_off + r0;   // value index, a multiple of 32
    for (uint j = 0u; j < 8u; j++) pk[vo / 4u + j] = q[j];
    pk[p.pd_off + vo / 32u] = floatBitsToUint(d);
    pk[p.ps_off + vo / 32u] = uint(s);
}
