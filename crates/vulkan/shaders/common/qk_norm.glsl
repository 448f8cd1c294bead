// The QK norm of one head held in shared memory (qwen3, gemma3): h[off + i] = h[off + i] *
// (scale * w[woff + i]) over head_dim values, scale = 1 / rms of the head, its squares summed
// by thread t over i = t, t + WG, ... and then the tree over the WG threads' sums. rope_store.comp
// and the attention's own rope (attn.comp ROPE_IN) both run it, so a row's q and k have the
// same bits either way. The includer defines QK_H (the shared head values), QK_W (the norm
// weights, q's then k's) and QK_RED (shared, WG floats); every thread of the workgroup calls it.
#ifndef RESIN_QK_NORM_GLSL
#define RESIN_QK_NORM_GLSL
void qk_norm_head(uint t, uint hd, uint off, uint woff, float eps) {
    precise float ss = 0.0;
    for (uint i = t; i < hd; i += WG) ss += QK_H[off + i] * QK_H[off + i];
    QK_RED[t] = ss;
    barrier();
    for (uint s = WG / 2u; s > 0u; s >>= 1) {
        if (t < s) QK_RED[t] = QK_RED[t] + QK_RED[t + s];
        barrier();
    }
    float scale = 1.0 / sqrt(QK_RED[0] / float(hd) + eps);
    barrier();
    for (uint i = t; i < hd; i += WG) {
        precise float o = QK_H[off + i] * (scale * QK_W[woff + i]);
        QK_H[off + i] = o;
    }
    barrier();
}
#endif
