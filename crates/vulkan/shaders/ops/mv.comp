// y = W x in the canonical order (docs/canonical-order.md) for NCOLS activation rows at once:
// the token command's matrix product, with the stage's norm folded into its prologue and its
// residual add or SwiGLU in its epilogue (src/mv.rs).
// A row of W is cut into NCH chunks of CB blocks of 32 values (resin_core::canon::Cut: fixed
// by the row length alone). A workgroup takes a tile of TR weight rows, WG / LPR at a time:
// lane l of a row (LPR lanes, NCH rounded up to a power of two) sums the blocks of chunk l
// left to right (dotfmt.glsl: an exact integer dot of the weight quants with the activation
// quants, then the format's float expression), the lanes' partials are added by the pairwise
// tree (subgroupShuffleXor where a row's lanes share a subgroup, else the same pairs through
// shared memory), then the epilogue. No float operation's order depends on NCOLS, the tile or
// the device's subgroup size, so a row's result is the same bits in every form.
// Input (specialization constant XIN):
// - 0: activations packed in 32-value int8 blocks (qact.comp QPACK 32, or what the attention
//   combine or a SwiGLU epilogue wrote): binding 1, block scales at xd_off, sums at xs_off.
// - 1: f32 rows (binding 1) with the RMS norm folded: each workgroup quantizes u = x * w_norm
//   (binding 2) of its NCOLS rows into shared memory (the quants of u do not depend on the
//   row's scale) and sums the squares of x block by block, chunk by chunk and by the tree;
//   r = 1 / sqrt(ss / K + eps) scales the finished product.
// Output (specialization constant OUT), row i of column c at c * y_stride + y_off + i:
// - 0: y = (r *) y' stored (binding 3).
// - 1: y = y' + y (the residual sum, binding 3).
// - 2: SwiGLU: weight rows i and up_off + i (the gate and up matrices, one binding) are taken
//   together, h = silu(g) * u, and each 32 rows of h are packed as the next matrix's input
//   (QPACK 32 at binding 4: quants, d at pd_off, sums at ps_off).
// Forms: FORM_ONE (NCOLS = 1 at compile time) and the N-row form (NCOLS a specialization
// constant, 1..8). DOT_HW: the integer dot products by OpSDot (dotfmt.glsl).
#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#ifdef DOT_HW
#extension GL_EXT_spirv_intrinsics : require
#endif

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 64;
layout(constant_id = 1) const uint NCOLS_SC = 1;
layout(constant_id = 2) const uint LPR = 8;     // lanes a row: NCH rounded up to a power of two
layout(constant_id = 3) const uint CB = 8;      // blocks a chunk
layout(constant_id = 4) const uint NCH = 8;     // chunks a row
layout(constant_id = 5) const uint XIN = 0;
layout(constant_id = 6) const uint OUT = 0;
layout(constant_id = 7) const uint XQW = 1;     // shared words of the quantized rows (XIN 1)
layout(constant_id = 8) const uint XBW = 1;     // shared blocks of the quantized rows (XIN 1)
layout(constant_id = 9) const uint REDW = 1;    // shared floats of the tree through memory
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
layout(std430, set = 0, binding = 1) readonly buffer XF { float xf[]; };
layout(std430, set = 0, binding = 2) readonly buffer NW { float nw[]; };
layout(std430, set = 0, binding = 3) buffer Y { float y[]; };
layout(std430, set = 0, binding = 4) writeonly buffer P { uint pk[]; };

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
} p;

#define HAVE_WDATA4
#define ROW_COLS p.cols   // formats.glsl: the device's Q8_0 / Q6_K rows hold their scales after the quants
#include "formats.glsl"
#include "dotfmt.glsl"

shared uint xq[XQW];      // XIN 1: [column][block][8 words] quants of u
shared float xdv[XBW];    // XIN 1: [column][block] d
shared int xsv[XBW];      // XIN 1: [column][block] sum of the quants
shared float xss[XBW];    // XIN 1: [column][block] sum of the squares of x
shared float rr[NMAX];    // XIN 1: r of each column
shared float red[REDW];   // the tree through shared memory: [thread][value]
shared float hv[NMAX * HMAX];   // OUT 2: [column][tile row] h

XUnit x_block(uint c, uint b) {
    XUnit x;
    if (XIN == 1u) {
        uint nb = p.cols / 32u;
        uint o = (c * nb + b) * 8u;
        for (uint j = 0u; j < 8u; j++) x.q[j] = xq[o + j];
        x.d = xdv[c * nb + b];
        x.s = xsv[c * nb + b];
    } else {
        uint v = c * p.x_stride + b * 32u;   // value index, a multiple of 32
        uvec4 a = xp4[v >> 4], e = xp4[(v >> 4) + 1u];
        x.q = uint[8](a.x, a.y, a.z, a.w, e.x, e.y, e.z, e.w);
        x.d = uintBitsToFloat(xp[p.xd_off + v / 32u]);
        x.s = int(xp[p.xs_off + v / 32u]);
    }
    return x;
}

// Quantize u = x * w_norm of the NCOLS rows into shared memory and find each row's r.
void prologue(uint t) {
    uint nb = p.cols / 32u;
    for (uint e = t; e < NCOLS * nb; e += WG) {
        uint c = e / nb;
        uint b = e % nb;
        uint xo = c * p.x_stride + b * 32u;
        float u[32];
        float amax = 0.0;
        precise float ss = 0.0;
        for (uint i = 0u; i < 32u; i++) {
            float xv = xf[xo + i];
            precise float uv = xv * nw[b * 32u + i];
            precise float sq = xv * xv;
            u[i] = uv;
            amax = max(amax, abs(uv));
            ss = ss + sq;
        }
        float d = amax / 127.0;
        float id = amax > 0.0 ? 127.0 / amax : 0.0;
        int s = 0;
        for (uint j = 0u; j < 8u; j++) {
            uint w = 0u;
            for (uint k = 0u; k < 4u; k++) {
                precise float qf = roundEven(u[4u * j + k] * id);
                int q = int(qf);
                s += q;
                w |= (uint(q) & 0xFFu) << (8u * k);
            }
            xq[e * 8u + j] = w;
        }
        xdv[e] = d;
        xsv[e] = s;
        xss[e] = ss;
    }
    barrier();
    if (t < NCOLS) {
        float part[32];
        for (uint l = 0u; l < LPR; l++) {
            precise float a = 0.0;
            for (uint j = 0u; j < CB; j++) {
                uint b = l * CB + j;
                if (l < NCH && b < nb) a = a + xss[t * nb + b];
            }
            part[l] = a;
        }
        for (uint dd = 1u; dd < LPR; dd <<= 1)
            for (uint i = 0u; i < LPR; i += 2u * dd) {
                precise float a = part[i] + part[i + dd];
                part[i] = a;
            }
        precise float ms = part[0] / float(p.cols) + p.eps;
        rr[t] = 1.0 / sqrt(ms);
    }
    barrier();
}

void main() {
    uint wg = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
    uint t = gl_LocalInvocationIndex;
    // A row's lanes in one subgroup where they fit (the tree by shuffles), else by thread index
    // (the tree through shared memory).
    bool in_sg = LPR <= gl_SubgroupSize;
    uint lane = in_sg ? gl_SubgroupInvocationID % LPR : t % LPR;
    uint slot = in_sg ? gl_SubgroupID * (gl_SubgroupSize / LPR) + gl_SubgroupInvocationID / LPR : t / LPR;
    uint rpw = WG / LPR;
    uint tr = OUT == 2u ? max(32u, rpw) : rpw;
    uint nb = p.cols / 32u;
    uint NV = OUT == 2u ? 2u : 1u;   // values a column a row: the gate and the up row
    if (XIN == 1u) prologue(t);
    for (uint r0 = 0u; r0 < tr; r0 += rpw) {
        uint row = wg * tr + r0 + slot;
        precise float acc[2][NMAX];
        for (uint v = 0u; v < 2u; v++)
            for (uint c = 0u; c < NMAX; c++) acc[v][c] = 0.0;
        if (row < p.rows && lane < NCH) {
            for (uint j = 0u; j < CB; j++) {
                uint b = lane * CB + j;
                if (b >= nb) break;
                uint qw[2][8];
                vec2 wf[2];
                ivec2 wi[2];
                for (uint v = 0u; v < NV; v++) dot_load(v * p.up_off + row * p.row_bytes, b, qw[v], wf[v], wi[v]);
                for (uint c = 0u; c < NCOLS; c++) {
                    XUnit x = x_block(c, b);
                    for (uint v = 0u; v < NV; v++) {
                        precise float f = dot_term(qw[v], wf[v], wi[v], x);
                        acc[v][c] = acc[v][c] + f;
                    }
                }
            }
        }
        // The pairwise tree over the row's lanes: lane i adds lane i ^ d's value, d = 1, 2, 4...
        if (in_sg) {
            for (uint dd = 1u; dd < LPR; dd <<= 1)
                for (uint v = 0u; v < NV; v++)
                    for (uint c = 0u; c < NCOLS; c++) {
                        precise float s = acc[v][c] + subgroupShuffleXor(acc[v][c], dd);
                        acc[v][c] = s;
                    }
        } else {
            uint vals = NV * NCOLS;
            for (uint v = 0u; v < NV; v++)
                for (uint c = 0u; c < NCOLS; c++) red[t * vals + v * NCOLS + c] = acc[v][c];
            barrier();
            for (uint dd = 1u; dd < LPR; dd <<= 1) {
                if ((lane & (2u * dd - 1u)) == 0u)
                    for (uint k = 0u; k < vals; k++) {
                        precise float s = red[t * vals + k] + red[(t + dd) * vals + k];
                        red[t * vals + k] = s;
                    }
                barrier();
            }
            for (uint v = 0u; v < NV; v++)
                for (uint c = 0u; c < NCOLS; c++) acc[v][c] = red[t * vals + v * NCOLS + c];
            barrier();   // red is read before the next rows write it
        }
        if (lane == 0u && row < p.rows) {
            for (uint c = 0u; c < NCOLS; c++) {
                precise float g = acc[0][c];
                precise float u = acc[1][c];
                if (XIN == 1u) {
                    g = rr[c] * g;
                    u = rr[c] * u;
                }
                uint yi = c * p.y_stride + p.y_off + row;
                if (OUT == 0u) {
                    y[yi] = g;
                } else if (OUT == 1u) {
                    precise float s = g + y[yi];
                    y[yi] = s;
                } else {
                    precise float h = g / (1.0 + exp(-g)) * u;
                    hv[c * HMAX + r0 + slot] = h;
                }
            }
        }
    }
    if (OUT != 2u) return;
    // Pack each 32 rows of h a column (as qact.comp QPACK 32 would).
    barrier();
    uint blocks = tr / 32u;
    for (uint e = t; e < NCOLS * blocks; e += WG) {
        uint c = e / blocks;
        uint k = e % blocks;
        uint i0 = wg * tr + k * 32u;
        if (i0 >= p.rows) continue;
        float amax = 0.0;
        for (uint i = 0u; i < 32u; i++) amax = max(amax, abs(hv[c * HMAX + k * 32u + i]));
        float d = amax / 127.0;
        float id = amax > 0.0 ? 127.0 / amax : 0.0;
        uint vo = c * p.y_stride + p.y_off + i0;   // value index, a multiple of 32
        int s = 0;
        for (uint j = 0u; j < 8u; j++) {
            uint w = 0u;
            for (uint q4 = 0u; q4 < 4u; q4++) {
                precise float qf = roundEven(hv[c * HMAX + k * 32u + 4u * j + q4] * id);
                int q = int(qf);
                s += q;
                w |= (uint(q) & 0xFFu) << (8u * q4);
            }
            pk[vo / 4u + j] = w;
        }
        pk[p.pd_off + vo / 32u] = floatBitsToUint(d);
        pk[p.ps_off + vo / 32u] = uint(s);
    }
}
