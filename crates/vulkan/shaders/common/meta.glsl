// The per-row metadata block of a token command (mirrors `kernels::RowMeta`): four words a
// row. Only this block changes between resubmissions of a recorded command.
#ifndef RESIN_META_GLSL
#define RESIN_META_GLSL
#define META_TOKEN 0u
#define META_POS 1u
#define META_KV_BASE 2u   // element offset of the row's region in each layer's mirror buffer
#define META_KEYS 3u      // keys the row attends to (pos + 1)
#define META_WORDS 4u

// Decode attention splits a row's keys into pieces of a size decided by its key count alone
// (so a row's result does not depend on the rows beside it): whole chunks of ATTN_CHUNK keys,
// at most ATTN_SLOTS pieces (kernels::ATTN_SLOTS partials a row and head).
#define ATTN_CHUNK 64u
#define ATTN_SLOTS 32u
uint attn_piece_keys(uint keys) {
    return ATTN_CHUNK * ((keys + ATTN_CHUNK * ATTN_SLOTS - 1u) / (ATTN_CHUNK * ATTN_SLOTS));
}

// A prefill window's attention splits a row's keys at multiples of win_piece_keys(keys) (the
// smallest power-of-two multiple of WIN_PIECE_MIN keys that cuts them into at most WIN_PIECES
// pieces: from its key count alone, so a row's result does not depend on the rows beside it),
// a workgroup a piece (attn_window.rs mirrors these).
#define WIN_PIECES 4u
#define WIN_PIECE_MIN 1024u
uint win_piece_keys(uint keys) {
    uint per = WIN_PIECE_MIN;
    while (per * WIN_PIECES < keys) per *= 2u;
    return per;
}

// The first key a row of `keys` keys attends to: on a sliding-window layer (gemma3) only its
// last `key_window` keys, its own included (0: every key). Its keys are then first..keys.
uint attn_first_key(uint keys, uint key_window) {
    return key_window == 0u || keys <= key_window ? 0u : keys - key_window;
}
#endif
