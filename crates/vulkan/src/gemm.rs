//! Prefill GEMM: the weights times a window of activation rows (see shaders/ops/gemm.comp).
