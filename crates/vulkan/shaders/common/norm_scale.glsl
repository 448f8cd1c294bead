// 1 / rms of a row from its NVT threads' sums of squares (thread t's chunks of 8 values t,
// t + NVT, ... summed in order): the tree over the threads' sums through the includer's shared
// red[NVT], then 1 / sqrt(ss / n + eps). rmsnorm.comp (norm.glsl) and normpack.comp's
// post-norm share it, so a post-norm folded into normpack gives the bits of its own dispatch.
#ifndef RESIN_NORM_SCALE_GLSL
#define RESIN_NORM_SCALE_GLSL
float norm_scale(uint t, float ss, uint n, float eps) {
    red[t] = ss;
    barrier();
    for (uint s = NVT / 2u; s > 0u; s >>= 1) {
        if (t < s) red[t] = red[t] + red[t + s];
        barrier();
    }
    float scale = 1.0 / sqrt(red[0] / float(n) + eps);
    barrier();   // red is read by every thread before it is written again
    return scale;
}
#endif
