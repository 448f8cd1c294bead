// The rope's arithmetic, shared by rope-and-store (rope_store.comp) and the decode attention
// that ropes its own row's q, k and v (attn.comp ROPE_IN), so both write the same bits.
#ifndef RESIN_ROPE_GLSL
#define RESIN_ROPE_GLSL

// A value plus its bias.
float with_bias(float a, float b) {
    precise float x = a + b;
    return x;
}

// The pair (a, b) rotated by the angle whose cosine and sine are c and s.
void rope_rotate(float a, float b, float c, float s, out float o0, out float o1) {
    precise float x0 = a * c - b * s;
    precise float x1 = a * s + b * c;
    o0 = x0;
    o1 = x1;
}

// The dims rotated together as pair i (< rope_dims / 2): halves (NEOX) or neighbours (NORM).
void rope_pair(uint i, uint half_r, bool neox, out uint i0, out uint i1) {
    i0 = neox ? i : 2u * i;
    i1 = neox ? i + half_r : 2u * i + 1u;
}

// An f16 mirror's value range.
float clamp_half(float x) { return clamp(x, -65504.0, 65504.0); }
#endif
