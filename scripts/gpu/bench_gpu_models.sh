#!/bin/bash
# resin's pp512 / tg128 beside llama.cpp CUDA's `llama-bench -p 512 -n 128 -r 3 -fa 1` on the
# other model families' benchmark shapes: Gemma 3 (270M and 1B) and the Qwen3-30B-A3B mixture of
# experts, all Q4_K_M, written on the device machine by `resin synth` (random weights, the real
# vocabularies: .kit/gemma3-vocab.gguf and .kit/qwen-vocab.gguf from scripts/vocab_only.py; the
# 30B file is about 17 GB). Two calls on one warm machine, from the repo root, the kit in .kit:
#   STAGE=ours bash scripts/gpu/bench_gpu_models.sh   # the files, resin's runs, the peer built beside
#   STAGE=peer bash scripts/gpu/bench_gpu_models.sh   # the build finished, the peer, resin again
# One line a run; logs and JSON in $OUT/m. MODELS narrows the list ("shape type" entries, |-separated).
# The files go to F, memory by default: the device machine's disk wrote the 30B file more
# slowly than a call lasts (synth's log lines say its rate).
S=$SECONDS; W=/tmp/w; F=${F:-/dev/shm/m}; K=.kit; O=${OUT:-/tmp/out}/m; mkdir -p $O $W $F
MODELS=${MODELS:-"gemma3-270m q4_k_m|gemma3-1b q4_k_m|qwen3-30b-a3b q4_k_m"}
bash $K/peer.sh $K $W gl >/dev/null
[ -d $W/llama.cpp ] || tar xzf $K/llama.cpp-src.tgz -C $W
. scripts/gpu/llama_cmake.sh
build() { # the peer's llama-bench, until $1 seconds into the call
  [ -x $W/bc/bin/llama-bench ] && return 0
  [ -f $W/bc/build.ninja ] || cmake -S $W/llama.cpp -B $W/bc $LLAMA_CMAKE $LLAMA_CUDA > $O/cmake.log 2>&1
  timeout $(($1 - (SECONDS - S))) nice cmake --build $W/bc -j 16 --target llama-bench > $O/build.log 2>&1
}
r() { # resin's run on file $2, labelled $1
  timeout 240 $K/resin bench --model $F/$2.gguf --gpu vulkan --prompt-tokens 512 --gen-tokens 128 --reps 3 --format json > $O/resin-$1-$2.json 2> $O/resin-$1-$2.log
  echo "resin $1 $2: $(grep -o -E '"(pp_tps|tg_tps|tg_greedy_tps)":[0-9.]*' $O/resin-$1-$2.json | tr '\n' ' ') at $((SECONDS - S)) s"
  grep -m2 -i -E "declin|error" $O/resin-$1-$2.log
}
IFS='|' read -ra ms <<< "$MODELS"
if [ "${STAGE:-ours}" = ours ]; then
  build 560 & B=$!
  for e in "${ms[@]}"; do
    set -- $e; f=$F/$1-$2.gguf
    case $1 in gemma3*) v=$K/gemma3-vocab.gguf ;; qwen3*) v=$K/qwen-vocab.gguf ;; *) v=$W/llama.cpp/models/ggml-vocab-llama-bpe.gguf ;; esac
    [ -f $f ] || $K/resin synth --shape $1 --type $2 --vocab $v --out $f > $O/synth-$1.log 2>&1 || { tail -3 $O/synth-$1.log; continue; }
    echo "synth $1 $2 at $((SECONDS - S)) s ($(du -h $f | cut -f1))"
  done
  for e in "${ms[@]}"; do set -- $e; r busy $1-$2; done
  wait $B; echo "build rc $? at $((SECONDS - S)) s"
else
  build 400; echo "build rc $? at $((SECONDS - S)) s"; tail -1 $O/build.log
  for e in "${ms[@]}"; do
    set -- $e; m=$1-$2
    [ -x $W/bc/bin/llama-bench ] && timeout 150 $W/bc/bin/llama-bench -m $F/$m.gguf -p 512 -n 128 -r 3 -fa 1 -o md 2>&1 | grep -E "^\|" | tee -a $O/peer.md
    r quiet $m
  done
fi
echo "end at $((SECONDS - S)) s"
