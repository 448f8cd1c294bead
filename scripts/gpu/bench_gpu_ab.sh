#!/usr/bin/env bash
# A/B of resin builds in one device call (how each change is measured since the sixth session):
# for each synthetic model, each binary runs `resin bench` pp512/tg128 with the per-stage
# profile (a 512-row window, 1-row, 8-row and 32-row wide steps) and aggregate decode at the
# given stream counts, one binary after the other on the same files, so the difference is the
# change and not the call. The figures are resin against resin: the peer's come from
# scripts/gpu/bench_gpu_tg.sh or bench_gpu_lease.sh. From the repo root on the device machine,
# the kit in .kit (scripts/gpu/make_kit.sh):
#   bash scripts/gpu/bench_gpu_ab.sh .kit/resin-old .kit/resin [.kit/resin-c ...] [STREAMS...]
# Arguments that are files are the binaries (two or more), numbers the --streams widths each
# binary runs (default 8). One line a run on stdout, then a table of each figure of every
# binary side by side, with each one's ratio to the first.
set -uo pipefail
BINS=(); WIDTHS=()
for a in "$@"; do
  if [ -f "$a" ]; then BINS+=("$a"); elif [[ "$a" =~ ^[0-9]+$ ]]; then WIDTHS+=("$a"); else echo "not a binary or a width: $a" >&2; exit 2; fi
done
[ ${#BINS[@]} -ge 2 ] || { echo "usage: $0 BIN_A BIN_B [BIN...] [STREAMS...]" >&2; exit 2; }
[ ${#WIDTHS[@]} -gt 0 ] || WIDTHS=(8)
S=$SECONDS; W=/tmp/w; K=.kit; mkdir -p $W
bash $K/peer.sh $K $W gl >/dev/null
OUT=/tmp/ab bash scripts/gpu/bench_gpu.sh $K $W synth > /tmp/synth.txt 2>&1
# One run of each binary first: a fresh process compiles its pipelines (the driver caches them).
for b in "${BINS[@]}"; do timeout 60 "$b" bench --model $W/llama3.2-1b-q8_0.gguf --gpu vulkan --prompt-tokens 64 --gen-tokens 8 --reps 1 --streams 16 > /dev/null 2>&1; done
show() { python3 -c "
import json, sys
d = json.load(open('/tmp/r.json')); p = d.get('profile') or {}
keys = ['pp_tps', 'tg_tps', 'tg_greedy_tps', 'decode_tps', 'full_width_decode_tps', 'ttft_p50_s']
print(sys.argv[1], *[(k, round(d[k], 3)) for k in keys if d.get(k) is not None],
      *[(k, round(p[k]['total_us']), [(o[0], round(o[1])) + ((round(o[2]),) if len(o) > 2 and o[2] else ()) for o in p[k]['ops_us'][:7]]) for k in ['window', 'step', 'step_nrow', 'step_wide'] if p.get(k)])
" "$1" || echo "$1: no result"; }
R=/tmp/ab-runs; rm -rf $R; mkdir -p $R
for m in llama3.2-1b-q8_0 llama3.2-3b-q4_k_m; do
  for i in "${!BINS[@]}"; do
    b=${BINS[$i]}
    RB="$b bench --model $W/$m.gguf --gpu vulkan --prompt-tokens 512 --gen-tokens 128 --format json"
    timeout 90 $RB --reps 3 --profile > /tmp/r.json 2>/dev/null; show "$(basename $b) $m"; cp /tmp/r.json $R/$m-1-$i.json
    for n in "${WIDTHS[@]}"; do
      timeout 90 $RB --reps 1 --streams $n > /tmp/r.json 2>/dev/null; show "$(basename $b) $m streams $n"; cp /tmp/r.json $R/$m-$n-$i.json
    done
  done
done
# Last, so it survives a cut output: each figure of every binary side by side.
python3 - "$R" "${#BINS[@]}" "${WIDTHS[@]}" -- "${BINS[@]}" <<'PY'
import json, sys, os
args = sys.argv[1:]
r, nb = args[0], int(args[1])
sep = args.index("--")
widths, bins = args[2:sep], [os.path.basename(b) for b in args[sep + 1:]]
def get(path, *keys):
    try:
        d = json.load(open(path))
        for k in keys:
            d = d[k]
        return d
    except Exception:
        return None
fmt = lambda v: "-" if v is None else f"{v:,.0f}"
print("| model | figure | " + " | ".join(bins) + " | " + " | ".join(f"{b} / {bins[0]}" for b in bins[1:]) + " |")
print("| --- | --- |" + " ---: |" * (2 * nb - 1))
for m in ["llama3.2-1b-q8_0", "llama3.2-3b-q4_k_m"]:
    rows = [("pp512 t/s", "1", ("pp_tps",)), ("tg128 t/s", "1", ("tg_tps",)), ("tg128 greedy t/s", "1", ("tg_greedy_tps",)),
            ("window us", "1", ("profile", "window", "total_us")),
            ("1-row step us", "1", ("profile", "step", "total_us")), ("8-row step us", "1", ("profile", "step_nrow", "total_us")),
            ("32-row wide step us", "1", ("profile", "step_wide", "total_us"))]
    rows += [(f"{n} streams t/s", n, ("decode_tps",)) for n in widths]
    for name, run, keys in rows:
        v = [get(os.path.join(r, f"{m}-{run}-{i}.json"), *keys) for i in range(nb)]
        ratios = [f"{x / v[0]:.3f}" if x and v[0] else "-" for x in v[1:]]
        print(f"| {m} | {name} | " + " | ".join(fmt(x) for x in v) + " | " + " | ".join(ratios) + " |")
PY
# Every run's JSON (with the whole per-stage profile: the lines above show its six largest
# stages) comes back under $OUT/ab-runs when the device tool gives an $OUT.
if [ -n "${OUT:-}" ]; then mkdir -p "$OUT/ab-runs" && cp $R/*.json "$OUT/ab-runs/"; fi
echo "end at $((SECONDS - S)) s"
