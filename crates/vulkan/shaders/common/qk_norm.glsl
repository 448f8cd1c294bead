// The QK norm of one head held in shared memory (qwen3, gemma3): h[off + i] = h[off + i] *
// (scale * w[woff + i]) over head_dim values, scale = 1 / rms of the head (its squares summed
// by thread t over i = t, t + WG, ..., then norm_scale.glsl's tree). rope_store.comp and the
// attention's own rope (attn.comp ROPE_IN) both run it, so a row's q and k have the same bits
// either way. The includer defines QK_H (the shared head values), QK_W (the norm weights, q's
// then k's) and QK_RED (shared, WG floats); every thread of the workgroup calls it.
#ifndef RESIN_QK_NORM_GLSL
#define RESIN_QK_NORM_GLSL
#define NS_WIDTH WG
#define NS_RED QK_RED
#include "norm_scale.glsl"
void qk_norm_head(uint t, uint hd, uint off, uint woff, float eps) {
    precise float ss = 0.0;
    for (uint i = t; i < hd; i += WG) ss += QK_H[off + i] * QK_H[off + i];
    float scale = norm_scale(t, ss, hd, eps);
    for (uint i = t; i < hd; i += WG) {
        precise float o = QK_H[off + i] * (scale * QK_W[woff + i]);
        QK_H[off + i] = o;
    }
    barrier();
}
#endif
