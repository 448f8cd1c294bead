// The RMS norm of one row, for a workgroup of WG threads (rmsnorm.comp, one workgroup a row):
//   nx[r] += nadd[r] (written back, FUSE_ADD), nout[r] = nx[r] / rms(nx[r]) * nw
// and with QACT its rounding through 8-bit blocks (qact.comp's arithmetic, bit for bit) to
// nq32 / nq256 (blocks of 32 when QMASK & 1, of 256 when QMASK & 2), or with QPACK packed
// as qact.comp QPACK's layout over the pass's `count` values into np32 / np256.
// The sum of squares runs over NVT virtual threads (virtual thread v: chunks v, v + NVT, ...
// in order, then a tree over the NVT sums) whatever WG is. A real thread takes virtual
// threads t, t + WG, ... (WG divides NVT) and only ever reads back its own writes of nx.
// The includer declares the buffers, WG, QMASK and the shared arrays red[NVT], pm[MAXCH]
// and (QPACK) ps[MAXCH].
#ifndef RESIN_NORM_GLSL
#define RESIN_NORM_GLSL
#define CH 8u
#define NVT 256u
#define MAXCH 2048u   // chunks a row: n <= 16384 (checked on the host)

void norm_row(uint r, uint t, uint n, float eps, uint count) {
    uint base = r * n;
    uint nch = (n + CH - 1u) / CH;
    for (uint v = t; v < NVT; v += WG) {
        precise float ss = 0.0;
        for (uint c = v; c < nch; c += NVT) {
            for (uint i = c * CH; i < min(c * CH + CH, n); i++) {
#ifdef FUSE_ADD
                precise float a = nx[base + i] + nadd[base + i];
                nx[base + i] = a;
#else
                float a = nx[base + i];
#endif
                ss += a * a;
            }
        }
        red[v] = ss;
    }
    barrier();
    for (uint s = NVT / 2u; s > 0u; s >>= 1) {
        for (uint v = t; v < s; v += WG) red[v] = red[v] + red[v + s];
        barrier();
    }
    float scale = 1.0 / sqrt(red[0] / float(n) + eps);
    barrier();   // red is read by every thread before a next row writes it
    for (uint v = t; v < NVT; v += WG) {
        for (uint c = v; c < nch; c += NVT) {
            float amax = 0.0;
            for (uint i = c * CH; i < min(c * CH + CH, n); i++) {
                precise float o = (nx[base + i] * scale) * nw[i];
                nout[base + i] = o;
                amax = max(amax, abs(o));
            }
#ifdef QACT
            pm[c] = amax;
#endif
        }
    }
#ifdef QACT
    barrier();
    for (uint k = 0u; k < 2u; k++) {
        uint qb = k == 0u ? 32u : 256u;
        if ((QMASK & (1u << k)) == 0u) continue;
        uint per = qb / CH;
        for (uint v = t; v < NVT; v += WG) {
            for (uint c = v; c < nch; c += NVT) {
                uint c0 = (c / per) * per;
                float amax = 0.0;
                for (uint j = c0; j < c0 + per; j++) amax = max(amax, pm[j]);
                float d = amax / 127.0;
                float id = amax > 0.0 ? 127.0 / amax : 0.0;
#ifdef QPACK
                uint wd[2] = uint[2](0u, 0u);
                int qsum = 0;
                for (uint i = 0u; i < CH; i++) {
                    precise float o = (nx[base + c * CH + i] * scale) * nw[c * CH + i];
                    precise float q = roundEven(o * id);
                    int qi = int(q);
                    qsum += qi;
                    wd[i >> 2] |= (uint(qi) & 0xFFu) << ((i & 3u) * 8u);
                }
                uint g = base + c * CH;   // the chunk's first value in the pass
                if (k == 0u) {
                    np32[g >> 2] = wd[0];
                    np32[(g >> 2) + 1u] = wd[1];
                    if (c == c0) np32[(count >> 2) + g / qb] = floatBitsToUint(d);
                } else {
                    np256[g >> 2] = wd[0];
                    np256[(g >> 2) + 1u] = wd[1];
                    if (c == c0) np256[(count >> 2) + g / qb] = floatBitsToUint(d);
                }
                ps[c] = qsum;
#else
                for (uint i = c * CH; i < c * CH + CH; i++) {
                    precise float o = (nx[base + i] * scale) * nw[i];
                    precise float q = roundEven(o * id);
                    precise float val = q * d;
                    if (k == 0u) nq32[base + i] = val; else nq256[base + i] = val;
                }
#endif
            }
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
            uint at = (count >> 2) + count / qb + g / sumg;
            if (k == 0u) np32[at] = uint(sum); else np256[at] = uint(sum);
        }
        barrier();
#endif
    }
#endif
}
#endif
