// Activations rounded as the CPU home's integer dot products see them: each block of QBLOCK
// values (32 for the Q4_0..Q8_0 family, 256 for the K-quants) becomes d * q with
// d = amax / 127 and q = round_ties_even(x * 127 / amax) (ggml's q8_0 / q8_K rounding).
// The GEMV then reads these values, so both homes multiply the same numbers.
#version 450

layout(local_size_x = 64) in;

layout(std430, set = 0, binding = 0) readonly buffer X { float x[]; };
layout(std430, set = 0, binding = 1) writeonly buffer Y { float y[]; };

layout(push_constant) uniform Push {
    uint count;
} p;

void main() {
    uint b = gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * gl_NumWorkGroups.x * 64u;
    uint o = b * QBLOCK;
    if (o >= p.count) return;
    float amax = 0.0;
    for (uint i = 0u; i < QBLOCK; i++) amax = max(amax, abs(x[o + i]));
    float d = amax / 127.0;
    float id = amax > 0.0 ? 127.0 / amax : 0.0;
    for (uint i = 0u; i < QBLOCK; i++) {
        precise float q = roundEven(x[o + i] * id);
        precise float v = q * d;
        y[o + i] = v;
    }
}
