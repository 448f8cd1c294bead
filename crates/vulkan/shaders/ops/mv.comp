// y = W x in the canonical order (docs/canonical-order.md) for NCOLS activation rows at once:
// the token command's matrix product, with the stage's norm folded into its prologue and its
// residual add or SwiGLU in its epilogue (src/mv.rs).
// A row of W is cut into NCH chunks of CB blocks of 32 values (resin_core::canon::Cut: fixed
// by the row length alone). A subgroup takes NV weight rows at once (one row, or a gate row
// and its up row) and walks their blocks in passes of S (the subgroup size): lane l takes
// block p * S + l of pass p, so a subgroup's loads are neighbouring bytes, and computes its
// f_b (dotfmt.glsl: an exact integer dot of the weight quants with the activation quants, then
// the format's float expression). Each chunk's blocks are then added left to right by one
// lane, from the pass's terms in shared memory; the chunk partials go to shared memory, and
// one thread a column adds them by the pairwise tree and runs the epilogue. Where a row has
// several passes, KS subgroups may share them (each a run of whole passes, so each chunk is
// one subgroup's): more subgroups stream a matrix of few rows. No float operation's order
// depends on NCOLS, the tile, KS, S or which lane loaded a block, so a row's result is the
// same bits in every form and on every device.
// Input (specialization constant XIN):
// - 0: activations packed in 32-value int8 blocks (qact.comp QPACK 32, or what the attention
//   combine or a SwiGLU epilogue wrote): binding 1, block scales at xd_off, sums at xs_off.
// - 1: f32 rows (binding 1) with the RMS norm folded: each workgroup quantizes u = x * w_norm
//   (binding 2) of its NCOLS rows into shared memory (the quants of u do not depend on the
//   row's scale) and sums the squares of x block by block, chunk by chunk and by the tree;
//   r = 1 / sqrt(ss / K + eps) scales the finished product. A workgroup takes TP passes of
//   rows to share that work. The one-row form only: N rows quantized in every workgroup
//   cost more than a dispatch of their own (XIN 2).
// - 2: as 0, the packs of u = x * w_norm that normpack.comp wrote (the same bits as XIN 1's
//   prologue: common/canon_norm.glsl), with each row's r at binding 2.
// - 3: as 2, what OUT 5 wrote: the packs, and at binding 2 each block's sum of the squares of
//   x ([row][block]), from which the prologue finds each row's r as XIN 1's does (the chunks'
//   sums left to right, then the tree): the same bits.
// Output (specialization constant OUT), row i of column c at c * y_stride + y_off + i:
// - 0: y = (r *) y' stored (binding 3).
// - 1: y = y' + y (the residual sum, binding 3).
// - 2: SwiGLU: weight rows i and up_off + i (the gate and up matrices, one binding) are taken
//   together, h = silu(g) * u (ACT 1: GeGLU, gelu_tanh(g) * u), and each 32 rows of h are
//   packed as the next matrix's input (QPACK 32 at binding 4: quants, d at pd_off, sums at
//   ps_off).
// - 5 (PACK_OUT): as 1, then the next norm's input of the residual rows: u = y * w_next
//   (binding 5) packed in 32-value blocks at binding 4 (pd_off, ps_off) and each block's sum
//   of the squares of y at binding 6, by the workgroup that finishes a block's rows last (a
//   word a block at binding 7, left zero), with normpack.comp's arithmetic: the N-row
//   command's norm needs no dispatch and barrier of its own (XIN 3 reads it).
// Forms: FORM_ONE (NCOLS = 1 at compile time) and the N-row form (NCOLS a specialization
// constant, 1..8). DOT_HW: the integer dot products by OpSDot (dotfmt.glsl).
// EXPERT (N-row form, XIN 0, 2 or 3): mm.comp's EXPERT form for steps of up to 8 rows: workgroup
// z takes the z-th chosen expert e's rows of the stack (experts of `rows` rows) for the slots
// that chose it, grp[list_off + grp[e] ..] (at most NCOLS, the step's rows: a row's slots
// choose distinct experts; common/experts.glsl); column c is its c-th slot, reading activation
// row slot / x_div and writing output row slot. Columns past the expert's count repeat its
// last slot's loads and write nothing. OUT 3 (EXPERT only): as 0, and the workgroup that
// finishes a tile of rows last among the z-slices (those past the chosen experts count
// too; a word a tile at binding 8, left zero) writes each step row's weighted sum of its
// slots over the tile's rows (binding 7; the slots' weights at binding 6), moe.comp
// COMBINE's arithmetic: the experts' sum needs no dispatch and barrier of its own. OUT 4:
// as 3, the sums added to binding 7's rows (the residual) instead. OUT 6: as 4, then the next
// norm's input of those rows packed as OUT 5 packs it (common/pack_next.glsl: the weights at
// binding 9, the sums of squares at binding 10, the packs at binding 4, the blocks' counters
// in binding 8 after the tiles').
#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_basic : require
#ifdef DOT_HW
#extension GL_EXT_spirv_intrinsics : require
#endif

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 64;
layout(constant_id = 1) const uint NCOLS_SC = 1;
layout(constant_id = 2) const uint LPOW = 8;    // NCH rounded up to a power of two (the tree's width)
layout(constant_id = 3) const uint CB = 8;      // blocks a chunk
layout(constant_id = 4) const uint NCH = 8;     // chunks a row
layout(constant_id = 5) const uint XIN = 0;
layout(constant_id = 6) const uint OUT = 0;
layout(constant_id = 7) const uint XQW = 1;     // shared words of the quantized rows (XIN 1)
layout(constant_id = 8) const uint XBW = 1;     // shared blocks of the quantized rows (XIN 1)
layout(constant_id = 9) const uint NSG = 4;     // subgroups a workgroup (WG / S)
layout(constant_id = 10) const uint TP = 1;     // passes of NSG subgroups' rows a workgroup takes
layout(constant_id = 11) const uint NVS = 1;    // weight rows a subgroup takes (1, or 2: OUT 2's gate and up)
layout(constant_id = 12) const uint PARTW = 1;  // shared floats of the chunk partials: NSG * 2 * NCOLS * LPOW
layout(constant_id = 13) const uint HVW = 1;    // shared floats of OUT 2's tile: NCOLS * HMAX
layout(constant_id = 14) const uint FSW = 1;    // shared floats of a pass's block terms: NSG * NVS * NCOLS * S
layout(constant_id = 15) const uint KS = 1;     // subgroups that share a row's passes over K (a power of two dividing NSG; above 1 only where CB <= S)
layout(constant_id = 16) const uint ACT = 0;    // OUT 2's gate activation: 0 silu (SwiGLU), 1 GELU's tanh form (GeGLU)
#ifdef FORM_ONE
#define NCOLS 1u
#else
#define NCOLS NCOLS_SC
#endif
#define NMAX 8u
#define HMAX 64u   // rows of a SwiGLU tile at most

layout(std430, set = 0, binding = 0) readonly buffer Wt { uint WDATA[]; };
layout(std430, set = 0, binding = 0) readonly buffer Wt4 { uvec4 WDATA4[]; };
layout(std430, set = 0, binding = 1) readonly buffer X { uint xp[]; };
layout(std430, set = 0, binding = 1) readonly buffer X4 { uvec4 xp4[]; };
layout(std430, set = 0, binding = 1) readonly buffer XF4 { vec4 xf4[]; };
layout(std430, set = 0, binding = 2) readonly buffer NW4 { vec4 nw4[]; };
layout(std430, set = 0, binding = 2) readonly buffer NR { float nr[]; };
layout(std430, set = 0, binding = 3) buffer Y { float y[]; };
layout(std430, set = 0, binding = 4) writeonly buffer P { uint pk[]; };
#ifdef PACK_OUT
layout(std430, set = 0, binding = 5) readonly buffer PW4 { vec4 pw4[]; };
layout(std430, set = 0, binding = 6) writeonly buffer PS { float pss[]; };
layout(std430, set = 0, binding = 7) coherent buffer PD { uint done_wgs[]; };
// Rows the other workgroups of a block added: coherent.
layout(std430, set = 0, binding = 3) coherent buffer YC4 { vec4 yc4[]; };
#endif
#ifdef EXPERT
layout(std430, set = 0, binding = 5) readonly buffer G { uint grp[]; };
layout(std430, set = 0, binding = 6) readonly buffer CW { float cwt[]; };
layout(std430, set = 0, binding = 7) coherent buffer CO { float co[]; };
layout(std430, set = 0, binding = 7) coherent buffer CO4 { vec4 co4[]; };
layout(std430, set = 0, binding = 8) coherent buffer CD { uint done_wgs[]; };
// OUT 6: the next norm's weights and each packed block's sum of squares.
layout(std430, set = 0, binding = 9) readonly buffer PWE4 { vec4 pwe4[]; };
layout(std430, set = 0, binding = 10) writeonly buffer PSE { float pse[]; };
// OUT 3 reads the other workgroups' slot rows: coherent.
layout(std430, set = 0, binding = 3) coherent buffer YC { float yc[]; };
#endif

layout(push_constant) uniform Push {
    uint rows;
    uint cols;
    uint row_bytes;
    uint x_stride;   // values between activation rows
    uint y_stride;   // values between output rows
    uint y_off;
    uint xd_off;     // XIN 0: word offsets of the block scales and sums in binding 1
    uint xs_off;
    float eps;       // XIN 1
    uint up_off;     // OUT 2: byte offset of the up matrix's rows in binding 0
    uint pd_off;     // OUT 2: word offsets of the packed output's scales and sums
    uint ps_off;
#ifdef EXPERT
    uint x_div;      // slots a row of activations
    uint list_off;   // word offset of the slot lists in grp
    uint act_off;    // word offset of the chosen experts in grp
    uint used;       // OUT 3: slots a row
#endif
} p;
#ifdef EXPERT
#include "experts.glsl"
#endif

#define HAVE_WDATA4
#define ROW_COLS p.cols   // formats.glsl: the device's Q8_0 / Q6_K rows hold their scales after the quants
#include "formats.glsl"
#include "dotfmt.glsl"
#include "canon_norm.glsl"
#include "canon_epi.glsl"

shared uint xq[XQW];      // XIN 1: [column][block][8 words] quants of u
shared float xdv[XBW];    // XIN 1: [column][block] d
shared int xsv[XBW];      // XIN 1: [column][block] sum of the quants
shared float xss[XBW];    // XIN 1: [column][block] sum of the squares of x
shared float xcs[NMAX * 32u];   // XIN 1, 3: [column][chunk] the chunks' sums of squares
shared float rr[NMAX];    // XIN 1, 3: r of each column
shared float part[PARTW];   // [subgroup][weight row][column][chunk] chunk partials
shared float hv[HVW];       // OUT 2: [column][tile row] h
shared float fs[FSW];       // [subgroup][weight row][column][lane] a pass's block terms

uint ncol;    // columns of this workgroup's product
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
    return col_out(min(c, ncol - 1u)) / p.x_div;
#else
    return c;
#endif
}

XUnit x_block(uint c, uint b) {
    XUnit x;
    if (XIN == 1u) {
        uint nb = p.cols / 32u;
        uint o = (c * nb + b) * 8u;
        for (uint j = 0u; j < 8u; j++) x.q[j] = xq[o + j];
        x.d = xdv[c * nb + b];
        x.s = xsv[c * nb + b];
    } else {
        uint v = col_x(c) * p.x_stride + b * 32u;   // value index, a multiple of 32
        uvec4 a = xp4[v >> 4], e = xp4[(v >> 4) + 1u];
        x.q = uint[8](a.x, a.y, a.z, a.w, e.x, e.y, e.z, e.w);
        x.d = uintBitsToFloat(xp[p.xd_off + v / 32u]);
        x.s = int(xp[p.xs_off + v / 32u]);
    }
    return x;
}

// XIN 1: quantize u = x * w_norm of the NCOLS rows into shared memory, a thread a block;
// then (XIN 1 and 3) find each row's r from its blocks' sums of squares: a thread a chunk,
// then a thread a row's tree.
void prologue(uint t) {
    uint nb = p.cols / 32u;
    for (uint e = t; XIN == 1u && e < NCOLS * nb; e += WG) {
        uint c = e / nb;
        uint b = e % nb;
        uint xo = (c * p.x_stride + b * 32u) / 4u;
        vec4 xv[8], wv[8];
        for (uint j = 0u; j < 8u; j++) {
            xv[j] = xf4[xo + j];
            wv[j] = nw4[b * 8u + j];
        }
        UBlock ub = canon_ublock(xv, wv);
        for (uint j = 0u; j < 8u; j++) xq[e * 8u + j] = ub.q[j];
        xdv[e] = ub.d;
        xsv[e] = ub.s;
        xss[e] = ub.ss;
    }
    barrier();
    for (uint e = t; e < NCOLS * LPOW; e += WG) {
        uint c = e / LPOW;
        uint l = e % LPOW;
        precise float a = 0.0;
        for (uint j = 0u; j < CB; j++) {
            uint b = l * CB + j;
            if (l < NCH && b < nb) a = a + (XIN == 1u ? xss[c * nb + b] : nr[col_x(c) * nb + b]);
        }
        xcs[c * 32u + l] = a;
    }
    barrier();
    if (t < NCOLS) {
        float v[32];
        for (uint i = 0u; i < LPOW; i++) v[i] = xcs[t * 32u + i];
        rr[t] = canon_r(v, LPOW, p.cols, p.eps);
    }
    barrier();
}

// The pairwise tree over row group rg's chunk partials (+0.0 past the last chunk) for
// column c, and the epilogue; the group's rows start at out0.
void finish(uint rg, uint c, uint out0, uint outs, uint wg, uint tile) {
    float y2[2];
    for (uint k = 0u; k < NVS; k++) {
        float v[32];
        for (uint i = 0u; i < LPOW; i++) v[i] = i < NCH ? part[((rg * 2u + k) * NCOLS + c) * LPOW + i] : 0.0;
        for (uint dd = 1u; dd < LPOW; dd <<= 1)
            for (uint i = 0u; i < LPOW; i += 2u * dd) {
                precise float a = v[i] + v[i + dd];
                v[i] = a;
            }
        y2[k] = v[0];
    }
    for (uint k = 0u; k < outs; k++) {
        uint row = out0 + k;
        if (row >= p.rows) break;
        precise float g = y2[k];
        float r = XIN == 1u || XIN == 3u ? rr[c] : XIN == 2u ? nr[col_x(c)] : 1.0;
        if (XIN != 0u) g = r * g;
        uint yi = col_out(c) * p.y_stride + p.y_off + row;
        if (OUT == 0u || OUT == 3u || OUT == 4u || OUT == 6u) {
            y[yi] = g;
        } else if (OUT == 1u || OUT == 5u) {
            precise float s = g + y[yi];
            y[yi] = s;
        } else {
            hv[c * HMAX + (row - wg * tile)] = canon_glu(y2[0], y2[1], r, XIN != 0u, ACT == 1u);
        }
    }
}

#ifdef PACK_OUT
#define PACK_X4 yc4
#define PACK_W4 pw4
#define PACK_SS pss
#include "pack_next.glsl"
#endif
#ifdef EXPERT
#define PACK_X4 co4
#define PACK_W4 pwe4
#define PACK_SS pse
#include "pack_next.glsl"
#endif
#ifdef EXPERT
// OUT 3, 4 and 6: count this workgroup among its tile's z-slices; the last one sums each step
// row's slots over the tile's rows, in rank order (OUT 6: then packs the next norm's input of
// the rows' 32-row blocks whose tiles it finishes last, its counters after the tiles').
void combine_last(uint wg, uint tile, uint t) {
    if (!finishes_last(wg, gl_NumWorkGroups.z, t)) return;
    uint r0 = wg * tile;
    uint nr = min(tile, p.rows - r0);
    for (uint e = t; e < NCOLS * nr; e += WG) {
        uint c = e / nr;
        uint i = r0 + e % nr;
        precise float acc = 0.0;
        for (uint j = 0u; j < p.used; j++) {
            uint s = c * p.used + j;
            precise float m = cwt[s] * yc[s * p.y_stride + i];
            acc += m;
        }
        if (OUT == 4u || OUT == 6u) {
            precise float sum = co[c * p.y_stride + i] + acc;
            co[c * p.y_stride + i] = sum;
        } else {
            co[c * p.y_stride + i] = acc;
        }
    }
    if (OUT == 6u) pack_next(wg, tile, t, (p.rows + tile - 1u) / tile);
}
#endif

void main() {
    uint wg = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
    uint t = gl_LocalInvocationIndex;
    uint S = gl_SubgroupSize;
    uint lane = gl_SubgroupInvocationID;
    uint nb = p.cols / 32u;
    uint passes = (nb + S - 1u) / S;
    // Output rows a subgroup: NVS rows, or one (OUT 2: its gate and up rows).
    uint outs = OUT == 2u ? 1u : NVS;
    uint groups = NSG / KS;   // row groups the workgroup's subgroups take at once
    uint tile = TP * groups * outs;
#ifdef EXPERT
    if (!expert_slice(ebase, lbase, ncol)) {   // the whole workgroup: past the chosen experts
        if (OUT == 3u || OUT == 4u || OUT == 6u) combine_last(wg, tile, t);
        return;
    }
    ncol = min(ncol, NCOLS);
#else
    ebase = 0u;
    ncol = NCOLS;
#endif
    if (XIN == 1u || XIN == 3u) prologue(t);
    for (uint tp = 0u; tp < TP; tp++) {
        for (uint sg = gl_SubgroupID; sg < NSG; sg += gl_NumSubgroups) {
            // Row group rg's passes over K, in KS runs of whole passes (a pass holds whole
            // chunks where KS is above 1): subgroup sg takes run kp.
            uint rg = sg / KS;
            uint kp = sg % KS;
            uint run = (passes + KS - 1u) / KS;
            uint out0 = wg * tile + (tp * groups + rg) * outs;
            uint roff[2];
            bool live[2];
            for (uint k = 0u; k < NVS; k++) {
                uint row = OUT == 2u ? out0 : out0 + k;
                live[k] = row < p.rows;
                roff[k] = (OUT == 2u ? k * p.up_off : 0u) + (ebase + row) * p.row_bytes;
            }
            precise float acc[2][NMAX];   // a chunk longer than a pass: its running sum
            for (uint k = 0u; k < 2u; k++)
                for (uint c = 0u; c < NMAX; c++) acc[k][c] = 0.0;
            for (uint ps = kp * run; ps < min(passes, (kp + 1u) * run); ps++) {
                uint b = ps * S + lane;
                float f[2][NMAX];
                for (uint k = 0u; k < 2u; k++)
                    for (uint c = 0u; c < NMAX; c++) f[k][c] = 0.0;
                if (b < nb) {
                    uint qw[2][8];
                    vec2 wf[2];
                    ivec2 wi[2];
                    for (uint k = 0u; k < NVS; k++)
                        if (live[k]) dot_load(roff[k], b, qw[k], wf[k], wi[k]);
                    for (uint c = 0u; c < NCOLS; c++) {
                        XUnit x = x_block(c, b);
                        for (uint k = 0u; k < NVS; k++)
                            if (live[k]) f[k][c] = dot_term(qw[k], wf[k], wi[k], x);
                    }
                }
                // Each chunk's blocks left to right from +0.0 (blocks past the row add +0.0,
                // which leaves a sum that is never -0.0 as it was). The pass's block terms go
                // through shared memory and one lane adds each chunk's (a shuffle a term would
                // cost every lane every column's whole chunk).
                uint fo = sg * NVS * NCOLS;   // this subgroup's first [weight row][column]
                for (uint k = 0u; k < NVS; k++)
                    for (uint c = 0u; c < NCOLS; c++) fs[(fo + k * NCOLS + c) * S + lane] = f[k][c];
                subgroupMemoryBarrierShared();
                subgroupBarrier();
                if (CB <= S) {
                    uint per = S / CB;   // chunks a pass
                    for (uint e = lane; e < NVS * NCOLS * per; e += S) {
                        uint kc = e / per;
                        uint j = e % per;
                        uint ch = ps * per + j;
                        precise float a = 0.0;
                        for (uint i = 0u; i < CB; i++) a = a + fs[(fo + kc) * S + j * CB + i];
                        if (ch < NCH) part[((rg * 2u + kc / NCOLS) * NCOLS + kc % NCOLS) * LPOW + ch] = a;
                    }
                } else {
                    // A chunk spans CB / S passes: lane k * NCOLS + c (and every S-th after
                    // it) keeps the running sums of weight row k and column c.
                    uint done = (ps + 1u) * S;
                    bool ends = done % CB == 0u || ps + 1u == passes;
                    uint ch = ps * S / CB;
                    for (uint e = lane; e < NVS * NCOLS; e += S) {
                        uint k = e / NCOLS;
                        uint c = e % NCOLS;
                        for (uint j = 0u; j < S; j++) acc[k][c] = acc[k][c] + fs[(fo + e) * S + j];
                        if (ends) {
                            if (ch < NCH) part[((rg * 2u + k) * NCOLS + c) * LPOW + ch] = acc[k][c];
                            acc[k][c] = 0.0;
                        }
                    }
                }
                subgroupMemoryBarrierShared();
                subgroupBarrier();   // fs is read before the next pass writes it
            }
            if (KS == 1u) {
                // The subgroup wrote all of its rows' chunk partials: lane c takes column c.
                subgroupMemoryBarrierShared();
                subgroupBarrier();
                for (uint c = lane; c < ncol; c += S) finish(rg, c, out0, outs, wg, tile);
                subgroupBarrier();   // part is read before the subgroup's next rows write it
            }
        }
        if (KS > 1u) {
            // KS subgroups wrote each row group's partials: once all are written, the
            // workgroup's threads take (row group, column) pairs.
            barrier();
            for (uint e = t; e < groups * ncol; e += WG) {
                uint rg = e / ncol;
                finish(rg, e % ncol, wg * tile + (tp * groups + rg) * outs, outs, wg, tile);
            }
            barrier();   // part is read before the next rows write it
        }
    }
#ifdef EXPERT
    if (OUT == 3u || OUT == 4u || OUT == 6u) combine_last(wg, tile, t);
#endif
#ifdef PACK_OUT
    if (OUT == 5u) pack_next(wg, tile, t, 0u);
#endif
    if (OUT != 2u) return;
    // Pack each 32 rows of h a column (as qact.comp QPACK 32 would).
    barrier();
    uint blocks = tile / 32u;
    for (uint e = t; e < ncol * blocks; e += WG) {
        uint c = e / blocks;
        uint k = e % blocks;
        uint i0 = wg * tile + k * 32u;
        if (i0 >= p.rows) continue;
        float h[32];
        for (uint i = 0u; i < 32u; i++) h[i] = hv[c * HMAX + k * 32u + i];
        uint q[8];
        float d;
        int s;
        canon_pack(h, q, d, s);
        uint vo = col_out(c) * p.y_stride + p.y_off + i0;   // value index, a multiple of 32
        for (uint j = 0u; j < 8u; j++) pk[vo / 4u + j] = q[j];
        pk[p.pd_off + vo / 32u] = floatBitsToUint(d);
        pk[p.ps_off + vo / 32u] = uint(s);
    }
}
