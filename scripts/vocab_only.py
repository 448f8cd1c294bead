#!/usr/bin/env python3
"""Write a GGUF that holds only another GGUF's vocabulary (its tokenizer.* keys and its
architecture), for `resin synth --vocab` on a machine that cannot receive the whole model: the
GPU machine takes at most 64 MiB, and Gemma 3's 262,144-token vocabulary is a few MiB of the
270M file's 253 MB.

Usage: scripts/vocab_only.py SRC.gguf DST.gguf   (needs the `gguf` package: pip install gguf)
"""
import sys

import gguf


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    src, dst = sys.argv[1], sys.argv[2]
    r = gguf.GGUFReader(src)
    arch_field = r.fields.get("general.architecture")
    if arch_field is None:
        print(f"{src}: no general.architecture", file=sys.stderr)
        return 1
    arch = bytes(arch_field.parts[arch_field.data[0]]).decode()
    w = gguf.GGUFWriter(dst, arch)
    kept = 0
    for name, f in r.fields.items():
        if not name.startswith("tokenizer."):
            continue
        t = f.types[0]
        if t == gguf.GGUFValueType.ARRAY:
            sub = f.types[1]
            if sub == gguf.GGUFValueType.STRING:
                vals = [bytes(f.parts[i]).decode("utf-8", errors="surrogateescape") for i in f.data]
            else:
                vals = [f.parts[i].tolist()[0] for i in f.data]
            w.add_array(name, vals)
        elif t == gguf.GGUFValueType.STRING:
            w.add_string(name, bytes(f.parts[f.data[0]]).decode("utf-8", errors="surrogateescape"))
        else:
            w.add_key_value(name, f.parts[f.data[0]].tolist()[0], t)
        kept += 1
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"{dst}: {kept} tokenizer keys of {src} ({arch})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
