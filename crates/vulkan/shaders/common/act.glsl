// The FFN's gate activations other than silu (which swiglu.comp and qact.comp write inline).
#ifndef RESIN_ACT_GLSL
#define RESIN_ACT_GLSL
// GELU with the tanh approximation (gemma's GeGLU): 0.5 x (1 + tanh(v)),
// v = sqrt(2/pi) (x + 0.044715 x^3), with 1 + tanh(v) written as 2 - 2 / (exp(2v) + 1) so that
// a large |v| saturates to 2 or 0 instead of dividing infinities.
// Its operations are precise (no contraction), so every kernel that includes it gives the
// same bits.
float gelu_tanh(float x) {
    precise float v = 0.7978846 * x * (1.0 + 0.044715 * x * x);
    precise float y = 0.5 * x * (2.0 - 2.0 / (exp(2.0 * v) + 1.0));
    return y;
}
#endif
