#!/bin/bash
# Session 12, call 9 (build 25b9dc7, lengthened rests): cuslice status against the truth (gpu_time_check), then the small service beside the trainer, 5 starts, native / standard
exec > >(tee $OUT/run53.log) 2>&1
nvidia-smi --query-gpu=name,driver_version,serial --format=csv,noheader
date
timeout 280 python3 scripts/gpu/gpu_time_check.py --lib .carry/libcuslice.so --cli .carry/cuslice --seconds 8 --logs /tmp/gtc > $OUT/gpu-time.md 2>$OUT/gpu-time.err
echo "rc=$?"; cat $OUT/gpu-time.md; tail -3 $OUT/gpu-time.err
grep -h "GPU time meter: rec" /tmp/gtc/* 2>/dev/null | cut -c1-200 | head -8
date
timeout 240 python3 scripts/gpu/colo_starts.py --lib .carry/libcuslice.so --pin --starts 5 --cells small --modes native,standard --dump $OUT/small5.json > $OUT/small5.md 2>$OUT/small5.err
grep "^| small" $OUT/small5.md; grep "^start" $OUT/small5.err
date
