#!/usr/bin/env python3
"""Write the seed corpus of the `gguf_reader` fuzz target (fuzz/corpus/gguf_reader/).

Each real model is rewritten into a small but valid GGUF: the same metadata keys and value
types (long arrays such as the token list and merges cut to their first N entries), and the
same tensor table (names, ranks, ggml types, order) with every tensor shrunk to one block per
row and one row per dimension, so a seed is a few tens of KiB instead of hundreds of MiB.
A "small" variant keeps only the first few tensors and 16 array entries.

Usage: scripts/make_fuzz_seeds.py [MODEL_DIR] [OUT_DIR]
  MODEL_DIR defaults to ~/.cache/resin-dev/models, OUT_DIR to fuzz/corpus/gguf_reader.
Seed files have no .gguf extension (the repository's .gitignore ignores *.gguf).
"""
import os
import zlib
import struct
import sys
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter
from gguf.constants import GGML_QUANT_SIZES

ROOT = Path(__file__).resolve().parent.parent
MODELS = {
    "smollm2-135m-q4_1": "SmolLM2-135M-Instruct.Q4_1.gguf",
    "qwen2.5-coder-0.5b-q4_k_m": "Qwen2.5-Coder-0.5B-Instruct-Q4_K_M.gguf",
}


def field_value(field):
    """(value, vtype, sub_type) of a reader field, as GGUFWriter.add_key_value wants them."""
    main = field.types[0]
    if main == GGUFValueType.ARRAY:
        return field.contents(), main, field.types[-1]
    return field.contents(), main, None


def shrink(reader, out_path, arch_default, max_items, max_tensors, max_str):
    arch = arch_default
    if "general.architecture" in reader.fields:
        arch = reader.fields["general.architecture"].contents()
    w = GGUFWriter(str(out_path), arch)
    for name, field in reader.fields.items():
        if name.startswith("GGUF."):  # the header pseudo-fields of GGUFReader
            continue
        val, vtype, sub = field_value(field)
        if vtype == GGUFValueType.ARRAY:
            if len(field.types) > 2:  # nested arrays: gguf-py cannot round-trip them; skip
                continue
            val = list(val[:max_items])
            if sub == GGUFValueType.STRING:
                val = [s[:max_str] for s in val]
            if not val:
                continue
        elif vtype == GGUFValueType.STRING:
            val = val[:max_str * 64]
        if name == "general.alignment":
            w.data_alignment = int(val)
        w.add_key_value(name, val, vtype, sub_type=sub)

    for t in reader.tensors[:max_tensors]:
        qt = GGMLQuantizationType(t.tensor_type)
        block_len, block_bytes = GGML_QUANT_SIZES[qt]
        rank = len(t.shape)
        # ggml order: dims[0] is the row length; keep the rank, one block per row.
        dims = [block_len] + [2 if i == 1 else 1 for i in range(1, rank)]
        rows = int(np.prod(dims[1:])) if rank > 1 else 1
        rng = np.random.default_rng(zlib.crc32(t.name.encode()))
        if qt == GGMLQuantizationType.F32:
            data = rng.standard_normal(dims[::-1]).astype(np.float32)
            w.add_tensor(t.name, data)
        elif qt == GGMLQuantizationType.F16:
            data = rng.standard_normal(dims[::-1]).astype(np.float16)
            w.add_tensor(t.name, data)
        else:
            # Raw block bytes: numpy shape is the byte shape (rows..., bytes per row).
            byte_shape = dims[::-1][:-1] + [block_bytes]
            data = rng.integers(0, 256, size=byte_shape, dtype=np.uint8)
            # Keep the f16 scales small and finite so a dequantizer sees sane numbers.
            data.reshape(rows, block_bytes)[:, 0:2] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
            w.add_tensor(t.name, data, raw_dtype=qt)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def put_str(b, s):
    s = s.encode()
    b += struct.pack("<Q", len(s)) + s


def handmade(out_dir):
    """A few tiny files gguf-py will not write: v2, nested arrays, all scalar types, no tensors."""
    # All value types, a nested array, custom alignment 64, v2 header, one F32 tensor.
    kv = bytearray()
    n = 0

    def add(key, ty, payload):
        nonlocal n
        put_str(kv, key)
        kv.extend(struct.pack("<I", ty))
        kv.extend(payload)
        n += 1

    add("general.architecture", 8, struct.pack("<Q", 5) + b"llama")
    add("general.alignment", 4, struct.pack("<I", 64))
    for ty, fmt, v in [(0, "<B", 1), (1, "<b", -1), (2, "<H", 2), (3, "<h", -2), (4, "<I", 3), (5, "<i", -3),
                       (6, "<f", 1.5), (7, "<B", 1), (10, "<Q", 4), (11, "<q", -4), (12, "<d", 2.5)]:
        add(f"t.{ty}", ty, struct.pack(fmt, v))
    s = bytearray()
    put_str(s, "é✓")
    add("t.str", 8, bytes(s))
    inner = struct.pack("<IQ", 4, 2) + struct.pack("<II", 7, 8)
    add("t.nested", 9, struct.pack("<IQ", 9, 2) + inner + struct.pack("<IQ", 8, 1) + struct.pack("<Q", 0))
    add("llama.block_count", 4, struct.pack("<I", 1))
    ti = bytearray()
    put_str(ti, "t0")
    ti += struct.pack("<I", 2) + struct.pack("<QQ", 4, 2) + struct.pack("<I", 0) + struct.pack("<Q", 0)
    for version in (2, 3):
        head = struct.pack("<IIQQ", 0x46554747, version, 1, n) + bytes(kv) + bytes(ti)
        head += b"\0" * ((-len(head)) % 64)
        data = np.arange(8, dtype=np.float32).tobytes()
        (out_dir / f"seed-handmade-v{version}").write_bytes(head + data)
    # Metadata only, no tensors.
    head = struct.pack("<IIQQ", 0x46554747, 3, 0, 1)
    b = bytearray()
    put_str(b, "general.name")
    b += struct.pack("<I", 8)
    put_str(b, "empty")
    (out_dir / "seed-handmade-no-tensors").write_bytes(head + bytes(b))


def main():
    model_dir = Path(sys.argv[1] if len(sys.argv) > 1 else os.path.expanduser("~/.cache/resin-dev/models"))
    out_dir = Path(sys.argv[2] if len(sys.argv) > 2 else ROOT / "fuzz/corpus/gguf_reader")
    out_dir.mkdir(parents=True, exist_ok=True)
    for tag, file in MODELS.items():
        path = model_dir / file
        if not path.exists():
            print(f"skip {tag}: {path} missing", file=sys.stderr)
            continue
        reader = GGUFReader(str(path))
        shrink(reader, out_dir / f"seed-{tag}-full", "llama", max_items=128, max_tensors=10**6, max_str=64)
        shrink(reader, out_dir / f"seed-{tag}-small", "llama", max_items=16, max_tensors=6, max_str=16)
    handmade(out_dir)
    total = 0
    for p in sorted(out_dir.iterdir()):
        total += p.stat().st_size
        print(f"{p.stat().st_size:8d}  {p.name}")
    print(f"{total:8d}  total")


if __name__ == "__main__":
    main()
