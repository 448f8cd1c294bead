// 1 / rms of a row from its NS_WIDTH threads' sums of squares (thread t's values t, t +
// NS_WIDTH, ... or its chunks of them, summed in order): the tree over the threads' sums
// through the includer's shared NS_RED[NS_WIDTH], then 1 / sqrt(ss / n + eps). rmsnorm.comp
// (norm.glsl), normpack.comp's post-norm and the QK norm (qk_norm.glsl) share it, so a norm
// folded into another kernel gives the bits of its own dispatch. The includer defines
// NS_WIDTH and NS_RED; every thread of the workgroup calls it.
#ifndef RESIN_NORM_SCALE_GLSL
#define RESIN_NORM_SCALE_GLSL
float norm_scale(uint t, float ss, uint n, float eps) {
    NS_RED[t] = ss;
    barrier();
    for (uint s = NS_WIDTH / 2u; s > 0u; s >>= 1) {
        if (t < s) NS_RED[t] = NS_RED[t] + NS_RED[t + s];
        barrier();
    }
    float scale = 1.0 / sqrt(NS_RED[0] / float(n) + eps);
    barrier();   // NS_RED is read by every thread before it is written again
    return scale;
}
#endif
