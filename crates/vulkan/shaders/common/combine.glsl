// The merge of decode attention's key pieces (attn.comp's partials), for one row and one
// group of p.heads heads, by a workgroup of WG threads (thread t):
//   out = sum_p acc_p e^(m_p - M) / sum_p l_p e^(m_p - M)
// over the row's pieces (as many as attn.comp cut its keys into; each holds a key); one
// thread a head for the weights. QACT: also write out rounded through 8-bit blocks of QB
// values (qact.comp's arithmetic, bit for bit) for the matrix that reads it, so the rounding
// needs no dispatch and barrier of its own: to y as f32, or with QPACK packed for the int8
// dot GEMV (qact.comp QPACK's layout over the pass's `count` values). The host makes a group
// whole blocks (heads * head_dim a multiple of QB, at most WG * CH values), each thread
// rounding one chunk of CH values.
// attn_combine.comp runs it as a dispatch of its own; attn.comp COMBINE in the workgroup that
// finishes a group's pieces last. The includer declares part, meta, outv, pk or y, WG, QB
// and the push fields n_head, head_dim, heads, count.
#ifndef RESIN_COMBINE_GLSL
#define RESIN_COMBINE_GLSL
#define CH 8u
#define MAXG 8u   // heads a workgroup
shared float wp[MAXG * ATTN_SLOTS];   // e^(m_p - M) of each head's pieces
shared float lh[MAXG];                // each head's merged l
// Each piece's (m, l), loaded by a thread each at once (not one after another by a head's
// thread), and with QACT the group's merged values, each by a thread of its own (not CH in a
// row by a chunk's): the same operations, in fewer dependent steps.
shared vec2 ml[MAXG * ATTN_SLOTS];
#ifdef QACT
shared float mvals[512];   // heads * head_dim <= 64 * CH (attn_round_heads)
#endif
#ifdef QACT
shared float pm[256];   // each chunk's amax (WG <= 256)
#ifdef QPACK
shared int ps[256];     // each chunk's quant sum
#define SUMG (QB == 256u ? 16u : 32u)
#endif
#endif

// Value d of head hh of the group over its npc pieces from partial slot `first` (the same
// operations in every form, fused multiply-adds spelled out).
float merged(uint first, uint npc, uint hh, uint d, uint hd) {
    float a = 0.0;
    for (uint i = 0u; i < npc; i++) a = fma(part[(first + i) * (hd + 2u) + 2u + d], wp[hh * ATTN_SLOTS + i], a);
    return a / lh[hh];
}

void combine(uint r, uint grp, uint t) {
    uint hd = p.head_dim;
    uint h0 = grp * p.heads;
    uint keys = meta[r * META_WORDS + META_KEYS];
    uint kspan = keys - attn_first_key(keys, p.key_window);
    uint npc = (kspan + attn_piece_keys(kspan) - 1u) / attn_piece_keys(kspan);
    uint first0 = (r * p.n_head + h0) * ATTN_SLOTS;
    for (uint e = t; e < p.heads * ATTN_SLOTS; e += WG) {
        uint i = e % ATTN_SLOTS;
        if (i < npc) ml[e] = vec2(part[(first0 + e) * (hd + 2u)], part[(first0 + e) * (hd + 2u) + 1u]);
    }
    barrier();
    if (t < p.heads) {
        float mx = -1.0 / 0.0;
        for (uint i = 0u; i < npc; i++) mx = max(mx, ml[t * ATTN_SLOTS + i].x);
        float l = 0.0;
        for (uint i = 0u; i < npc; i++) {
            float w = exp(ml[t * ATTN_SLOTS + i].x - mx);
            wp[t * ATTN_SLOTS + i] = w;
            l = fma(ml[t * ATTN_SLOTS + i].y, w, l);
        }
        lh[t] = l;
    }
    barrier();
    uint o0 = (r * p.n_head + h0) * hd;   // the group's first value in the pass
    uint span = p.heads * hd;
#ifndef QACT
    for (uint j = t; j < span; j += WG) outv[o0 + j] = merged(first0 + (j / hd) * ATTN_SLOTS, npc, j / hd, j % hd, hd);
#else
    for (uint j = t; j < span; j += WG) {
        float m = merged(first0 + (j / hd) * ATTN_SLOTS, npc, j / hd, j % hd, hd);
        mvals[j] = m;
        outv[o0 + j] = m;
    }
    barrier();
    uint o = t * CH;   // this thread's chunk of the group's values
    bool live = o < span;
    float v[CH];
    float amax = 0.0;
    if (live) {
        for (uint k = 0u; k < CH; k++) {
            v[k] = mvals[o + k];
            amax = max(amax, abs(v[k]));
        }
    }
    pm[t] = amax;
    barrier();
    uint cper = QB / CH;
    uint t0 = (t / cper) * cper;
    int qsum = 0;
    if (live) {
        float bmax = 0.0;
        for (uint j = t0; j < t0 + cper; j++) bmax = max(bmax, pm[j]);
        float d = bmax / 127.0;
        float id = bmax > 0.0 ? 127.0 / bmax : 0.0;
        uint gi = o0 + o;   // the chunk's first value in the pass
#ifdef QPACK
        uint wd[2] = uint[2](0u, 0u);
        for (uint k = 0u; k < CH; k++) {
            precise float q = roundEven(v[k] * id);
            int qi = int(q);
            qsum += qi;
            wd[k >> 2] |= (uint(qi) & 0xFFu) << ((k & 3u) * 8u);
        }
        pk[gi >> 2] = wd[0];
        pk[(gi >> 2) + 1u] = wd[1];
        if (t == t0) pk[(p.count >> 2) + gi / QB] = floatBitsToUint(d);
#else
        for (uint k = 0u; k < CH; k++) {
            precise float q = roundEven(v[k] * id);
            precise float rv = q * d;
            y[gi + k] = rv;
        }
#endif
    }
#ifdef QPACK
    // The int sum of each SUMG values.
    ps[t] = qsum;
    barrier();
    uint gper = SUMG / CH;
    if (live && (t % gper) == 0u) {
        int s = 0;
        for (uint j = 0u; j < gper; j++) s += ps[t + j];
        pk[(p.count >> 2) + p.count / QB + (o0 + o) / SUMG] = uint(s);
    }
#endif
#endif
}
#endif
