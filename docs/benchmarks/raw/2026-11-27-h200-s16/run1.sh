#!/bin/bash
# Session 16, call 1 (HEAD: the held-back sessions 13-15 landed): issue #32
# item 8 (cuslice status against the truth and NVML), the compute section's
# first half, the README's main command.
exec > >(tee $OUT/run1.log) 2>&1
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,serial --format=csv,noheader
L=.carry/libcuslice.so C=.carry/cuslice
date
mkdir -p /tmp/gtc
timeout 270 python3 scripts/gpu/gpu_time_check.py --lib $L --cli $C --seconds 8 --logs /tmp/gtc > $OUT/gpu-time.md 2>$OUT/gpu-time.err
echo "rc=$?"; cat $OUT/gpu-time.md; tail -3 $OUT/gpu-time.err
date
timeout 250 python3 scripts/gpu/bench_compute.py --lib $L --quick --sections cap,matmul,graphs,split,conservation > $OUT/compute1.md 2>$OUT/compute1.err
echo "rc=$?"; cat $OUT/compute1.md; tail -5 $OUT/compute1.err
date
timeout 60 .carry/cuslice run --memory 4GiB -- python3 examples/train.py
echo "rc=$?"
date
