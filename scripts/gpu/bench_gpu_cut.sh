#!/usr/bin/env bash
# A/B of resin builds on a shape cut to a few layers (`resin synth --layers`), in one call: a
# layer's cost of a large model (Qwen3-30B-A3B's 17 GB file takes about 330 s to write, its
# 6-layer cut about 40 s). Each binary runs pp512 / tg64 twice, alternating, then the last
# binary's per-stage profile (window and one-row step). From the repo root on the device
# machine, the kit in .kit:
#   bash scripts/gpu/bench_gpu_cut.sh .kit/resin-old .kit/resin
# SHAPE (qwen3-30b-a3b), TYPE (q4_k_m), LAYERS (6) and VOCAB (.kit/qwen-vocab.gguf) pick the file.
set -uo pipefail
[ $# -ge 2 ] || { echo "usage: $0 BIN_A BIN_B [BIN...]" >&2; exit 2; }
SHAPE=${SHAPE:-qwen3-30b-a3b}; TYPE=${TYPE:-q4_k_m}; LAYERS=${LAYERS:-6}; VOCAB=${VOCAB:-.kit/qwen-vocab.gguf}
S=$SECONDS; W=/tmp/w; K=.kit; O=${OUT:-/tmp/out}/cut; F=/dev/shm/cut.gguf; mkdir -p $W $O
bash $K/peer.sh $K $W gl >/dev/null
"$1" synth --shape "$SHAPE" --type "$TYPE" --layers "$LAYERS" --vocab "$VOCAB" --out $F > $O/synth.log 2>&1 || { tail -3 $O/synth.log; exit 1; }
echo "$SHAPE $TYPE cut to $LAYERS layers at $((SECONDS - S)) s"
show() { python3 -c "
import json, sys
d = json.load(open(sys.argv[2])); p = d.get('profile') or {}
print(sys.argv[1], {k: round(d[k], 1) for k in ['pp_tps', 'tg_tps', 'tg_greedy_tps', 'weights_gb_s_at_tg'] if d.get(k)})
for k in ['window', 'step']:
    if p.get(k): print(' ', k, round(p[k]['total_us']), [(o[0], round(o[1])) for o in p[k]['ops_us'][:12]])
" "$@" || echo "$1: no result"; }
for rep in 1 2; do
  for b in "$@"; do
    timeout 90 "$b" bench --model $F --gpu vulkan --prompt-tokens 512 --gen-tokens 64 --reps 2 --format json > $O/$(basename $b)-$rep.json 2> $O/$(basename $b)-$rep.log
    show "$(basename $b)" $O/$(basename $b)-$rep.json
  done
done
last=${@: -1}
timeout 90 "$last" bench --model $F --gpu vulkan --prompt-tokens 512 --gen-tokens 32 --reps 1 --profile --format json > $O/profile.json 2> $O/profile.log
show "$(basename $last) profile" $O/profile.json
echo "end at $((SECONDS - S)) s"
