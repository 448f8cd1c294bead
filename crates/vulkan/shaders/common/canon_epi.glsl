// The canonical product's epilogue pieces that mv.comp (1..8 rows) and mm.comp (more) share,
// so a row's outputs are the same bits whichever ran (docs/canonical-order.md, section 5).
#ifndef RESIN_CANON_EPI_GLSL
#define RESIN_CANON_EPI_GLSL

#include "act.glsl"

// h = act(g) * u of a gate and up product's finished sums (act: silu, or with `gelu` GELU's
// tanh form: GeGLU), each scaled by the row's r first where the norm was folded (scaled).
float canon_glu(float g0, float u0, float r, bool scaled, bool gelu) {
    precise float g = g0;
    precise float u = u0;
    if (scaled) {
        g = r * g;
        u = r * u;
    }
    precise float h;
    if (gelu) {
        h = gelu_tanh(g) * u;
    } else {
        h = g / (1.0 + exp(-g)) * u;
    }
    return h;
}

// 32 values packed as a product's activation block (qact.comp QPACK 32's rules; the
// canonical norm's blocks too): quants (value 4j+k in byte k of q[j]), d and the sum of the
// quants.
void canon_pack(float h[32], out uint q[8], out float d, out int s) {
    float amax = 0.0;
    for (uint i = 0u; i < 32u; i++) amax = max(amax, abs(h[i]));
    d = amax / 127.0;
    float id = amax > 0.0 ? 127.0 / amax : 0.0;
    s = 0;
    for (uint j = 0u; j < 8u; j++) {
        uint w = 0u;
        for (uint k = 0u; k < 4u; k++) {
            precise float qf = roundEven(h[4u * j + k] * id);
            int v = int(qf);
            s += v;
            w |= (uint(v) & 0xFFu) << (8u * k);
        }
        q[j] = w;
    }
}

#endif
