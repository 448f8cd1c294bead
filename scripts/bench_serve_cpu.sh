#!/usr/bin/env bash
# Served throughput on the CPU home beside llama-server, same model, same machine, same run.
#
#   scripts/bench_serve_cpu.sh [MODEL.gguf]      (default: SmolLM2-135M from resin's cache)
#
# Starts `resin serve --parallel P` and `llama-server -np P` (P = the highest concurrency, so
# both hold every client in a session at once), then runs scripts/bench_serve.py (an asyncio
# client, not resin code) at 1, 8 and 32 concurrent clients against each in turn.
# Env: PEER_DIR (/work/peer/llama.cpp, built by scripts/bench_cpu.sh), THREADS (2), REQUESTS (per level,
# default 2x the concurrency), MAX_TOKENS (64), CTX (per session, 1024), OUT_DIR (target/bench).
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-$(cargo run -q --release -p resin -- pull smollm2-135m 2>/dev/null | tail -1)}
PEER_DIR=${PEER_DIR:-/work/peer/llama.cpp}
LLAMA_SERVER=${LLAMA_SERVER:-$PEER_DIR/build-cpu/bin/llama-server}
THREADS=${THREADS:-2}; MAX_TOKENS=${MAX_TOKENS:-64}; CTX=${CTX:-1024}
LEVELS=${LEVELS:-1,8,32}; P=${LEVELS##*,}
OUT_DIR=${OUT_DIR:-target/bench}; mkdir -p "$OUT_DIR"
RESIN=${RESIN:-target/release/resin}
[ -x "$RESIN" ] || cargo build --release -p resin
python3 -c 'import aiohttp' 2>/dev/null || python3 -m pip install -q aiohttp

wait_up() { for _ in $(seq 1 300); do curl -sf "$1/health" >/dev/null 2>&1 && return 0; sleep 0.5; done; echo "server at $1 did not come up" >&2; return 1; }
run_levels() { # NAME URL
  local args=(-c "$LEVELS" --max-tokens "$MAX_TOKENS")
  [ -n "${REQUESTS:-}" ] && args+=(-n "$REQUESTS")
  python3 scripts/bench_serve.py "$2" "${args[@]}" --markdown | tee "$OUT_DIR/serve-$1.txt"
}

echo "== resin serve (--parallel $P, $THREADS threads)"
"$RESIN" serve --model "$MODEL" --port 18080 --parallel "$P" --ctx "$CTX" --threads "$THREADS" --log warn &
RPID=$!; trap 'kill $RPID 2>/dev/null || true' EXIT
wait_up http://127.0.0.1:18080
run_levels resin http://127.0.0.1:18080
kill $RPID; wait $RPID 2>/dev/null || true

if [ -x "$LLAMA_SERVER" ]; then
  echo "== llama-server (-np $P, -t $THREADS)"
  "$LLAMA_SERVER" -m "$MODEL" --port 18081 -np "$P" -c $((CTX * P)) -t "$THREADS" >"$OUT_DIR/llama-server.log" 2>&1 &
  LPID=$!; trap 'kill $LPID 2>/dev/null || true' EXIT
  wait_up http://127.0.0.1:18081
  run_levels llama-server http://127.0.0.1:18081
  kill $LPID; wait $LPID 2>/dev/null || true
else
  echo "llama-server not found at $LLAMA_SERVER (run scripts/bench_cpu.sh --build-only)" >&2
fi
