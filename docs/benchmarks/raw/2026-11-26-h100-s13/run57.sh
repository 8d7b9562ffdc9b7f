#!/bin/bash
# Session 13, call 3 (build 6a56600): small cell 8 starts (native, standard, latency)
exec > >(tee $OUT/run57.log) 2>&1
nvidia-smi --query-gpu=name,driver_version,serial --format=csv,noheader
date
timeout 560 python3 scripts/gpu/colo_starts.py --lib .carry/libcuslice.so --pin --starts 8 --cells small --modes native,standard,latency --dump $OUT/small8.json > $OUT/small8.md 2>$OUT/small8.err
echo "rc=$?"; grep "^| small" $OUT/small8.md; grep "^start" $OUT/small8.err
date
