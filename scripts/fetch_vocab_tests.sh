#!/usr/bin/env bash
# Fetches llama.cpp's vocabulary test vectors for the tokenizer tests of resin-model:
# models/ggml-vocab-{llama-bpe,qwen2,gpt-2,llama-spm}.gguf with their .gguf.inp/.gguf.out,
# taken from the llama-cpp-python source package on PyPI (about 16 MB of GGUF, too much to
# commit). Every file is checked against a pinned sha256.
#
#   scripts/fetch_vocab_tests.sh [DEST]     (default: $RESIN_VOCAB_DIR or ~/.cache/resin-dev/vocab)
#
# The tests (crates/model/tests/tokenizer.rs) read the same directory and fail when it is missing.
set -euo pipefail

DEST="${1:-${RESIN_VOCAB_DIR:-$HOME/.cache/resin-dev/vocab}}"
VERSION=0.3.36

SUMS="\
cedc56ca6e2e89f63e781696d1fd76b4b1d49e6720dee86463e915f6e90016ac  ggml-vocab-gpt-2.gguf
be0a11f7071f0c67d3053a2d377d8f35f0dbcb77ff11a60300fb57d36b477cf0  ggml-vocab-gpt-2.gguf.inp
48e8c4cb3ad5c37915b225f872222567c1c4dd4d66951aa53460c8d152ff6d60  ggml-vocab-gpt-2.gguf.out
97272e430d53bc7688f52d5e0ad8ea8f163ede9f1bbd1694feaa504797d5d96e  ggml-vocab-llama-bpe.gguf
be0a11f7071f0c67d3053a2d377d8f35f0dbcb77ff11a60300fb57d36b477cf0  ggml-vocab-llama-bpe.gguf.inp
118abf2034a197fc5c9dec5204dfdeee7004c7c70952ae577f66b99e212fab9b  ggml-vocab-llama-bpe.gguf.out
16c3724582d59aa8bf84711894e833f916ee46a31d80e21312759c48bf8d0e69  ggml-vocab-llama-spm.gguf
be0a11f7071f0c67d3053a2d377d8f35f0dbcb77ff11a60300fb57d36b477cf0  ggml-vocab-llama-spm.gguf.inp
ad6905c925c49c022974fe67e030382e8a4f56eb4489a0b9481dcedb1ec73b29  ggml-vocab-llama-spm.gguf.out
44c2f46b715f585c6ab513970e8a006bfa5badd6108560054921cf598d154d8c  ggml-vocab-qwen2.gguf
be0a11f7071f0c67d3053a2d377d8f35f0dbcb77ff11a60300fb57d36b477cf0  ggml-vocab-qwen2.gguf.inp
de785bb305cc6fa9d43908ed5da337f853c0b79e971348fcfb9f0915a39c5363  ggml-vocab-qwen2.gguf.out"

mkdir -p "$DEST"
if (cd "$DEST" && echo "$SUMS" | sha256sum --check --quiet --status 2>/dev/null); then
    echo "vocab test files already in $DEST"
    exit 0
fi

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
# --no-binary for this package only: the sdist is what holds vendor/llama.cpp/models; its build
# requirements (needed to read its metadata) come as wheels, which keeps this to seconds.
python3 -m pip download --quiet --no-deps --no-binary llama-cpp-python \
    "llama-cpp-python==$VERSION" -d "$tmp"
members=()
while read -r _ name; do
    members+=("llama_cpp_python-$VERSION/vendor/llama.cpp/models/$name")
done <<< "$SUMS"
tar -xzf "$tmp/llama_cpp_python-$VERSION.tar.gz" -C "$tmp" "${members[@]}"
for m in "${members[@]}"; do
    cp "$tmp/$m" "$DEST/"
done
(cd "$DEST" && echo "$SUMS" | sha256sum --check --quiet)
echo "vocab test files in $DEST"
