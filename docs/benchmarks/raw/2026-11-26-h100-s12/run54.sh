#!/bin/bash
# Session 12, call 10 (build 25b9dc7): cuslice status against the truth (gpu_time_check; call 9's attempt lacked its logs directory)
exec > >(tee $OUT/run54.log) 2>&1
nvidia-smi --query-gpu=name,driver_version,serial --format=csv,noheader
date
mkdir -p /tmp/gtc
timeout 300 python3 scripts/gpu/gpu_time_check.py --lib .carry/libcuslice.so --cli .carry/cuslice --seconds 8 --logs /tmp/gtc > $OUT/gpu-time.md 2>$OUT/gpu-time.err
echo "rc=$?"; cat $OUT/gpu-time.md; tail -3 $OUT/gpu-time.err
grep -h "GPU time meter: rec" /tmp/gtc/* 2>/dev/null | cut -c1-200 | head -8
date
