// The RMS norm of the canonical order (docs/canonical-order.md, sections 1 and 5): a block of
// u = x * w_norm quantized to int8 with x's sum of squares, and r = 1 / rms(x) from the
// chunks' sums of squares by the pairwise tree. mv.comp's one-row prologue and normpack.comp
// (the norm of N rows, ahead of the product) both call these, so a row's quants and r are the
// same bits whichever of them ran.
#ifndef RESIN_CANON_NORM_GLSL
#define RESIN_CANON_NORM_GLSL

#include "canon_epi.glsl"

// One 32-value block: quants (value 4j+k in byte k of q[j]), d, the sum of the quants, and
// the sum of the squares of x, added left to right.
struct UBlock {
    uint q[8];
    float d;
    int s;
    float ss;
};

UBlock canon_ublock(vec4 xv[8], vec4 wv[8]) {
    UBlock o;
    float u[32];
    precise float ss = 0.0;
    for (uint j = 0u; j < 8u; j++)
        for (uint i = 0u; i < 4u; i++) {
            precise float uv = xv[j][i] * wv[j][i];
            precise float sq = xv[j][i] * xv[j][i];
            u[4u * j + i] = uv;
            ss = ss + sq;
        }
    canon_pack(u, o.q, o.d, o.s);
    o.ss = ss;
    return o;
}

// r of a row of `cols` values from its chunks' sums of squares v[0 .. lpow) (+0.0 past the
// last chunk): the pairwise tree, then 1 / sqrt(ss / cols + eps).
float canon_r(float v[32], uint lpow, uint cols, float eps) {
    for (uint dd = 1u; dd < lpow; dd <<= 1)
        for (uint i = 0u; i < lpow; i += 2u * dd) {
            precise float a = v[i] + v[i + dd];
            v[i] = a;
        }
    precise float ms = v[0] / float(cols) + eps;
    return 1.0 / sqrt(ms);
}

#endif
