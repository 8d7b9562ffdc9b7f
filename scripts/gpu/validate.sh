#!/usr/bin/env bash
# Compatibility matrix on this GPU host (see validate.py): PASS / FAIL / SKIP
# per framework and program, under a memory quota and a compute share.
# Usage: scripts/gpu/validate.sh PATH/TO/libcuslice.so [OUTDIR]
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${2:-$(mktemp -d)}
mkdir -p "$OUT"
python3 "$HERE/validate.py" --lib "$1" --work "$OUT/work" | tee "$OUT/validate.md"
