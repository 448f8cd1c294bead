// The per-row metadata block of a token command (mirrors `kernels::RowMeta`): four words a
// row. Only this block changes between resubmissions of a recorded command.
#ifndef RESIN_META_GLSL
#define RESIN_META_GLSL
#define META_TOKEN 0u
#define META_POS 1u
#define META_KV_BASE 2u   // element offset of the row's region in each layer's mirror buffer
#define META_KEYS 3u      // keys the row attends to (pos + 1)
#define META_WORDS 4u
#endif
