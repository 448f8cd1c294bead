// The next norm's input of whole residual rows, packed by the workgroup that finishes a
// 32-row block of them last: u = x * w_next in 32-value blocks (canon_ublock, normpack.comp's
// arithmetic) at `pk` (scales at p.pd_off, sums at p.ps_off) and each block's sum of the
// squares of x, so the next N-row products read it (XIN 3) with no norm dispatch and barrier
// of their own. The includer defines PACK_X4 (the residual rows as vec4, coherent: other
// workgroups wrote them), PACK_W4 (the next norm's weights as vec4) and PACK_SS (the sums of
// squares), declares `pk` and `done_wgs`, and has the push fields y_off, rows, y_stride,
// pd_off and ps_off (the rows' span and stride in PACK_X4).
#ifndef RESIN_PACK_NEXT_GLSL
#define RESIN_PACK_NEXT_GLSL
#include "last_wg.glsl"

// Workgroup wg (taking `tile` rows of the product) counts itself among those of its 32-row
// blocks (G workgroups a block where a workgroup takes fewer rows, else B blocks a
// workgroup), its counters from word `at` of done_wgs; the last one packs the blocks of
// every column.
void pack_next(uint wg, uint tile, uint t, uint at) {
    uint G = tile < 32u ? 32u / tile : 1u;
    uint B = tile < 32u ? 1u : tile / 32u;
    uint b0 = (p.y_off + (wg / G) * G * tile) / 32u;   // the group's first block of the rows
    if (!finishes_last(at + b0, G, t)) return;
    uint nbr = p.y_stride / 32u;   // blocks a residual row
    for (uint e = t; e < NCOLS * B; e += WG) {
        uint c = e / B;
        uint b = b0 + e % B;
        if (b * 32u >= p.y_off + p.rows) continue;
        uint v = c * p.y_stride + b * 32u;   // value index, a multiple of 32
        vec4 xv[8], wv[8];
        for (uint j = 0u; j < 8u; j++) {
            xv[j] = PACK_X4[v / 4u + j];
            wv[j] = PACK_W4[b * 8u + j];
        }
        UBlock ub = canon_ublock(xv, wv);
        for (uint j = 0u; j < 8u; j++) pk[v / 4u + j] = ub.q[j];
        pk[p.pd_off + v / 32u] = floatBitsToUint(ub.d);
        pk[p.ps_off + v / 32u] = uint(ub.s);
        PACK_SS[c * nbr + b] = ub.ss;
    }
}
#endif
