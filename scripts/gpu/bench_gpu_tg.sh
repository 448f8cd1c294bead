#!/bin/bash
# resin's pp512/tg128 beside llama.cpp CUDA's llama-bench in one short device call (about 250 s
# on the H200): llama.cpp's CUDA llama-bench is built (that target only, every core, about 200 s)
# while resin's pp512/tg128 run on the `resin synth` Llama-3.2-1B Q8_0 and 3B Q4_K_M files (or
# llama.cpp's, where peer.sh's models stage wrote them first), then the peer's `llama-bench
# -p 512 -n 128 -r 3 -fa 1` and resin again on the quiet host, on the same files. From the repo
# root on the device machine, the kit in .kit (scripts/gpu/make_kit.sh):
#   bash scripts/gpu/bench_gpu_tg.sh        one line a run; logs and JSON in $OUT/p
S=$SECONDS; W=/tmp/w; K=.kit; O=$OUT/p; mkdir -p $O $W
bash $K/peer.sh $K $W gl >/dev/null
OUT=$O bash scripts/gpu/bench_gpu.sh $K $W synth > $O/synth.txt 2>&1
echo "synth at $((SECONDS - S)) s"
. scripts/gpu/llama_cmake.sh
( cmake -S $W/llama.cpp -B $W/bc $LLAMA_CMAKE $LLAMA_CUDA > $O/cmake.log 2>&1 && timeout $((430 - (SECONDS - S))) cmake --build $W/bc -j 16 --target llama-bench > $O/build.log 2>&1 ) &
B=$!
r() { timeout 60 .kit/resin bench --model $W/$2.gguf --gpu vulkan --prompt-tokens 512 --gen-tokens 128 --reps 3 --format json > $O/resin-$1-$2.json 2>/dev/null; echo "resin $1 $2: $(grep -o -E '"(pp_tps|tg_tps|tg_greedy_tps)":[0-9.]*' $O/resin-$1-$2.json | tr '\n' ' ') at $((SECONDS - S)) s"; }
for m in llama3.2-1b-q8_0 llama3.2-3b-q4_k_m; do r busy $m; done
wait $B; echo "build rc $? at $((SECONDS - S)) s"; tail -2 $O/build.log
for m in llama3.2-1b-q8_0 llama3.2-3b-q4_k_m; do
  [ -x $W/bc/bin/llama-bench ] && timeout 50 $W/bc/bin/llama-bench -m $W/$m.gguf -p 512 -n 128 -r 3 -fa 1 -o md 2>&1 | grep -E "^\|" | tee -a $O/peer.md
  r quiet $m
done
echo "end at $((SECONDS - S)) s"
