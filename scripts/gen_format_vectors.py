#!/usr/bin/env python3
"""Generate test vectors for resin's ggml block formats (crates/gguf/tests/formats.rs).

An independent implementation checks resin's: the `gguf` PyPI package's numpy codecs
(gguf.quants.dequantize / gguf.quants.quantize), which are written separately from ggml's C.

For each of F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K it writes
  <NAME>.bin      random but valid block bytes (f16 scales finite and of sensible magnitude,
                  including a zero scale, a negative scale and a subnormal scale)
  <NAME>.f32      gguf.quants.dequantize of those bytes, little-endian f32
and for the formats gguf can quantize (F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0)
  quant_input.f32 the fixed input values (shared by all)
  <NAME>.q.bin    gguf.quants.quantize of quant_input.f32
plus manifest.json (gguf / numpy versions, seed, counts).

Usage: python3 scripts/gen_format_vectors.py [out_dir]
  (default out_dir: crates/gguf/tests/data/formats; needs `pip install gguf numpy`)
"""

import json
import os
import sys
from importlib.metadata import version

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants

SEED = 20240607
BLOCKS_32 = 16  # blocks of the 32-value formats
BLOCKS_K = 4  # super-blocks of the K-quants
N_FLOAT = 512  # values of F32 / F16 / BF16

# (name, values per block, bytes per block, byte offsets of f16 scales)
FORMATS = [
    ("Q4_0", 32, 18, [0]),
    ("Q4_1", 32, 20, [0, 2]),
    ("Q5_0", 32, 22, [0]),
    ("Q5_1", 32, 24, [0, 2]),
    ("Q8_0", 32, 34, [0]),
    ("Q2_K", 256, 84, [80, 82]),
    ("Q3_K", 256, 110, [108]),
    ("Q4_K", 256, 144, [0, 2]),
    ("Q5_K", 256, 176, [0, 2]),
    ("Q6_K", 256, 210, [208]),
]
QUANTIZABLE = ["F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"]


def scale_f16(rng: np.random.Generator, n: int) -> np.ndarray:
    """Finite f16 scales: log-uniform magnitudes in [1e-4, 1], random sign."""
    mag = np.exp(rng.uniform(np.log(1e-4), 0.0, size=n))
    sign = np.where(rng.random(n) < 0.5, -1.0, 1.0)
    return (mag * sign).astype(np.float16)


def block_bytes(rng: np.random.Generator, nblocks: int, size: int, offsets: list[int]) -> np.ndarray:
    raw = rng.integers(0, 256, size=(nblocks, size), dtype=np.uint8)
    for off in offsets:
        s = scale_f16(rng, nblocks)
        # Special scales: block 0 zero, block 1 a subnormal, block 2 negative.
        s[0] = np.float16(0.0) if off == offsets[0] else s[0]
        s[1] = np.float16(3.0e-7)
        s[2] = -abs(s[2])
        raw[:, off:off + 2] = s.view(np.uint8).reshape(nblocks, 2)
    return raw.reshape(-1)


def float_inputs(rng: np.random.Generator, n: int) -> np.ndarray:
    x = (rng.standard_normal(n) * np.exp(rng.uniform(-8, 8, n))).astype(np.float32)
    special = [0.0, -0.0, 1.0, -2.5, 65504.0, 6.0e-8, 1.0e-40, 3.0e38]
    x[: len(special)] = np.array(special, dtype=np.float32)
    # Exact f32 halfway cases for BF16 and for F16 (round to even, both directions).
    ties = [0x3F808000, 0x3F818000, 0xBF808000, 0x3F801000, 0x3F803000, 0xC0001000]
    x[len(special): len(special) + len(ties)] = np.array(ties, dtype=np.uint32).view(np.float32)
    return x


def write(out: str, name: str, arr: np.ndarray) -> None:
    with open(os.path.join(out, name), "wb") as f:
        f.write(np.ascontiguousarray(arr).tobytes())


def main() -> None:
    out = sys.argv[1] if len(sys.argv) > 1 else "crates/gguf/tests/data/formats"
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(SEED)
    manifest = {
        "generator": "scripts/gen_format_vectors.py",
        "gguf_version": version("gguf"),
        "numpy_version": np.__version__,
        "seed": SEED,
        "dequantize": {},
        "quantize": {},
    }

    # Floats: F32 as is; F16 / BF16 as random finite bit patterns.
    f32 = float_inputs(rng, N_FLOAT)
    f16 = (rng.standard_normal(N_FLOAT) * np.exp(rng.uniform(-10, 10, N_FLOAT))).astype(np.float16)
    f16[:4] = np.array([0.0, -0.0, 6.0e-8, 65504.0], dtype=np.float16)
    bf16 = rng.integers(0, 1 << 16, size=N_FLOAT, dtype=np.uint16)
    bf16 = np.where((bf16 & 0x7F80) == 0x7F80, bf16 & 0xBFFF, bf16).astype(np.uint16)  # no inf/nan
    for name, raw in [("F32", f32.view(np.uint8)), ("F16", f16.view(np.uint8)), ("BF16", bf16.view(np.uint8))]:
        vals = quants.dequantize(raw, T[name]).astype(np.float32)
        write(out, f"{name}.bin", raw)
        write(out, f"{name}.f32", vals.astype("<f4"))
        manifest["dequantize"][name] = {"values": int(vals.size), "bytes": int(raw.size)}

    for name, qk, size, offsets in FORMATS:
        nb = BLOCKS_K if qk == 256 else BLOCKS_32
        raw = block_bytes(rng, nb, size, offsets)
        vals = quants.dequantize(raw, T[name]).astype(np.float32).reshape(-1)
        assert vals.size == nb * qk and np.isfinite(vals).all(), name
        write(out, f"{name}.bin", raw)
        write(out, f"{name}.f32", vals.astype("<f4"))
        manifest["dequantize"][name] = {"values": int(vals.size), "bytes": int(raw.size)}

    # Quantize: 16 blocks of 32 with per-block magnitudes, a zero block, a constant block,
    # a block with one outlier, and the float edge cases for F16 / BF16.
    x = (rng.standard_normal((BLOCKS_32, 32)) * np.exp(rng.uniform(-6, 3, (BLOCKS_32, 1)))).astype(np.float32)
    x[0] = 0.0
    x[1] = 0.75
    x[2, 5] = 40.0 * np.abs(x[2]).max()
    x[4, :12] = float_inputs(rng, 32)[:12]
    x[4] = np.clip(x[4], -60000.0, 60000.0)  # keep the block's f16 scale finite
    x = x.reshape(-1)
    write(out, "quant_input.f32", x.astype("<f4"))
    for name in QUANTIZABLE:
        q = np.asarray(quants.quantize(x, T[name])).view(np.uint8).reshape(-1)
        write(out, f"{name}.q.bin", q)
        manifest["quantize"][name] = {"values": int(x.size), "bytes": int(q.size)}

    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.write("\n")
    total = sum(os.path.getsize(os.path.join(out, p)) for p in os.listdir(out))
    print(f"gguf {manifest['gguf_version']}, numpy {manifest['numpy_version']}: wrote {out} ({total} bytes)")


if __name__ == "__main__":
    main()
