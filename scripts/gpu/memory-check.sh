#!/usr/bin/env bash
# GPU check of the memory quota: what each framework sees and how far it
# gets under a 4 GiB quota, natively for reference and under the shim.
# Usage: scripts/gpu/memory-check.sh PATH/TO/libcuslice.so OUTDIR [QUOTA]
set -uo pipefail
SHIM=$(realpath "$1")
OUT=$2
Q=${3:-4GiB}
HERE=$(cd "$(dirname "$0")" && pwd)
SRC=$HERE/src
mkdir -p "$OUT"
LOG=$OUT/memory.log
: >"$LOG"
SEG=$(mktemp -d)
export PYTHONUNBUFFERED=1 PYTHONPATH=$SRC
shimmed() { CUSLICE_MEMORY=$Q CUSLICE_SEGMENT_DIR=$SEG LD_PRELOAD=$SHIM "$@"; }
row() { echo "\$ $*" >>"$LOG"; "$@" >>"$LOG" 2>&1; }

echo "== context cost (native)" >>"$LOG"
row python3 "$SRC/ctx_probe.py" driver
row python3 "$SRC/ctx_probe.py" torch
echo "== native reference" >>"$LOG"
row python3 "$SRC/mem_torch.py" native-capped-at-16GiB 2>/dev/null || true
echo "== under the shim, quota $Q" >>"$LOG"
row shimmed python3 "$SRC/ctx_probe.py" torch
row shimmed python3 "$SRC/mem_torch.py" default
row env PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True CUSLICE_MEMORY=$Q CUSLICE_SEGMENT_DIR=$SEG LD_PRELOAD=$SHIM python3 "$SRC/mem_torch.py" expandable_segments
row env PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync CUSLICE_MEMORY=$Q CUSLICE_SEGMENT_DIR=$SEG LD_PRELOAD=$SHIM python3 "$SRC/mem_torch.py" cudaMallocAsync
row shimmed python3 "$SRC/mem_cupy.py"
row shimmed python3 "$SRC/mem_jax.py"
echo "== the cuslice command" >>"$LOG"
CLI=$(dirname "$SHIM")/cuslice
row "$CLI" run --lib "$SHIM" --memory "$Q" -- python3 "$SRC/mem_torch.py" cuslice-run
row "$CLI" run --lib "$SHIM" --memory "$Q" -- python3 "$HERE/../../examples/train.py" --steps 30 --batch 8 --width 4096
echo "== two processes, one quota" >>"$LOG"
rm -f "$SEG/ready" "$SEG/stop"
shimmed python3 "$SRC/mem_two.py" hold 2 "$SEG/ready" "$SEG/stop" >>"$LOG" 2>&1 &
HOLD=$!
for _ in $(seq 1 600); do [ -e "$SEG/ready" ] && break; sleep 0.1; done
row shimmed python3 "$SRC/mem_two.py" try 2.5
row shimmed python3 "$SRC/mem_two.py" try 0.75
touch "$SEG/stop"
wait $HOLD
grep -E '^(RESULT|GPU:|trained)' "$LOG"
