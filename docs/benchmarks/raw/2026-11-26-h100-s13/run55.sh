#!/bin/bash
# Session 13, call 1 (build 6a56600): CUPTI registered-never-enabled cost; decode cell starts 0-3 (native, standard, latency)
exec > >(tee $OUT/run55.log) 2>&1
nvidia-smi --query-gpu=name,driver_version,serial --format=csv,noheader
date
timeout 100 python3 scripts/gpu/experiments/cupti_attached.py --requests 8 --cycles 2 > $OUT/cupti.md 2>$OUT/cupti.err
echo "rc=$?"; cat $OUT/cupti.md; tail -3 $OUT/cupti.err
date
timeout 470 python3 scripts/gpu/colo_starts.py --lib .carry/libcuslice.so --pin --window 5 --starts 4 --decode-period-ms 420 --cells decode --modes native,standard,latency --dump $OUT/dec-a.json > $OUT/dec-a.md 2>$OUT/dec-a.err
echo "rc=$?"; grep "^| decode" $OUT/dec-a.md; grep "^start" $OUT/dec-a.err
date
