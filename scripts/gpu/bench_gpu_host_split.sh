#!/usr/bin/env bash
# Where a decode step's time goes on the GPU machine, greedy against sampled streams: the
# engine's decode_step_ms (in the home's step: the device and the read-back; on the host
# around it: the draws, stop checks, sending), for each binary given (default .kit/resin),
# and the sampler's own speed on that host (the sample_speed example, carried as
# .kit/sample_speed: cargo build --release -p resin-engine --example sample_speed).
# From the repo root on the device machine, the kit in .kit (scripts/gpu/make_kit.sh):
#   bash scripts/gpu/bench_gpu_host_split.sh [.kit/resin [.kit/resin-other ...]]
# MODELS (default both synthetic models), WIDTHS_ARGS (a |-separated list of `resin bench`
# arguments; default greedy and sampled at 8 and 64 streams) and REPS (runs of each, the
# binaries alternating; default 1) narrow or widen a run to fit a lease.
set -u
BINS=("$@"); [ ${#BINS[@]} -gt 0 ] || BINS=(.kit/resin)
MODELS=${MODELS:-"llama3.2-1b-q8_0 llama3.2-3b-q4_k_m"}
WIDTHS_ARGS=${WIDTHS_ARGS:-"--streams 8|--streams 8 --temperature 0.8 --top-p 0.95|--streams 64 --temperature 0.8 --top-p 0.95|--streams 64"}
REPS=${REPS:-1}
IFS='|' read -ra ARGSETS <<< "$WIDTHS_ARGS"
W=/tmp/w; K=.kit; mkdir -p $W
bash $K/peer.sh $K $W gl >/dev/null
OUT=/tmp/ab bash scripts/gpu/bench_gpu.sh $K $W synth > /tmp/synth.txt 2>&1
nproc; lscpu | grep -E "Model name|^CPU\(s\)" 
[ -x $K/sample_speed ] && $K/sample_speed 2>&1 | tail -6
for m in $MODELS; do
  for args in "${ARGSETS[@]}"; do
    for rep in $(seq "$REPS"); do
    for b in "${BINS[@]}"; do
      timeout 120 $b bench --model $W/$m.gguf --gpu vulkan --prompt-tokens 512 --gen-tokens 128 --reps 1 $args --format json > /tmp/r.json 2>/dev/null
      python3 -c "
import json,sys; d=json.load(open('/tmp/r.json'))
c = d.get('counters', {})
print(sys.argv[1], sys.argv[2], sys.argv[3], 'decode_tps', round(d['decode_tps']), 'full', d.get('full_width_decode_tps') and round(d['full_width_decode_tps']), 'step_ms', d.get('decode_step_ms'),
      'steps', c.get('decode_steps'), 'top', c.get('decode_top_steps'), 'argmax', c.get('decode_argmax_steps'), 'whole_rows', c.get('decode_logits_rows'))" $(basename $b) $m "$args" || echo "$b $m $args: no result"
    done
    done
  done
done
