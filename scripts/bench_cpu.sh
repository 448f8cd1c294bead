#!/usr/bin/env bash
# CPU side-by-side benchmark: llama.cpp (the peer) vs resin on the same GGUF files, same machine, same run.
#
#   scripts/bench_cpu.sh [--build-only] [MODEL.gguf ...]
#
# Builds llama.cpp's CPU backend once (outside the repo, in $PEER_DIR, default /work/peer/llama.cpp)
# from $LLAMA_SRC_TGZ, then for each model runs
#   llama-bench -m FILE -p $PP -n $TG -d $DEPTH -t $THREADS -r $REPS -o json
#   target/release/resin bench --model FILE --prompt-tokens $PP --gen-tokens $TG --depth $DEPTH --reps $REPS --format json
# and prints a table of prompt-processing and generation tokens/s.
# Default models: SmolLM2-135M Q4_1 and Qwen2.5-Coder-0.5B Q4_K_M from $MODELS_DIR (or resin's cache).
# Env: THREADS (2), REPS (5), PP (512), TG (128), DEPTH (0: keys already in the context, as llama-bench -d
# and resin bench --depth), PEER_DIR, LLAMA_SRC_TGZ, MODELS_DIR, RESIN (path of the resin binary),
# OUT_DIR (logs).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
THREADS=${THREADS:-2}
REPS=${REPS:-5}
PP=${PP:-512}
TG=${TG:-128}
DEPTH=${DEPTH:-0}
PEER_DIR=${PEER_DIR:-/work/peer/llama.cpp}
LLAMA_SRC_TGZ=${LLAMA_SRC_TGZ:-/work/shared/device/llama.cpp-src.tgz}
BUILD=${PEER_DIR}/build-cpu
RESIN=${RESIN:-$ROOT/target/release/resin}
OUT_DIR=${OUT_DIR:-$ROOT/target/bench}
mkdir -p "$OUT_DIR"

build_only=0
if [ "${1:-}" = "--build-only" ]; then build_only=1; shift; fi

build_peer() {
  if [ -x "$BUILD/bin/llama-bench" ]; then return 0; fi
  if ! command -v cmake >/dev/null; then
    echo "== installing cmake" >&2
    (apt-get install -y cmake >/dev/null 2>&1) || { apt-get update >/dev/null && apt-get install -y cmake >/dev/null; }
  fi
  if [ ! -f "$PEER_DIR/CMakeLists.txt" ]; then
    [ -f "$LLAMA_SRC_TGZ" ] || { echo "llama.cpp source not found: $LLAMA_SRC_TGZ (set LLAMA_SRC_TGZ)" >&2; exit 1; }
    mkdir -p "$(dirname "$PEER_DIR")"
    tar xzf "$LLAMA_SRC_TGZ" -C "$(dirname "$PEER_DIR")"
  fi
  local gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
  echo "== configuring llama.cpp (CPU) in $BUILD" >&2
  cmake -S "$PEER_DIR" -B "$BUILD" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX_VNNI=ON \
    -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DLLAMA_CURL=OFF -DGGML_BLAS=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_SERVER=ON -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF > "$OUT_DIR/peer-cmake.log" 2>&1 \
    || { tail -30 "$OUT_DIR/peer-cmake.log" >&2; exit 1; }
  echo "== building llama.cpp (log: $OUT_DIR/peer-build.log)" >&2
  local t0=$SECONDS
  nice -n 10 cmake --build "$BUILD" -j "$(nproc)" --target llama-bench llama-cli llama-simple llama-server \
    > "$OUT_DIR/peer-build.log" 2>&1 || { tail -40 "$OUT_DIR/peer-build.log" >&2; exit 1; }
  echo "== llama.cpp built in $((SECONDS - t0)) s" >&2
}

build_peer
[ $build_only = 1 ] && { ls "$BUILD/bin"; exit 0; }

if [ $# -eq 0 ]; then
  cache=${RESIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/resin}/models
  dirs=("${MODELS_DIR:-}" "$cache" "$HOME/.cache/resin-dev/models")
  for f in SmolLM2-135M-Instruct.Q4_1.gguf Qwen2.5-Coder-0.5B-Instruct-Q4_K_M.gguf; do
    found=""
    for d in "${dirs[@]}"; do [ -n "$d" ] && [ -f "$d/$f" ] && { found="$d/$f"; break; }; done
    if [ -z "$found" ] && [ -x "$RESIN" ]; then
      # let resin's hub fetch it (registry name from the file name)
      case $f in SmolLM2*) n=smollm2-135m ;; *) n=qwen2.5-coder-0.5b ;; esac
      "$RESIN" pull "$n" >&2 || true
      [ -f "$cache/$f" ] && found="$cache/$f"
    fi
    [ -n "$found" ] && set -- "$@" "$found" || echo "warning: $f not found (set MODELS_DIR)" >&2
  done
fi
[ $# -gt 0 ] || { echo "no models to benchmark" >&2; exit 1; }

# Extract tokens/s from llama-bench's JSON: prints "pp tg" (avg_ts of the n_prompt>0 and n_gen>0 rows).
peer_ts() { python3 -c '
import json,sys
rows=json.load(open(sys.argv[1])); pp=tg="-"
for r in rows:
    s="%.1f±%.1f"%(r["avg_ts"],r.get("stddev_ts",0))
    if r.get("n_prompt",0)>0 and r.get("n_gen",0)==0: pp=s
    if r.get("n_gen",0)>0 and r.get("n_prompt",0)==0: tg=s
print(pp,tg)' "$1"; }
# resin's JSON: accept a list of llama-bench-like rows or an object with pp/tg fields.
resin_ts() { python3 -c '
import json,sys
try: d=json.load(open(sys.argv[1]))
except Exception: print("fail fail"); sys.exit()
def f(v): return "%.1f"%v if isinstance(v,(int,float)) else str(v)
pp=tg="-"
rows=d if isinstance(d,list) else d.get("results",[d])
for r in rows:
    if not isinstance(r,dict): continue
    for k in ("pp_tps","pp512","prompt_tps","pp"):
        if k in r: pp=f(r[k])
    for k in ("tg_tps","tg128","gen_tps","tg"):
        if k in r: tg=f(r[k])
    if "avg_ts" in r:
        s="%.1f±%.1f"%(r["avg_ts"],r.get("stddev_ts",0))
        if r.get("n_prompt",0)>0 and r.get("n_gen",0)==0: pp=s
        if r.get("n_gen",0)>0 and r.get("n_prompt",0)==0: tg=s
print(pp,tg)' "$1"; }

declare -a TABLE
for m in "$@"; do
  name=$(basename "$m" .gguf)
  echo "== $name: llama-bench" >&2
  pj="$OUT_DIR/peer-$name.json"
  if "$BUILD/bin/llama-bench" -m "$m" -p "$PP" -n "$TG" -d "$DEPTH" -t "$THREADS" -r "$REPS" -o json > "$pj" 2> "$OUT_DIR/peer-$name.err"; then
    read -r ppp ptg < <(peer_ts "$pj")
  else
    tail -5 "$OUT_DIR/peer-$name.err" >&2; ppp=fail; ptg=fail
  fi
  echo "== $name: resin bench" >&2
  rj="$OUT_DIR/resin-$name.json"
  if [ -x "$RESIN" ] && RAYON_NUM_THREADS=$THREADS "$RESIN" bench --model "$m" --prompt-tokens "$PP" --gen-tokens "$TG" \
       --depth "$DEPTH" --reps "$REPS" --threads "$THREADS" --format json > "$rj" 2> "$OUT_DIR/resin-$name.err" \
     || { [ -x "$RESIN" ] && "$RESIN" bench --model "$m" --prompt-tokens "$PP" --gen-tokens "$TG" --depth "$DEPTH" --reps "$REPS" \
       --format json > "$rj" 2> "$OUT_DIR/resin-$name.err"; }; then
    read -r rpp rtg < <(resin_ts "$rj")
  else
    [ -x "$RESIN" ] && tail -5 "$OUT_DIR/resin-$name.err" >&2 || echo "resin binary not found: $RESIN" >&2
    rpp=fail; rtg=fail
  fi
  TABLE+=("$(printf '%-40s %16s %16s %16s %16s' "$name" "$ppp" "$rpp" "$ptg" "$rtg")")
done

echo
printf '%-40s %16s %16s %16s %16s\n' "model (threads=$THREADS, reps=$REPS, depth=$DEPTH)" "llama.cpp pp$PP" "resin pp$PP" "llama.cpp tg$TG" "resin tg$TG"
for row in "${TABLE[@]}"; do echo "$row"; done
echo "(tokens/s; raw JSON in $OUT_DIR)"
