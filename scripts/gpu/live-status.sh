#!/usr/bin/env bash
# The README's main job on a GPU host, watched from a second shell: two
# programs under `cuslice run` (4 GiB each; 30 % and 70 % of the GPU),
# `cuslice status` (with the GPU header from NVML and each tenant's share
# over the interval) and one frame of `cuslice top` while they run, and the
# exporter's metrics.
# Usage: scripts/gpu/live-status.sh PATH/TO/cuslice OUTDIR
set -uo pipefail
CLI=$(realpath "$1")
OUT=$2
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
"$CLI" run --memory 4GiB --compute 30% -- python3 "$HERE/../../examples/train.py" --steps 400 --batch 8 --width 4096 >"$OUT/train-30.txt" 2>&1 &
A=$!
"$CLI" run --memory 4GiB --compute 70% -- python3 "$HERE/src/mm_loop.py" 14 >"$OUT/matmul-70.txt" 2>&1 &
B=$!
sleep 10
# "A second shell": only reads the segments.
"$CLI" status >"$OUT/status.txt" 2>&1
sleep 2
"$CLI" status --json >"$OUT/status.json" 2>&1
"$CLI" top --once >"$OUT/top.txt" 2>&1
"$CLI" exporter --listen 127.0.0.1:9836 >/dev/null 2>&1 &
E=$!
sleep 1
python3 -c "import urllib.request;print(urllib.request.urlopen('http://127.0.0.1:9836/metrics').read().decode())" >"$OUT/metrics.txt" 2>&1
kill $E
wait $A $B
echo "== status (taken 10 s in)"; cat "$OUT/status.txt"
echo "== train.py at 30 %"; cat "$OUT/train-30.txt"
echo "== matmul loop at 70 %"; cat "$OUT/matmul-70.txt"
echo "== top --once (taken 12 s in)"; cat "$OUT/top.txt"
echo "== status --json"; cat "$OUT/status.json"
echo "== nvidia-smi now"; nvidia-smi --query-gpu=name,memory.used,memory.total,utilization.gpu --format=csv
echo "== metrics (GPU and compute)"; grep -E '^cuslice_(gpu_|compute_used|memory_used|memory_limit|tenant_info)' "$OUT/metrics.txt"
