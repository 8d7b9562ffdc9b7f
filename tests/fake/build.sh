#!/usr/bin/env bash
# Builds cuslice's fake CUDA driver into OUTDIR:
#   OUTDIR/libcuda.so.1        (soname libcuda.so.1)       + OUTDIR/libcuda.so -> libcuda.so.1
#   OUTDIR/libnvidia-ml.so.1   (soname libnvidia-ml.so.1)  + OUTDIR/libnvidia-ml.so -> libnvidia-ml.so.1
#   OUTDIR/libcupti.so.13      (soname libcupti.so.13)     + OUTDIR/libcupti.so -> libcupti.so.13
# then checks the exported symbols against cuda-headers/ and fake_extra.h.
# Usage: tests/fake/build.sh OUTDIR      (CC and CFLAGS are honoured)
set -euo pipefail

if [ $# -ne 1 ]; then
    echo "usage: $0 OUTDIR" >&2
    exit 2
fi

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
out="$1"
cc="${CC:-gcc}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"

common=(-std=c11 -O2 -g -fPIC -pthread -Wall -Wextra -I "$repo/cuda-headers" -I "$here")
# shellcheck disable=SC2206 # CFLAGS is a word list on purpose
extra=(${CFLAGS:-})

build() { # build SOURCE SONAME
    local tmp="$out/.$2.tmp.$$"
    "$cc" "${common[@]}" ${extra[@]+"${extra[@]}"} -shared -Wl,-soname,"$2" -Wl,--no-undefined \
        -o "$tmp" "$here/$1" -pthread
    mv -f "$tmp" "$out/$2"
}

build fake_cuda.c libcuda.so.1
build fake_nvml.c libnvidia-ml.so.1
build fake_cupti.c libcupti.so.13
ln -sfn libcuda.so.1 "$out/libcuda.so"
ln -sfn libnvidia-ml.so.1 "$out/libnvidia-ml.so"
ln -sfn libcupti.so.13 "$out/libcupti.so"

# ---- export checks ----------------------------------------------------------
if ! command -v nm >/dev/null 2>&1; then
    echo "build.sh: nm not found; skipping the export checks" >&2
    exit 0
fi

tmpd="$(mktemp -d)"
trap 'rm -rf "$tmpd"' EXIT
fail=0

nm -D --defined-only "$out/libcuda.so.1" | awk '{print $NF}' | sort -u >"$tmpd/cuda.nm"
nm -D --defined-only "$out/libnvidia-ml.so.1" | awk '{print $NF}' | sort -u >"$tmpd/nvml.nm"
nm -D --defined-only "$out/libcupti.so.13" | awk '{print $NF}' | sort -u >"$tmpd/cupti.nm"

# Function names declared in a header: "<rettype> name(" at the start of a line.
decls() { grep -oE '^(const )?[A-Za-z_][A-Za-z0-9_]* \*?(cu|nvml)[A-Za-z0-9_]+\(' "$@" |
    sed -E 's/.*[ *]((cu|nvml)[A-Za-z0-9_]+)\($/\1/' | sort -u; }

decls "$repo/cuda-headers/cuslice_cuda.h" >"$tmpd/cuda.h.names"
decls "$repo/cuda-headers/cuslice_nvml.h" "$repo/cuda-headers/cuslice_nvml_host.h" >"$tmpd/nvml.h.names"
decls "$repo/cuda-headers/cuslice_cupti.h" >"$tmpd/cupti.h.names"
grep -oE '^(const )?[A-Za-z_][A-Za-z0-9_]* \*?cu[A-Za-z0-9_]+\(' "$here/fake_extra.h" |
    sed -E 's/.*[ *](cu[A-Za-z0-9_]+)\($/\1/' | sort -u >"$tmpd/cuda.extra.names"
grep -oE '^(const )?[A-Za-z_][A-Za-z0-9_]* \*?nvml[A-Za-z0-9_]+\(' "$here/fake_extra.h" |
    sed -E 's/.*[ *](nvml[A-Za-z0-9_]+)\($/\1/' | sort -u >"$tmpd/nvml.extra.names"
grep -oE '^ +X\(cu[A-Za-z0-9_]+\)' "$here/fake_cuda.c" | sed -E 's/.*X\((.*)\)/\1/' | sort -u >"$tmpd/cuda.table"

report() { # report FILE MESSAGE
    if [ -s "$1" ]; then
        echo "build.sh: $2:" >&2
        sed 's/^/    /' "$1" >&2
        fail=1
    fi
}

comm -23 "$tmpd/cuda.h.names" "$tmpd/cuda.nm" >"$tmpd/x1"
report "$tmpd/x1" "declared in cuslice_cuda.h but not exported by the fake libcuda.so.1"
comm -23 "$tmpd/cuda.extra.names" "$tmpd/cuda.nm" >"$tmpd/x2"
report "$tmpd/x2" "declared in fake_extra.h but not exported by the fake libcuda.so.1"
comm -23 "$tmpd/nvml.h.names" "$tmpd/nvml.nm" >"$tmpd/x3"
report "$tmpd/x3" "declared in cuslice_nvml.h or cuslice_nvml_host.h but not exported by the fake libnvidia-ml.so.1"
comm -23 "$tmpd/nvml.extra.names" "$tmpd/nvml.nm" >"$tmpd/x4"
report "$tmpd/x4" "declared in fake_extra.h but not exported by the fake libnvidia-ml.so.1"
grep -v '^cu' "$tmpd/cuda.nm" >"$tmpd/x5" || true
report "$tmpd/x5" "libcuda.so.1 exports names that are not cu*"
grep -v '^nvml' "$tmpd/nvml.nm" >"$tmpd/x6" || true
report "$tmpd/x6" "libnvidia-ml.so.1 exports names that are not nvml*"
if [ ! -s "$tmpd/cupti.h.names" ]; then
    echo "build.sh: found no function declarations in cuslice_cupti.h" >&2
    fail=1
fi
comm -23 "$tmpd/cupti.h.names" "$tmpd/cupti.nm" >"$tmpd/x7"
report "$tmpd/x7" "declared in cuslice_cupti.h but not exported by the fake libcupti.so.13"
comm -13 "$tmpd/cupti.h.names" "$tmpd/cupti.nm" | grep '^cupti' >"$tmpd/x9" || true
report "$tmpd/x9" "libcupti.so.13 exports cupti* functions that cuslice_cupti.h does not declare"
grep -v '^cupti' "$tmpd/cupti.nm" >"$tmpd/x8" || true
report "$tmpd/x8" "libcupti.so.13 exports names that are not cupti*"
if ! cmp -s "$tmpd/cuda.table" "$tmpd/cuda.nm"; then
    echo "build.sh: FAKE_CUDA_EXPORTS in fake_cuda.c (the cuGetProcAddress table) differs from the exports:" >&2
    diff "$tmpd/cuda.table" "$tmpd/cuda.nm" | sed 's/^/    /' >&2 || true
    fail=1
fi

if [ "$fail" -ne 0 ]; then
    echo "build.sh: export checks failed" >&2
    exit 1
fi
echo "build.sh: built $out/libcuda.so.1 ($(wc -l <"$tmpd/cuda.nm") exports), $out/libnvidia-ml.so.1 ($(wc -l <"$tmpd/nvml.nm") exports) and $out/libcupti.so.13 ($(wc -l <"$tmpd/cupti.nm") exports)"
