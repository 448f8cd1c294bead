#!/usr/bin/env bash
# Writes the reference figure `resin perplexity` is tested against: builds llama.cpp's
# `llama-perplexity` (CPU only, Release, that target alone) from ../shared/device/llama.cpp-src.tgz,
# runs it on testdata/text/paradise-lost.txt with SmolLM2-135M (the registry's smollm2-135m file)
# and writes testdata/perplexity/<name>.json, which crates/resin/tests/perplexity.rs reads.
#
#   bash scripts/llama_perplexity_fixture.sh [--ctx 128] [--chunks 8] [--name smollm2-135m] [--add-bos]
#
# --add-bos: measure a copy of the model whose tokenizer.ggml.add_bos_token is set true (one byte
# of its metadata), so the windows' BOS handling is compared too: the registry's models add none.
# crates/resin/tests/perplexity.rs makes the same copy.
#
# Env: WORK (build folder, default /tmp/resin-llama-ppl; kept, so a second run only reruns),
# JOBS (build jobs, default 1), THREADS (llama-perplexity threads, default 2), MODEL (a GGUF
# path instead of the registry file), OUT (the fixture path).
set -euo pipefail
cd "$(dirname "$0")/.."
CTX=128 CHUNKS=8 NAME=smollm2-135m ADD_BOS=0
while [ $# -gt 0 ]; do
  case $1 in
    --add-bos) ADD_BOS=1; shift;;
    --ctx) CTX=$2; shift 2;;
    --chunks) CHUNKS=$2; shift 2;;
    --name) NAME=$2; shift 2;;
    *) echo "unknown argument $1" >&2; exit 2;;
  esac
done
WORK=${WORK:-/tmp/resin-llama-ppl}
JOBS=${JOBS:-1}
THREADS=${THREADS:-2}
TEXT=testdata/text/paradise-lost.txt
SRC=../shared/device/llama.cpp-src.tgz
TAG=$NAME; [ "$ADD_BOS" = 1 ] && TAG=$NAME-add-bos
OUT=${OUT:-testdata/perplexity/$TAG-ctx$CTX-chunks$CHUNKS.json}

[ -f "$SRC" ] || { echo "$SRC not found (the shared folder beside the checkout)" >&2; exit 1; }
command -v cmake >/dev/null || { echo "cmake not found (apt-get install cmake, or pip install cmake ninja)" >&2; exit 1; }
mkdir -p "$WORK"
if [ ! -f "$WORK/llama.cpp/CMakeLists.txt" ]; then
  tar -xzf "$SRC" -C "$WORK"
fi
GEN=(); command -v ninja >/dev/null && GEN=(-G Ninja)
BIN="$WORK/build/bin/llama-perplexity"
if [ ! -x "$BIN" ]; then
  cmake -S "$WORK/llama.cpp" -B "$WORK/build" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
    -DLLAMA_BUILD_SERVER=OFF > "$WORK/cmake.log" 2>&1 || { tail -30 "$WORK/cmake.log"; exit 1; }
  cmake --build "$WORK/build" -j "$JOBS" --target llama-perplexity > "$WORK/build.log" 2>&1 || { tail -40 "$WORK/build.log"; exit 1; }
fi

MODEL=${MODEL:-$(cargo run --release -q -p resin -- pull "$NAME")}
[ -f "$MODEL" ] || { echo "model $MODEL not found" >&2; exit 1; }
if [ "$ADD_BOS" = 1 ]; then
  COPY="$WORK/$(basename "$MODEL" .gguf).add-bos.gguf"
  python3 - "$MODEL" "$COPY" <<'EOF'
import shutil, sys
src, dst = sys.argv[1:]
key = b"tokenizer.ggml.add_bos_token"
shutil.copyfile(src, dst)
with open(dst, "r+b") as f:
    head = f.read(1 << 20)
    if head.count(key) != 1:
        sys.exit(f"{src}: expected one {key.decode()} key in the first MiB")
    at = head.find(key) + len(key)
    if head[at:at + 4] != (7).to_bytes(4, "little"):  # GGUF type 7: bool
        sys.exit(f"{src}: {key.decode()} is not a bool")
    f.seek(at + 4)
    f.write(b"\x01")
EOF
  MODEL=$COPY
fi

LOG="$WORK/ppl-$TAG-ctx$CTX-chunks$CHUNKS.log"
CMD=(llama-perplexity -m "$(basename "$MODEL")" -f "$TEXT" -c "$CTX" --chunks "$CHUNKS" -t "$THREADS")
"$BIN" -m "$MODEL" -f "$TEXT" -c "$CTX" --chunks "$CHUNKS" -t "$THREADS" > "$LOG" 2>&1 || { tail -30 "$LOG"; exit 1; }
LINE=$(grep -a "Final estimate: PPL" "$LOG") || { tail -30 "$LOG"; echo "no final estimate in $LOG" >&2; exit 1; }

VERSION=$("$BIN" --version 2>&1 | sed -n 1p)  # sed reads it all: head would SIGPIPE it under pipefail
mkdir -p "$(dirname "$OUT")"
python3 - "$OUT" "$LINE" "$MODEL" "$TEXT" "$CTX" "$CHUNKS" "$THREADS" "${CMD[*]}" "$VERSION" "$SRC" <<'EOF'
import hashlib, json, os, re, sys, datetime, platform
out, line, model, text, ctx, chunks, threads, cmd, version, src = sys.argv[1:]
m = re.search(r"PPL = ([0-9.]+) \+/- ([0-9.]+)", line)
sha = lambda p: hashlib.sha256(open(p, "rb").read()).hexdigest()
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.machine())
fixture = {
    "ppl": float(m.group(1)),
    "ppl_err": float(m.group(2)),
    "ctx": int(ctx),
    "chunks": int(chunks),
    "model": os.path.basename(model),
    "model_sha256": sha(model),
    "text": text,
    "text_sha256": sha(text),
    "llama_cpp": f"{version}; source {os.path.basename(src)} sha256 {sha(src)}",
    "command": cmd,
    "machine": f"{cpu}, {threads} threads",
    "date": datetime.date.today().isoformat(),
}
with open(out, "w") as f:
    json.dump(fixture, f, indent=2)
    f.write("\n")
print(json.dumps(fixture))
EOF
