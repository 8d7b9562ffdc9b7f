#!/bin/bash
# Session 17, call 2: the small service beside a bf16 8192² trainer, 4
# starts, HEAD against b (6a56600) interleaved; the README's main command.
exec > >(tee $OUT/run2.log) 2>&1
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,serial --format=csv,noheader
L=.carry/libcuslice.so B=.carry/libcuslice-b.so
date
timeout 480 python3 scripts/gpu/colo_starts.py --lib $L --lib-b $B --pin --starts 4 --cells small --modes native,standard,standard-b,latency,latency-b --dump $OUT/small.json > $OUT/small.md 2>$OUT/small.err
echo "rc=$?"; grep "^| small" $OUT/small.md; grep "^start" $OUT/small.err
date
timeout 60 .carry/cuslice run --memory 4GiB -- python3 examples/train.py
echo "rc=$?"
date
