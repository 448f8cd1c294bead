// The RMS norm of one row, for a workgroup of NVT (256) threads (rmsnorm.comp, one workgroup
// a row):
//   nx[r] += nadd[r] (written back, FUSE_ADD), nout[r] = nx[r] / rms(nx[r]) * nw
// and with QACT its rounding through 8-bit blocks (qact.comp's arithmetic, bit for bit) to
// nq32 / nq256 (blocks of 32 when QMASK & 1, of 256 when QMASK & 2).
// Thread v takes chunks of CH values v, v + NVT, ... (at most MAXC of them: n <= 16384,
// checked on the host), sums their squares in order, then a tree over the NVT sums. Each
// thread holds its chunks' values in registers from the one load to the last use, so the
// row is read once (the passes after the sum of squares read no memory but the weights).
// The includer declares the buffers, WG (== NVT), QMASK and the shared arrays red[NVT],
// pm[MAXCH].
#ifndef RESIN_NORM_GLSL
#define RESIN_NORM_GLSL
#define CH 8u
#define NVT 256u
#define MAXC 8u
#define MAXCH 2048u   // MAXC * NVT chunks a row
#define NS_WIDTH NVT
#define NS_RED red
#include "norm_scale.glsl"

void norm_row(uint r, uint t, uint n, float eps) {
    uint base = r * n;
    uint nch = (n + CH - 1u) / CH;
    float xv[MAXC][CH];
    precise float ss = 0.0;
    // Rows of whole chunks (n a multiple of 8) load and store a chunk as two vec4s: the same
    // values and arithmetic, a quarter of the memory requests.
    bool whole = (n & 7u) == 0u;
    for (uint k = 0u; k < MAXC; k++) {
        uint c = t + k * NVT;
        if (c >= nch) break;
        if (whole) {
            uint q = (base + c * CH) >> 2;
            vec4 v0 = nx4[q], v1 = nx4[q + 1u];
#ifdef FUSE_ADD
            precise vec4 s0 = v0 + nadd4[q];
            precise vec4 s1 = v1 + nadd4[q + 1u];
            nx4[q] = s0;
            nx4[q + 1u] = s1;
            v0 = s0;
            v1 = s1;
#endif
            for (uint i = 0u; i < 4u; i++) {
                xv[k][i] = v0[i];
                xv[k][i + 4u] = v1[i];
            }
            for (uint i = 0u; i < CH; i++) ss += xv[k][i] * xv[k][i];
            continue;
        }
        for (uint i = 0u; i < CH; i++) {
            uint e = c * CH + i;
            if (e >= n) break;
#ifdef FUSE_ADD
            precise float a = nx[base + e] + nadd[base + e];
            nx[base + e] = a;
#else
            float a = nx[base + e];
#endif
            xv[k][i] = a;
            ss += a * a;
        }
    }
    float scale = norm_scale(t, ss, n, eps);
    // xv becomes the outputs.
    for (uint k = 0u; k < MAXC; k++) {
        uint c = t + k * NVT;
        if (c >= nch) break;
        float amax = 0.0;
        if (whole) {
            uint qw = (c * CH) >> 2;
            vec4 w0 = nw4[qw], w1 = nw4[qw + 1u];
            for (uint i = 0u; i < CH; i++) {
                precise float o = (xv[k][i] * scale) * (i < 4u ? w0[i] : w1[i - 4u]);
                xv[k][i] = o;
                amax = max(amax, abs(o));
            }
            uint q = (base + c * CH) >> 2;
            nout4[q] = vec4(xv[k][0], xv[k][1], xv[k][2], xv[k][3]);
            nout4[q + 1u] = vec4(xv[k][4], xv[k][5], xv[k][6], xv[k][7]);
        } else {
            for (uint i = 0u; i < CH; i++) {
                uint e = c * CH + i;
                if (e >= n) break;
                precise float o = (xv[k][i] * scale) * nw[e];
                nout[base + e] = o;
                xv[k][i] = o;
                amax = max(amax, abs(o));
            }
        }
#ifdef QACT
        pm[c] = amax;
#endif
    }
#ifdef QACT
    barrier();
    for (uint b = 0u; b < 2u; b++) {
        uint qb = b == 0u ? 32u : 256u;
        if ((QMASK & (1u << b)) == 0u) continue;
        uint per = qb / CH;
        for (uint k = 0u; k < MAXC; k++) {
            uint c = t + k * NVT;
            if (c >= nch) break;
            uint c0 = (c / per) * per;
            float amax = 0.0;
            for (uint j = c0; j < c0 + per; j++) amax = max(amax, pm[j]);
            float d = amax / 127.0;
            float id = amax > 0.0 ? 127.0 / amax : 0.0;
            float qv[CH];
            for (uint i = 0u; i < CH; i++) {
                precise float q = roundEven(xv[k][i] * id);
                precise float val = q * d;
                qv[i] = val;
            }
            // (QACT rows are whole blocks of 32: n a multiple of 8.)
            uint q4 = (base + c * CH) >> 2;
            vec4 lo = vec4(qv[0], qv[1], qv[2], qv[3]), hi = vec4(qv[4], qv[5], qv[6], qv[7]);
            if (b == 0u) {
                nq32_4[q4] = lo;
                nq32_4[q4 + 1u] = hi;
            } else {
                nq256_4[q4] = lo;
                nq256_4[q4 + 1u] = hi;
            }
        }
    }
#endif
}
#endif
