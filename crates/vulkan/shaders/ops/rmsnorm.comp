// RMS norm of each row, with the residual add fused in front (FUSE_ADD):
//   x[r] += add[r] (written back), out[r] = x[r] / rms(x[r]) * w
// One workgroup a row. Each thread owns the row's 8-value chunks t, t + WG, ... in every
// phase, so it only ever reads back its own writes (no coherent buffers, no extra barriers),
// and keeps its first KMAX chunks of x, w and the output in registers (one load each).
// QACT: also write out rounded through 8-bit blocks (qact.comp's arithmetic, bit for bit) to
// q32 (blocks of 32, when QMASK & 1) and q256 (blocks of 256, when QMASK & 2), so the rounding
// needs no dispatch and barrier of its own: each chunk's amax goes to shared memory, a block's
// amax is the max of its chunks', and each thread rounds its own chunks.
#version 450

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 256;

#define CH 8u
#ifdef QACT
layout(constant_id = 1) const uint QMASK = 3;
#ifdef QPACK
// Packed for the int8 dot GEMV (qact.comp QPACK's layout over the pass's `count` values).
layout(std430, set = 0, binding = 4) writeonly buffer P32 { uint p32[]; };
layout(std430, set = 0, binding = 5) writeonly buffer P256 { uint p256[]; };
shared int ps[2048];
#else
layout(std430, set = 0, binding = 4) writeonly buffer Q32 { float q32[]; };
layout(std430, set = 0, binding = 5) writeonly buffer Q256 { float q256[]; };
#endif
#define MAXCH 2048u   // chunks a row: n <= 16384 (checked on the host)
shared float pm[MAXCH];
#endif
layout(std430, set = 0, binding = 0) buffer X { float x[]; };
layout(std430, set = 0, binding = 1) readonly buffer Add { float add[]; };
layout(std430, set = 0, binding = 2) readonly buffer Wn { float w[]; };
layout(std430, set = 0, binding = 3) writeonly buffer Out { float outv[]; };

layout(push_constant) uniform Push {
    uint n;
    float eps;
#ifdef QPACK
    uint count;   // values of the whole pass (rows * n): the packed layout's offsets
#endif
} p;

shared float red[256];

// Chunks a thread keeps in registers (x and w, loaded once): rows up to KMAX x WG x CH values;
// longer rows re-read the rest (n <= 16384 is checked on the host).
#define KMAX 4u

#ifdef QACT
// Round chunk c (outputs o) through blocks of qb (k = 0: 32, 1: 256): its block's amax from
// the chunks' in pm; packed (QPACK, with the chunk's int sum to ps) or as f32 values.
void round_chunk(uint k, uint qb, uint base, uint c, float o[CH]) {
    uint per = qb / CH;
    uint c0 = (c / per) * per;
    float amax = 0.0;
    for (uint j = c0; j < c0 + per; j++) amax = max(amax, pm[j]);
    float d = amax / 127.0;
    float id = amax > 0.0 ? 127.0 / amax : 0.0;
#ifdef QPACK
    uint wd[2] = uint[2](0u, 0u);
    int qsum = 0;
    for (uint i = 0u; i < CH; i++) {
        precise float q = roundEven(o[i] * id);
        int qi = int(q);
        qsum += qi;
        wd[i >> 2] |= (uint(qi) & 0xFFu) << ((i & 3u) * 8u);
    }
    uint g = base + c * CH;   // the chunk's first value in the pass
    if (k == 0u) {
        p32[g >> 2] = wd[0];
        p32[(g >> 2) + 1u] = wd[1];
        if (c == c0) p32[(p.count >> 2) + g / qb] = floatBitsToUint(d);
    } else {
        p256[g >> 2] = wd[0];
        p256[(g >> 2) + 1u] = wd[1];
        if (c == c0) p256[(p.count >> 2) + g / qb] = floatBitsToUint(d);
    }
    ps[c] = qsum;
#else
    for (uint i = 0u; i < CH; i++) {
        precise float q = roundEven(o[i] * id);
        precise float v = q * d;
        if (k == 0u) q32[base + c * CH + i] = v; else q256[base + c * CH + i] = v;
    }
#endif
}
#endif

void main() {
    uint r = gl_WorkGroupID.x;
    uint t = gl_LocalInvocationID.x;
    uint base = r * p.n;
    uint nch = (p.n + CH - 1u) / CH;
    // Fixed trip counts and `break`s: the arrays stay in registers.
    float xv[KMAX][CH];
    float wv[KMAX][CH];
    // The weights first: their loads do not wait on anything.
    for (uint k = 0u; k < KMAX; k++) {
        uint c = t + k * WG;
        if (c >= nch) break;
        for (uint j = 0u; j < CH; j++) wv[k][j] = c * CH + j < p.n ? w[c * CH + j] : 0.0;
    }
    precise float ss = 0.0;
    for (uint k = 0u; k < KMAX; k++) {
        uint c = t + k * WG;
        if (c >= nch) break;
        for (uint j = 0u; j < CH; j++) {
            uint i = c * CH + j;
            if (i >= p.n) break;
#ifdef FUSE_ADD
            precise float v = x[base + i] + add[base + i];
            x[base + i] = v;
#else
            float v = x[base + i];
#endif
            xv[k][j] = v;
            ss += v * v;
        }
    }
    for (uint c = t + KMAX * WG; c < nch; c += WG) {
        for (uint i = c * CH; i < min(c * CH + CH, p.n); i++) {
#ifdef FUSE_ADD
            precise float v = x[base + i] + add[base + i];
            x[base + i] = v;
#else
            float v = x[base + i];
#endif
            ss += v * v;
        }
    }
    red[t] = ss;
    barrier();
    for (uint s = WG / 2u; s > 0u; s >>= 1) {
        if (t < s) red[t] = red[t] + red[t + s];
        barrier();
    }
    float scale = 1.0 / sqrt(red[0] / float(p.n) + p.eps);
    for (uint k = 0u; k < KMAX; k++) {
        uint c = t + k * WG;
        if (c >= nch) break;
        float amax = 0.0;
        for (uint j = 0u; j < CH; j++) {
            uint i = c * CH + j;
            if (i >= p.n) break;
            precise float o = (xv[k][j] * scale) * wv[k][j];
            outv[base + i] = o;
            amax = max(amax, abs(o));
            xv[k][j] = o;   // the QACT phase's input
        }
#ifdef QACT
        pm[c] = amax;
#endif
    }
    for (uint c = t + KMAX * WG; c < nch; c += WG) {
        float amax = 0.0;
        for (uint i = c * CH; i < min(c * CH + CH, p.n); i++) {
            precise float o = (x[base + i] * scale) * w[i];
            outv[base + i] = o;
            amax = max(amax, abs(o));
        }
#ifdef QACT
        pm[c] = amax;
#endif
    }
#ifdef QACT
    barrier();
    for (uint k = 0u; k < 2u; k++) {
        uint qb = k == 0u ? 32u : 256u;
        if ((QMASK & (1u << k)) == 0u) continue;
        for (uint kc = 0u; kc < KMAX; kc++) {
            uint c = t + kc * WG;
            if (c >= nch) break;
            round_chunk(k, qb, base, c, xv[kc]);
        }
        for (uint c = t + KMAX * WG; c < nch; c += WG) {
            float o[CH];
            for (uint i = 0u; i < CH; i++) {
                precise float v = (x[base + c * CH + i] * scale) * w[c * CH + i];
                o[i] = v;
            }
            round_chunk(k, qb, base, c, o);
        }
#ifdef QPACK
        // The int sum of each group of sumg values (32 for blocks of 32, 16 for 256).
        barrier();
        uint sumg = qb == 256u ? 16u : 32u;
        uint gper = sumg / CH;
        for (uint c = t; c < nch; c += WG) {
            if (c % gper != 0u) continue;
            int sum = 0;
            for (uint j = c; j < c + gper; j++) sum += ps[j];
            uint g = base + c * CH;
            uint at = (p.count >> 2) + p.count / qb + g / sumg;
            if (k == 0u) p32[at] = uint(sum); else p256[at] = uint(sum);
        }
        barrier();
#endif
    }
#endif
}
