# llama.cpp's cmake options for the peer builds (only llama-bench and llama-batched-bench are
# built; no tests, examples, server, UI or network), sourced by scripts/gpu/bench_gpu_lease.sh,
# bench_gpu_lockstep.sh and bench_gpu_tg.sh. LLAMA_CUDA adds the CUDA backend for the H100 and
# H200 (both sm_90).
LLAMA_CMAKE="-G Ninja -DCMAKE_BUILD_TYPE=Release -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_SERVER=OFF"
LLAMA_CUDA="-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90"
