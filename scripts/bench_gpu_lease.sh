#!/bin/bash
# The comparison in one short lease (LEASE_S seconds, default 480: one `device` call), for when
# the device budget cannot hold scripts/bench_gpu.sh's full peer build. resin runs (bench
# pp512/tg128 with the per-stage profile, and with split K off; 8, 16, 32 and 64 streams with
# wide steps and with groups of 8-row token commands) on `resin synth` files while
# llama.cpp's CUDA build (llama-bench and llama-batched-bench only, niced, 12 jobs) compiles
# beside it; then the peer runs on the SAME files. Streams: wide steps (--wide-step-min 9:
# the Vulkan home's lanes, groups of token commands on several queues at once) against the
# engine's groups one after another (0), lanes on one queue (RESIN_VK_QUEUES=1, the control:
# the same work with no overlap) and the one-pass GEMM wide step (RESIN_VK_WIDE=gemm). Each step is cut by `timeout` so the call
# ends in time. From the repo root on the device machine, the kit in .kit (scripts/bench_gpu.sh;
# RESIN_BIN names another resin binary than .kit/resin):
#   bash scripts/bench_gpu_lease.sh        results in $OUT/l and $OUT/final.tgz
S=$SECONDS; W=/tmp/w; K=.kit; O=$OUT/l; mkdir -p $O $W
L=${LEASE_S:-480}
R=${RESIN_BIN:-$K/resin}   # the resin binary measured
left() { local t=$(($1 - (SECONDS - S))); [ $t -lt 1 ] && t=1; echo $t; }
bash $K/peer.sh $K $W gl >/dev/null
OUT=$O bash scripts/bench_gpu.sh $K $W synth > $O/synth.txt 2>&1
C="-G Ninja -DCMAKE_BUILD_TYPE=Release -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_SERVER=OFF"
( cmake -S $W/llama.cpp -B $W/bc $C -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 > $O/cmake.log 2>&1 &&
  timeout $(left $((L - 90))) nice -n 19 cmake --build $W/bc -j 12 --target llama-bench llama-batched-bench > $O/build.log 2>&1 ) &
B=$!
# j: one resin bench run, its key figures on one line (env overrides before the command).
j() { local tag=$1; shift; timeout 90 env "$@" > $O/$tag.json 2> $O/$tag.log; echo "$tag: $(grep -o -E '"(pp_tps|tg_tps|tg_greedy_tps|decode_tps|full_width_decode_tps|ttft_p50_s)":[0-9.a-z]*' $O/$tag.json | tr "\n" " ")"; }
for m in llama3.2-1b-q8_0 llama3.2-3b-q4_k_m; do
  RB="$R bench --model $W/$m.gguf --gpu vulkan --prompt-tokens 512 --gen-tokens 128 --format json"
  j resin-$m A=1 $RB --reps 3 --profile
  # split K off (RESIN_VK_GEMM_SPLIT=0): what the split brings to prefill
  j resin-$m-nosplit RESIN_VK_GEMM_SPLIT=0 $RB --reps 2
  if [ -n "$Q8KV" ]; then j resin-$m-q8kv A=1 $RB --kv q8_0 --reps 1; fi   # the q8_0 K/V mirror
  # aggregate decode: wide steps above 8 rows (--wide-step-min 9) against the engine's groups
  # of 8-row token commands (0); at 8 streams both are one 8-row command a step
  for n in 8 16 32 64; do
    j streams-$m-$n-wide A=1 $RB --streams $n --reps 1 --wide-step-min 9
    [ $n -gt 8 ] && j streams-$m-$n-grouped A=1 $RB --streams $n --reps 1 --wide-step-min 0
  done
  j streams-$m-16-q1 RESIN_VK_QUEUES=1 $RB --streams 16 --reps 1 --wide-step-min 9
  j streams-$m-64-gemm RESIN_VK_WIDE=gemm $RB --streams 64 --reps 1 --wide-step-min 9
  # TTFT of 8 prompts arriving together, one at a time (segmented is the 8-stream run above)
  j streams-$m-8-seg1 A=1 $RB --streams 8 --max-segments 1 --reps 1
done
echo "ours done at $((SECONDS - S)) s"
wait $B || { echo "peer build cut or failed at $((SECONDS - S)) s"; tail -3 $O/build.log; }
echo "peer built at $((SECONDS - S)) s"
for m in llama3.2-1b-q8_0 llama3.2-3b-q4_k_m; do
  timeout $(left $((L - 45))) $W/bc/bin/llama-bench -m $W/$m.gguf -p 512 -n 128 -r 3 -fa 1 -o md 2>&1 | grep -E "^\||error" | tee -a $O/peer-cuda-bench.md
done
for m in llama3.2-1b-q8_0 llama3.2-3b-q4_k_m; do
  timeout $(left $((L - 10))) $W/bc/bin/llama-batched-bench -m $W/$m.gguf -c 40000 -b 2048 -ub 512 -npp 512 -ntg 128 -npl 1,8,16,32,64 -fa on 2>&1 | grep -E "^\||error" | tee -a $O/peer-cuda-batched.md
done
echo "end at $((SECONDS - S)) s"
tar czf $OUT/final.tgz -C $OUT l
