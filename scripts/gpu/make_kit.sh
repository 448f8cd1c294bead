#!/usr/bin/env bash
# Assemble the GPU machine's kit in .kit (git-ignored, carried by a `device` call with
# carry [".kit"]; it does not outlive this checkout, so a session rebuilds it with this script):
# the machine's files from ../shared/device (peer.sh, mkmodel.py, debs/, llama.cpp-src.tgz; with
# PEER_VK=1 also vk-kit.tgz, for llama.cpp's Vulkan build), a stripped resin binary of each named
# revision, wrappers, and the working tree's Vulkan test binaries gzipped (the carry holds 64 MiB).
#   bash scripts/gpu/make_kit.sh NAME=REV ...        e.g. base=8916c19 main=HEAD
# Writes .kit/resin-NAME for each (HEAD: the working tree, uncommitted changes included; another
# revision's binary already in the kit is kept unless FORCE=1), and the wrappers .kit/resin (the
# last one), .kit/resin-fast and .kit/resin-gemm (it with RESIN_WIDE_STEPS=fast and gemm, the
# environment form of --wide-steps); .kit/t-kernels.gz, t-prefill.gz, t-engine.gz, t-mv.gz, t-attn_window.gz (gunzip them
# on the device machine before scripts/gpu/gpu_tests.sh); .kit/sample_speed. Other revisions
# build in a git worktree under /tmp/kit-wt, in $CARGO_TARGET_DIR-kit-NAME; the working tree in
# $CARGO_TARGET_DIR (default /work/target-vk).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"; cd "$root"
K=.kit; D=../shared/device
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-/work/target-vk}
[ $# -gt 0 ] || { echo "usage: scripts/gpu/make_kit.sh NAME=REV ..." >&2; exit 2; }
mkdir -p $K
rm -rf $K/debs $K/peer.sh $K/mkmodel.py $K/llama.cpp-src.tgz $K/vk-kit.tgz $K/t-* $K/resin-topoff
cp -r $D/peer.sh $D/mkmodel.py $D/debs $D/llama.cpp-src.tgz $K/
[ -z "${PEER_VK:-}" ] || cp $D/vk-kit.tgz $K/
last=""
for nr in "$@"; do
  name=${nr%%=*}; rev=${nr#*=}
  last=$name
  if [ "$rev" != HEAD ] && [ -x $K/resin-$name ] && [ -z "${FORCE:-}" ]; then
    echo "== resin-$name ($rev): kept"; continue
  fi
  if [ "$rev" = HEAD ]; then
    src=$root
  else
    src=/tmp/kit-wt/$name
    git worktree remove --force $src 2>/dev/null || rm -rf $src
    git worktree prune
    git worktree add -q --detach $src "$rev"
  fi
  # A revision of its own target folder: cargo's fingerprints go by file times, so a shared
  # folder can take one tree's crates as fresh for another's.
  tgt=$CARGO_TARGET_DIR; [ "$rev" = HEAD ] || tgt=$CARGO_TARGET_DIR-kit-$name
  echo "== resin-$name ($rev)"
  (cd $src && CARGO_TARGET_DIR=$tgt cargo build --release -q -p resin)
  strip -o $K/resin-$name $tgt/release/resin
done
printf '#!/bin/sh\nexec "$(dirname "$0")/resin-%s" "$@"\n' "$last" > $K/resin
printf '#!/bin/sh\nRESIN_WIDE_STEPS=fast exec "$(dirname "$0")/resin" "$@"\n' > $K/resin-fast
printf '#!/bin/sh\nRESIN_WIDE_STEPS=gemm exec "$(dirname "$0")/resin" "$@"\n' > $K/resin-gemm
chmod +x $K/resin $K/resin-fast $K/resin-gemm
echo "== test binaries and sample_speed (working tree)"
cargo build --release -q -p resin-engine --example sample_speed
strip -o $K/sample_speed $CARGO_TARGET_DIR/release/examples/sample_speed
for t in kernels prefill engine mv attn_window; do
  exe=$(cargo test --release -q -p resin-vulkan --test $t --no-run --message-format=json \
    | python3 -c 'import json,sys
for l in sys.stdin:
    m=json.loads(l)
    if m.get("reason")=="compiler-artifact" and m.get("executable") and m["target"]["kind"]==["test"]: print(m["executable"])' | tail -1)
  strip -o $K/t-$t $exe && gzip -f $K/t-$t
done
ls -la $K
mib=$(du -sm $K | cut -f1)
echo "kit: $mib MiB (a call carries at most 64 with the checkout)"
[ "$mib" -lt 60 ] || { echo "make_kit: the kit is too large to carry" >&2; exit 1; }
