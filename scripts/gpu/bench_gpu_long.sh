#!/usr/bin/env bash
# Long prompts, A/B of resin builds in one call (issue 29's long prefill): first the window
# attention's GPU test (.kit/t-attn_window, from make_kit.sh: its cooperative-matrix tier runs
# only on a device with the shape), then on the Llama-3.2-1B Q8_0 shape each binary in turn,
# twice: pp512 after 16,384 keys, pp4096 and pp16384 (`resin bench --depth`, `--prompt-tokens`),
# then the last binary's per-stage profile of a 512-row window after 16,384 keys. From the repo
# root on the device machine, the kit in .kit:
#   bash scripts/gpu/bench_gpu_long.sh .kit/resin-base .kit/resin-main
set -uo pipefail
[ $# -ge 2 ] || { echo "usage: $0 BIN_A BIN_B [BIN...]" >&2; exit 2; }
S=$SECONDS; W=/tmp/w; K=.kit; O=${OUT:-/tmp/out}/long; mkdir -p $W $O
bash $K/peer.sh $K $W gl >/dev/null
if [ -f $K/t-attn_window.gz ]; then
  gunzip -kf $K/t-attn_window.gz && chmod +x $K/t-attn_window
  RESIN_REQUIRE_VULKAN=1 timeout 200 $K/t-attn_window --test-threads 1 --nocapture > $O/t-attn_window.log 2>&1
  echo "t-attn_window: rc $? $(grep -o 'test result: [a-z]*. [0-9]* passed; [0-9]* failed' $O/t-attn_window.log)"
  grep -E "coopmat|SKIP|panicked" $O/t-attn_window.log | head -12
fi
OUT=$O bash scripts/gpu/bench_gpu.sh $K $W synth > $O/synth.log 2>&1
M=$W/llama3.2-1b-q8_0.gguf
[ -f $M ] || { echo "no $M"; tail -3 $O/synth.log; exit 1; }
run() { # name binary args...
  local n=$1 b=$2; shift 2
  timeout 120 "$b" bench --model $M --gpu vulkan --reps 1 --format json "$@" > $O/$n-$(basename $b).json 2> $O/$n-$(basename $b).log
  python3 -c "
import json, sys
d = json.load(open(sys.argv[2]))
print(sys.argv[1], {k: round(d[k], 1) for k in ['pp_tps', 'tg_tps'] if d.get(k)})
" "$n $(basename $b)" $O/$n-$(basename $b).json || echo "$n $(basename $b): no result"
}
for rep in 1 2; do
  for b in "$@"; do
    run d16k-pp512-$rep $b --ctx 16960 --depth 16384 --prompt-tokens 512 --gen-tokens 8
    run pp4096-$rep $b --ctx 4200 --prompt-tokens 4096 --gen-tokens 8
    run pp16384-$rep $b --ctx 16500 --prompt-tokens 16384 --gen-tokens 8
  done
done
last=${@: -1}
timeout 120 "$last" bench --model $M --gpu vulkan --reps 1 --ctx 16960 --depth 16384 --prompt-tokens 512 --gen-tokens 8 --profile --format json > $O/profile.json 2> $O/profile.log
python3 -c "
import json
p = (json.load(open('$O/profile.json')).get('profile') or {}).get('window')
print('profile', round(p['total_us']), [(o[0], round(o[1])) for o in p['ops_us'][:8]]) if p else print('no profile')
"
echo "end at $((SECONDS - S)) s"
