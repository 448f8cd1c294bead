#!/usr/bin/env bash
# The Vulkan test binaries on the GPU machine (a real GPU: lanes on its queues, its own
# subgroups and integer dot product), on a `resin synth` Llama-3.2-1B Q8_0 in place of the
# registry models, which the machine cannot receive (RESIN_TEST_GGUF; tests that compare with
# the CPU home within a bar are made for the real models and may fail on random weights).
# Build here, then carry .kit: scripts/gpu/make_kit.sh writes the kit with the kernels, prefill
# and engine test binaries gzipped as .kit/t-<name>.gz (this script unpacks them). On the device
# machine, from the repo root:
#   bash scripts/gpu/gpu_tests.sh engine "prefill a_wide_step_in_lanes" ...
# Each argument is a test binary's name (.kit/t-<name>) and its filter; one line a run. Each run
# stops after RESIN_GPU_TEST_TIMEOUT seconds (default 200; the whole kernels suite needs more).
set -uo pipefail
S=$SECONDS; W=/tmp/w; K=.kit; O=${OUT:-/tmp/out}/gpu_tests; mkdir -p $O $W
bash $K/peer.sh $K $W gl >/dev/null 2>&1
for f in $K/t-*.gz; do [ -e "$f" ] && gunzip -kf "$f" && chmod +x "${f%.gz}"; done
[ -d $W/llama.cpp ] || tar xzf $K/llama.cpp-src.tgz -C $W
[ -f $W/llama3.2-1b-q8_0.gguf ] || $K/resin synth --shape llama3.2-1b --type q8_0 --vocab $W/llama.cpp/models/ggml-vocab-llama-bpe.gguf --out $W/llama3.2-1b-q8_0.gguf > $O/synth.log 2>&1 || { tail -3 $O/synth.log; exit 1; }
export RESIN_TEST_GGUF=$W/llama3.2-1b-q8_0.gguf RESIN_REQUIRE_VULKAN=1
i=0; failed=0
for t in "$@"; do
  set -- $t; i=$((i + 1)); log=$O/$i-$1.log
  timeout ${RESIN_GPU_TEST_TIMEOUT:-200} $K/t-$1 "${@:2}" --nocapture > $log 2>&1
  rc=$?; [ $rc -eq 0 ] || failed=1
  echo "$t: rc $rc $(grep -o 'test result: [a-z]*. [0-9]* passed; [0-9]* failed' $log) at $((SECONDS - S)) s"
  grep -E "panicked" -A2 $log | head -6
done
exit $failed
