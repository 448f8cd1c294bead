// Activations rounded as the CPU home's integer dot products see them: each block of QBLOCK
// values (32 for the Q4_0..Q8_0 family, 256 for the K-quants) becomes d * q with
// d = amax / 127 and q = round_ties_even(x * 127 / amax) (ggml's q8_0 / q8_K rounding).
// The GEMV then reads these values, so both homes multiply the same numbers.
// A workgroup takes 256 chunks of 8 values (2048 values, whole blocks): each thread finds its
// chunk's amax, a block's amax is the max of its chunks' (in shared memory), each thread
// rounds its own chunk.
// QPACK (the int8 dot GEMV's input, src/gemv_dot.rs): the same rounding, written packed into
// one uint buffer for `count` values:
//   words [0, count/4): the quants q as int8, 4 a word (value 4i+k in byte k of word i);
//   words [count/4, count/4 + count/QBLOCK): d of each block (f32 bits, the same d as above);
//   words [s_off, s_off + count/SUMG), s_off = count/4 + count/QBLOCK: the sum of the int
//   quants of each SUMG values (int32; SUMG = 32 for QBLOCK 32, 16 for QBLOCK 256).
// float(q) * d of the packed form is qact's output bit for bit.
// SWIGLU: the values rounded are silu(g) * u of two inputs (swiglu.comp's arithmetic, bit for
// bit), so the FFN's product needs no dispatch and barrier of its own before the down matrix;
// with GELU too, gelu_tanh(g) * u (swiglu.comp GELU's).
#version 450
#extension GL_GOOGLE_include_directive : require
#include "act.glsl"

#define CH 8u
#define WGQ 256u
layout(local_size_x = 256) in;

// Every access is 16 (or 8) bytes: a thread's chunk of 8 values is 32-byte aligned (count and
// the bindings' starts are multiples of 8 values), so a subgroup touches a quarter of the
// memory sectors that one float at a time did.
#ifdef SWIGLU
layout(std430, set = 0, binding = 0) readonly buffer G { vec4 g4[]; };
layout(std430, set = 0, binding = 1) readonly buffer U { vec4 u4[]; };
#define OUT_BINDING 2
#else
layout(std430, set = 0, binding = 0) readonly buffer X { vec4 x4[]; };
#define OUT_BINDING 1
#endif
#ifdef QPACK
layout(std430, set = 0, binding = OUT_BINDING) writeonly buffer Y { uint P[]; };
layout(std430, set = 0, binding = OUT_BINDING) writeonly buffer Y2 { uvec2 P2[]; };
#define SUMG (QBLOCK == 256u ? 16u : 32u)
shared int ps[WGQ];
#else
layout(std430, set = 0, binding = OUT_BINDING) writeonly buffer Y { vec4 y4[]; };
#endif

layout(push_constant) uniform Push {
    uint count;
} p;

shared float pm[WGQ];

void main() {
    uint wg = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
    uint t = gl_LocalInvocationID.x;
    uint o = (wg * WGQ + t) * CH;
    float amax = 0.0;
    float xv[CH];
    if (o < p.count) {
#ifdef SWIGLU
        vec4 ga = g4[o >> 2], gb = g4[(o >> 2) + 1u];
        vec4 ua = u4[o >> 2], ub = u4[(o >> 2) + 1u];
#else
        vec4 xa = x4[o >> 2], xb = x4[(o >> 2) + 1u];
#endif
        for (uint i = 0u; i < CH; i++) {
#ifdef SWIGLU
            float a = i < 4u ? ga[i] : gb[i - 4u];
#ifdef GELU
            precise float v = gelu_tanh(a) * (i < 4u ? ua[i] : ub[i - 4u]);
#else
            precise float v = a / (1.0 + exp(-a)) * (i < 4u ? ua[i] : ub[i - 4u]);
#endif
#else
            float v = i < 4u ? xa[i] : xb[i - 4u];
#endif
            xv[i] = v;
            amax = max(amax, abs(v));
        }
    }
    pm[t] = amax;
    barrier();
#ifdef QPACK
    // No early return: a second barrier follows.
    bool live = o < p.count;
    int qsum = 0;
    if (live) {
        uint per = QBLOCK / CH;
        uint t0 = (t / per) * per;
        float bmax = 0.0;
        for (uint j = t0; j < t0 + per; j++) bmax = max(bmax, pm[j]);
        float d = bmax / 127.0;
        float id = bmax > 0.0 ? 127.0 / bmax : 0.0;
        uint wd[2] = uint[2](0u, 0u);
        for (uint i = 0u; i < CH; i++) {
            precise float q = roundEven(xv[i] * id);
            int qi = int(q);
            qsum += qi;
            wd[i >> 2] |= (uint(qi) & 0xFFu) << ((i & 3u) * 8u);
        }
        P2[o >> 3] = uvec2(wd[0], wd[1]);
        if (t == t0) P[(p.count >> 2) + o / QBLOCK] = floatBitsToUint(d);
    }
    ps[t] = qsum;
    barrier();
    uint gper = SUMG / CH;
    if (live && (t % gper) == 0u) {
        int s = 0;
        for (uint j = 0u; j < gper; j++) s += ps[t + j];
        P[(p.count >> 2) + p.count / QBLOCK + o / SUMG] = uint(s);
    }
}
#else
    if (o >= p.count) return;
    uint per = QBLOCK / CH;
    uint t0 = (t / per) * per;
    float bmax = 0.0;
    for (uint j = t0; j < t0 + per; j++) bmax = max(bmax, pm[j]);
    float d = bmax / 127.0;
    float id = bmax > 0.0 ? 127.0 / bmax : 0.0;
    float yv[CH];
    for (uint i = 0u; i < CH; i++) {
        precise float q = roundEven(xv[i] * id);
        precise float v = q * d;
        yv[i] = v;
    }
    y4[o >> 2] = vec4(yv[0], yv[1], yv[2], yv[3]);
    y4[(o >> 2) + 1u] = vec4(yv[4], yv[5], yv[6], yv[7]);
}
#endif
