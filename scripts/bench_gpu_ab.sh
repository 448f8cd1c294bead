#!/usr/bin/env bash
# A/B of two resin builds in one device call (the way the sixth session measured each change):
# for each synthetic model, each binary runs `resin bench` pp512/tg128 with the per-stage
# profile and aggregate decode at 8 streams, one after the other on the same files, so the
# difference is the change and not the call. The figures are resin against resin: the peer's
# come from scripts/bench_gpu_lease.sh. From the repo root on the device machine, the kit in
# .kit (scripts/bench_gpu.sh):
#   bash scripts/bench_gpu_ab.sh .kit/resin-old .kit/resin [STREAMS...]
# STREAMS (default 8) are the --streams widths each binary runs. One line a run on stdout,
# then a table of each figure of A beside B.
set -uo pipefail
A=$1; B=$2; shift 2; WIDTHS=${*:-8}
S=$SECONDS; W=/tmp/w; K=.kit; mkdir -p $W
bash $K/peer.sh $K $W gl >/dev/null
OUT=/tmp/ab bash scripts/bench_gpu.sh $K $W synth > /tmp/synth.txt 2>&1
# One run of each binary first: a fresh process compiles its pipelines (the driver caches them).
for b in "$A" "$B"; do timeout 60 "$b" bench --model $W/llama3.2-1b-q8_0.gguf --gpu vulkan --prompt-tokens 64 --gen-tokens 8 --reps 1 --streams 16 > /dev/null 2>&1; done
show() { python3 -c "
import json, sys
d = json.load(open('/tmp/r.json')); p = d.get('profile') or {}
keys = ['pp_tps', 'tg_tps', 'decode_tps', 'full_width_decode_tps', 'ttft_p50_s']
print(sys.argv[1], *[(k, round(d[k], 3)) for k in keys if d.get(k) is not None],
      *[(k, round(p[k]['total_us']), [(a, round(b)) for a, b in p[k]['ops_us'][:6]]) for k in ['step', 'step_nrow'] if p.get(k)])
" "$1" || echo "$1: no result"; }
R=/tmp/ab-runs; rm -rf $R; mkdir -p $R
for m in llama3.2-1b-q8_0 llama3.2-3b-q4_k_m; do
  for i in 0 1; do
    b=$A; [ $i -eq 1 ] && b=$B
    RB="$b bench --model $W/$m.gguf --gpu vulkan --prompt-tokens 512 --gen-tokens 128 --format json"
    timeout 90 $RB --reps 3 --profile > /tmp/r.json 2>/dev/null; show "$(basename $b) $m"; cp /tmp/r.json $R/$m-1-$i.json
    for n in $WIDTHS; do
      timeout 90 $RB --reps 1 --streams $n > /tmp/r.json 2>/dev/null; show "$(basename $b) $m streams $n"; cp /tmp/r.json $R/$m-$n-$i.json
    done
  done
done
# Last, so it survives a cut output: each figure of A beside B.
python3 - "$R" $WIDTHS <<'PY'
import json, sys, os
r, widths = sys.argv[1], sys.argv[2:]
def get(path, *keys):
    try:
        d = json.load(open(path))
        for k in keys:
            d = d[k]
        return d
    except Exception:
        return None
print("| model | figure | A | B | B / A |")
print("| --- | --- | ---: | ---: | ---: |")
for m in ["llama3.2-1b-q8_0", "llama3.2-3b-q4_k_m"]:
    rows = [("pp512 t/s", "1", ("pp_tps",)), ("tg128 t/s", "1", ("tg_tps",)),
            ("1-row step us", "1", ("profile", "step", "total_us")), ("8-row step us", "1", ("profile", "step_nrow", "total_us"))]
    rows += [(f"{n} streams t/s", n, ("decode_tps",)) for n in widths]
    for name, run, keys in rows:
        a, b = (get(os.path.join(r, f"{m}-{run}-{i}.json"), *keys) for i in (0, 1))
        ratio = f"{b / a:.3f}" if a and b else "-"
        fmt = lambda v: "-" if v is None else f"{v:,.0f}"
        print(f"| {m} | {name} | {fmt(a)} | {fmt(b)} | {ratio} |")
PY
echo "end at $((SECONDS - S)) s"
