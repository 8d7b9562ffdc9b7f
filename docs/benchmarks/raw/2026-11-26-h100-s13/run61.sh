#!/bin/bash
# Session 13, call 7 (ceiling build v2, same as call 6): launch-bound server alone under --compute-max 30 (new build only, 4 starts); caps and matmul sections whole
exec > >(tee $OUT/run61.log) 2>&1
nvidia-smi --query-gpu=name,driver_version,serial --format=csv,noheader
date
timeout 200 python3 scripts/gpu/ceiling_launch_bound.py --lib .carry/libcuslice.so --cli .carry/cuslice --starts 4 > $OUT/ceiling.md 2>$OUT/ceiling.err
echo "rc=$?"; cat $OUT/ceiling.md; cat $OUT/ceiling.err | tail -30
date
timeout 360 python3 scripts/gpu/bench_compute.py --lib .carry/libcuslice.so --sections cap,matmul > $OUT/compute.md 2>$OUT/compute.err
echo "rc=$?"; grep -E "^\|" $OUT/compute.md | grep -v "^|---" ; tail -5 $OUT/compute.err
date
