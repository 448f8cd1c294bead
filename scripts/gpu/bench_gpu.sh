#!/usr/bin/env bash
# GPU benchmark on the device machine, ours and the peer in one lease: llama.cpp's CUDA and Vulkan
# builds (the kit's peer.sh: llama-bench pp512/tg128, flash attention on) and resin's Vulkan home
# on the same synthetic Llama-3.2-1B Q8_0 / 3B Q4_K_M files.
#
#   bash scripts/gpu/bench_gpu.sh KIT WORK stage...
#
# KIT holds the device kit (peer.sh, mkmodel.py, debs/, llama.cpp-src.tgz, vk-kit.tgz) and a resin
# binary built on the dev machine (scripts/gpu/make_kit.sh). Stages: gl build_cuda build_vk models
# bench_cuda bench_vk (the peer's: `models` writes the files with llama.cpp's llama-quantize),
# synth (the same shapes written by `resin synth`, for a run without the peer's build; it keeps a
# file of the same name already in WORK, so `models` first makes every script use llama.cpp's
# files) and resin (our bench on WORK's models, with the per-stage device profile), streams
# (aggregate decode of 8 and 64 streams, TTFT segmented vs one at a time). Logs and JSON land in
# $OUT.
set -uo pipefail
KIT=$(cd "$1" && pwd); W=$2; shift 2; OUT=${OUT:-/tmp/out}; mkdir -p "$W" "$OUT"
for stage in "$@"; do
  echo "== $stage ($(date +%T))"
  case $stage in
    synth)
      [ -d "$W/llama.cpp" ] || tar xzf "$KIT/llama.cpp-src.tgz" -C "$W"
      for t in "llama3.2-1b q8_0" "llama3.2-3b q4_k_m"; do
        set -- $t
        [ -f "$W/$1-$2.gguf" ] || "$KIT/resin" synth --shape $1 --type $2 --vocab "$W/llama.cpp/models/ggml-vocab-llama-bpe.gguf" --out "$W/$1-$2.gguf" \
          > "$OUT/synth-$1.log" 2>&1 || { tail -5 "$OUT/synth-$1.log"; exit 1; }
      done ;;
    resin)
      for m in llama3.2-1b-q8_0 llama3.2-3b-q4_k_m; do
        [ -f "$W/$m.gguf" ] || { echo "no $W/$m.gguf (run the models stage)"; continue; }
        "$KIT/resin" bench --model "$W/$m.gguf" --gpu vulkan --prompt-tokens 512 --gen-tokens 128 --reps 3 --profile \
          --format json 2> "$OUT/resin-$m.log" | tee "$OUT/resin-$m.json" || tail -5 "$OUT/resin-$m.log"
      done ;;
    streams)
      # Aggregate decode of 8 and 64 concurrent streams (512-token prompts, 128 generated), and
      # time to first token of 8 prompts arriving together: segmented against one at a time.
      for m in llama3.2-1b-q8_0 llama3.2-3b-q4_k_m; do
        [ -f "$W/$m.gguf" ] || { echo "no $W/$m.gguf"; continue; }
        for n in 8 64; do
          "$KIT/resin" bench --model "$W/$m.gguf" --gpu vulkan --streams $n --prompt-tokens 512 --gen-tokens 128 --reps 1 \
            --format json 2> "$OUT/streams-$m-$n.log" | tee "$OUT/streams-$m-$n.json" || tail -5 "$OUT/streams-$m-$n.log"
        done
        for seg in 8 1; do
          "$KIT/resin" bench --model "$W/$m.gguf" --gpu vulkan --streams 8 --max-segments $seg --prompt-tokens 512 --gen-tokens 1 --reps 3 \
            --format json 2> "$OUT/ttft-$m-seg$seg.log" | tee "$OUT/ttft-$m-seg$seg.json" || tail -5 "$OUT/ttft-$m-seg$seg.log"
        done
      done ;;
    *) bash "$KIT/peer.sh" "$KIT" "$W" "$stage" ;;
  esac
done
