#!/bin/bash
# Session 13, call 2 (build 6a56600): decode cell starts 4-7 (native, standard, latency)
exec > >(tee $OUT/run56.log) 2>&1
nvidia-smi --query-gpu=name,driver_version,serial --format=csv,noheader
date
timeout 520 python3 scripts/gpu/colo_starts.py --lib .carry/libcuslice.so --pin --window 5 --starts 4 --first-start 4 --decode-period-ms 420 --cells decode --modes native,standard,latency --dump $OUT/dec-b.json > $OUT/dec-b.md 2>$OUT/dec-b.err
echo "rc=$?"; grep "^| decode" $OUT/dec-b.md; grep "^start" $OUT/dec-b.err
date
