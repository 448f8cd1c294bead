// The RMS norm of N rows in the canonical order, ahead of their products (mv.comp XIN 2):
// one workgroup a row writes u = x * w_norm in 32-value int8 blocks (the packed layout of
// src/mv.rs over `count` values) and r = 1 / rms(x) to rs[row], the bits mv.comp's folded
// prologue finds for that row (common/canon_norm.glsl). FUSE_ADD: x += add first, written
// back. FUSE_POST (with FUSE_ADD, gemma3's post-norms): x += rmsnorm(add) * w_post, in
// rmsnorm.comp's arithmetic (common/norm_scale.glsl: the bits of the post-norm dispatch this
// replaces). A thread takes blocks t, t + 256, ...; the chunks' sums of squares and the tree
// follow. WRITE_XN (a mixture of experts' FFN, whose router reads the normed rows in f32):
// also xn = (x * r) * w_norm, rmsnorm.comp's expression with this r, so no norm dispatch runs
// ahead of the pack.
#version 450
#extension GL_GOOGLE_include_directive : require

layout(local_size_x = 256) in;
layout(constant_id = 0) const uint LPOW = 8;   // chunks rounded up to a power of two
layout(constant_id = 1) const uint CB = 8;     // blocks a chunk
layout(constant_id = 2) const uint NCH = 8;    // chunks a row
#define NT 256u
#define MAXB 512u   // blocks a row at most (16384 values)

layout(std430, set = 0, binding = 0) buffer X4 { vec4 x4[]; };
layout(std430, set = 0, binding = 1) readonly buffer Add4 { vec4 add4[]; };
layout(std430, set = 0, binding = 2) readonly buffer W4 { vec4 w4[]; };
layout(std430, set = 0, binding = 3) writeonly buffer P { uint pk[]; };
layout(std430, set = 0, binding = 4) writeonly buffer R { float rs[]; };
#ifdef FUSE_POST
layout(std430, set = 0, binding = 5) readonly buffer WP4 { vec4 wp4[]; };
#endif
#ifdef WRITE_XN
layout(std430, set = 0, binding = 5) writeonly buffer XN4 { vec4 xn4[]; };
shared float rsh;
#endif

layout(push_constant) uniform Push {
    uint cols;    // values a row, a multiple of 32 (NormPackPush::n)
    float eps;
    uint count;   // values of the packed layout (rows * cols)
} p;

#include "canon_norm.glsl"
#ifdef FUSE_POST
shared float red[NT];
#define NS_WIDTH NT
#define NS_RED red
#include "norm_scale.glsl"
#endif

shared float bss[MAXB];
shared float css[32];

void main() {
    uint row = gl_WorkGroupID.x;
    uint t = gl_LocalInvocationID.x;
    uint nb = p.cols / 32u;
    uint d_off = p.count / 4u;
    uint s_off = d_off + p.count / 32u;
#ifdef FUSE_POST
    // The addend's 1 / rms as rmsnorm.comp finds it: thread t's chunks of 8 values t, t + NT,
    // ... in order, then norm_scale's tree.
    precise float ss = 0.0;
    for (uint c = t; c < p.cols / 8u; c += NT) {
        uint q = (row * p.cols + c * 8u) / 4u;
        vec4 v0 = add4[q], v1 = add4[q + 1u];
        for (uint i = 0u; i < 4u; i++) ss += v0[i] * v0[i];
        for (uint i = 0u; i < 4u; i++) ss += v1[i] * v1[i];
    }
    float ra = norm_scale(t, ss, p.cols, p.eps);
#endif
    for (uint b = t; b < nb; b += NT) {
        uint v = row * p.cols + b * 32u;   // value index, a multiple of 32
        vec4 xv[8], wv[8];
        for (uint j = 0u; j < 8u; j++) {
            vec4 a = x4[v / 4u + j];
#ifdef FUSE_ADD
            precise vec4 ad = add4[v / 4u + j];
#ifdef FUSE_POST
            ad = (ad * ra) * wp4[b * 8u + j];
#endif
            precise vec4 sum = a + ad;
            x4[v / 4u + j] = sum;
            a = sum;
#endif
            xv[j] = a;
            wv[j] = w4[b * 8u + j];
        }
        UBlock ub = canon_ublock(xv, wv);
        for (uint j = 0u; j < 8u; j++) pk[v / 4u + j] = ub.q[j];
        pk[d_off + v / 32u] = floatBitsToUint(ub.d);
        pk[s_off + v / 32u] = uint(ub.s);
        bss[b] = ub.ss;
    }
    barrier();
    if (t < LPOW) {
        precise float a = 0.0;
        for (uint j = 0u; j < CB; j++) {
            uint b = t * CB + j;
            if (t < NCH && b < nb) a = a + bss[b];
        }
        css[t] = a;
    }
    barrier();
    if (t == 0u) {
        float v[32];
        for (uint i = 0u; i < LPOW; i++) v[i] = css[i];
        float r = canon_r(v, LPOW, p.cols, p.eps);
        rs[row] = r;
#ifdef WRITE_XN
        rsh = r;
#endif
    }
#ifdef WRITE_XN
    barrier();
    float r = rsh;
    // The thread's own blocks, whose sums it wrote above.
    for (uint b = t; b < nb; b += NT) {
        uint v = row * p.cols + b * 32u;
        for (uint j = 0u; j < 8u; j++) {
            precise vec4 o = (x4[v / 4u + j] * r) * w4[b * 8u + j];
            xn4[v / 4u + j] = o;
        }
    }
#endif
}
