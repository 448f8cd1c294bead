#!/bin/bash
# Decode at width: resin's home stepped in lockstep (`resin bench --streams N --lockstep`: every
# prompt prefilled, then N rows a step) beside llama-batched-bench's S_TG (the same shape:
# -npp 512 -ntg 128 -npl N, flash attention on), on the same `resin synth` files, CUDA build.
# Two calls on one warm machine (it keeps /tmp/w about 30 s after a call returns):
#   STAGE=ours bash scripts/gpu/bench_gpu_lockstep.sh [BIN...]   resin's runs while the peer
#       compiles (niced), then waits for the build until LEASE_S (default 570)
#   STAGE=peer bash scripts/gpu/bench_gpu_lockstep.sh [BIN...]   resin's runs again on the quiet
#       host, then the peer's batched-bench on both files
# BIN: resin binaries or wrappers (default .kit/resin; .kit/resin-gemm and .kit/resin-fast run
# --wide-steps gemm and fast); WIDTHS (default "8 16 32 64").
# Results in $OUT/ls (one line a run) and $OUT/ls.tgz. From the repo root, the kit in .kit.
S=$SECONDS; W=/tmp/w; K=.kit; O=$OUT/ls; mkdir -p $O $W
L=${LEASE_S:-570}
BINS=("$@"); [ ${#BINS[@]} -gt 0 ] || BINS=($K/resin)
WIDTHS=${WIDTHS:-"8 16 32 64"}
STAGE=${STAGE:-ours}
MODELS="llama3.2-1b-q8_0 llama3.2-3b-q4_k_m"
left() { local t=$(($1 - (SECONDS - S))); [ $t -lt 1 ] && t=1; echo $t; }
bash $K/peer.sh $K $W gl >/dev/null
OUT=$O bash scripts/gpu/bench_gpu.sh $K $W synth > $O/synth.txt 2>&1
if [ $STAGE = ours ]; then
  . "$(dirname "$0")/llama_cmake.sh"; C=$LLAMA_CMAKE
  ( cmake -S $W/llama.cpp -B $W/bc $C $LLAMA_CUDA > $O/cmake.log 2>&1 &&
    timeout $(left $((L - 10))) nice -n 19 cmake --build $W/bc -j 12 --target llama-batched-bench > $O/build.log 2>&1 ) &
  B=$!
fi
# resin: each binary, model and width, lockstep (greedy), one run after a warm-up
# (RESIN_RUNS=0 skips them: a peer call after a cut one)
[ "${RESIN_RUNS:-1}" = 0 ] && MODELS_R="" || MODELS_R=$MODELS
for m in $MODELS_R; do
  for n in $WIDTHS; do
    for b in "${BINS[@]}"; do
      timeout 100 $b bench --model $W/$m.gguf --gpu vulkan --prompt-tokens 512 --gen-tokens 128 --reps 1 --streams $n --lockstep --format json > $O/r.json 2> $O/$(basename $b)-$m-$n.log
      python3 -c "
import json,sys; d=json.load(open('$O/r.json'))
print('$STAGE', '$(basename $b)', '$m', 'n=$n', 'prefill_tps', round(d['prefill_tps']), 'decode_tps', round(d['decode_tps']), 'step_ms', round(d['step_ms_median'], 3))" | tee -a $O/resin.txt || echo "$(basename $b) $m $n: no result"
    done
  done
done
echo "resin done at $((SECONDS - S)) s"
if [ $STAGE = ours ]; then
  wait $B || { echo "peer build cut or failed at $((SECONDS - S)) s"; tail -3 $O/build.log; }
  echo "peer built at $((SECONDS - S)) s"
else
  if [ -d $W/bc ] && [ ! -x $W/bc/bin/llama-batched-bench ]; then
    timeout $(left $((L / 2))) cmake --build $W/bc -j $(nproc) --target llama-batched-bench > $O/build-resume.log 2>&1; echo "build resumed to $((SECONDS - S)) s: rc $?"
  fi
  npl=$(echo 1 $WIDTHS | tr ' ' ',')
  for m in $MODELS; do
    timeout $(( $(left $((L - 10))) / 2 + 1 )) $W/bc/bin/llama-batched-bench -m $W/$m.gguf -c 40000 -b 2048 -ub 512 -npp 512 -ntg 128 -npl $npl -fa on > $O/peer-batched-$m.log 2>&1
    echo "rc $?"; grep -E "^\||error" $O/peer-batched-$m.log | tee -a $O/peer-batched.md
  done
fi
echo "end at $((SECONDS - S)) s"
tar czf $OUT/ls.tgz -C $OUT ls
