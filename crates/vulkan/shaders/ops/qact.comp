// Activations rounded as the CPU home's integer dot products see them: each block of QBLOCK
// values (32 for the Q4_0..Q8_0 family, 256 for the K-quants) becomes d * q with
// d = amax / 127 and q = round_ties_even(x * 127 / amax) (ggml's q8_0 / q8_K rounding).
// The GEMV then reads these values, so both homes multiply the same numbers.
// A workgroup takes 256 chunks of 8 values (2048 values, whole blocks): each thread finds its
// chunk's amax, a block's amax is the max of its chunks' (in shared memory), each thread
// rounds its own chunk.
#version 450

#define CH 8u
#define WGQ 256u
layout(local_size_x = 256) in;

layout(std430, set = 0, binding = 0) readonly buffer X { float x[]; };
layout(std430, set = 0, binding = 1) writeonly buffer Y { float y[]; };

layout(push_constant) uniform Push {
    uint count;
} p;

shared float pm[WGQ];

void main() {
    uint wg = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
    uint t = gl_LocalInvocationID.x;
    uint o = (wg * WGQ + t) * CH;
    float amax = 0.0;
    if (o < p.count) {
        for (uint i = 0u; i < CH; i++) amax = max(amax, abs(x[o + i]));
    }
    pm[t] = amax;
    barrier();
    if (o >= p.count) return;
    uint per = QBLOCK / CH;
    uint t0 = (t / per) * per;
    float bmax = 0.0;
    for (uint j = t0; j < t0 + per; j++) bmax = max(bmax, pm[j]);
    float d = bmax / 127.0;
    float id = bmax > 0.0 ? 127.0 / bmax : 0.0;
    for (uint i = 0u; i < CH; i++) {
        precise float q = roundEven(x[o + i] * id);
        precise float v = q * d;
        y[o + i] = v;
    }
}
