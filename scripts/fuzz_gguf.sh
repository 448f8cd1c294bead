#!/usr/bin/env bash
# Fuzz the GGUF reader (fuzz target `gguf_reader`) for a given number of seconds, one job.
#
#   scripts/fuzz_gguf.sh [SECONDS] [extra libFuzzer flags...]     (default 600 s)
#
# Needs cargo-fuzz (`cargo install cargo-fuzz`). Runs on stable Rust: cargo-fuzz passes
# nightly-only flags (-Zsanitizer=address), which RUSTC_BOOTSTRAP=1 allows. Set SANITIZER=none
# to build without AddressSanitizer.
#
# New inputs go to fuzz/corpus/gguf_reader_run/ (git-ignored); the committed seeds in
# fuzz/corpus/gguf_reader/ (scripts/make_fuzz_seeds.py) are only read. Crashes land in
# fuzz/artifacts/gguf_reader/. The log is written to $LOG (default $CARGO_TARGET_DIR/fuzz-gguf.log).
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-600}
shift || true
export RUSTC_BOOTSTRAP=1
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-/work/target-fuzz}
log=${LOG:-$CARGO_TARGET_DIR/fuzz-gguf.log}
mkdir -p fuzz/corpus/gguf_reader_run "$(dirname "$log")"
cd fuzz
echo "fuzzing gguf_reader for ${secs}s; log: $log" >&2
# One process (no -jobs/-workers/-fork), so one core stays free.
cargo fuzz run -s "${SANITIZER:-address}" gguf_reader corpus/gguf_reader_run corpus/gguf_reader -- \
    -max_total_time="$secs" -timeout=10 -print_final_stats=1 "$@" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
echo "--- summary ---" >&2
grep -E '^#[0-9]+.*(DONE|pulse)' "$log" | tail -1 >&2 || true
grep -E 'stat::|Done [0-9]+ runs' "$log" >&2 || true
ls ../fuzz/artifacts/gguf_reader 2>/dev/null | sed 's/^/artifact: /' >&2 || true
exit "$status"
