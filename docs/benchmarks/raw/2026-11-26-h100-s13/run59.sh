#!/bin/bash
# Session 13, call 5 (ceiling build, uncommitted on 6a56600): a launch-bound server alone under --compute-max 30 (new vs old build); saturating caps, matmul, graphs, splits, conservation
exec > >(tee $OUT/run59.log) 2>&1
nvidia-smi --query-gpu=name,driver_version,serial --format=csv,noheader
date
timeout 260 python3 scripts/gpu/ceiling_launch_bound.py --lib .carry/libcuslice.so --lib-b .carry/libcuslice-old.so --cli .carry/cuslice --starts 3 > $OUT/ceiling.md 2>$OUT/ceiling.err
echo "rc=$?"; cat $OUT/ceiling.md; cat $OUT/ceiling.err | tail -30
date
timeout 300 python3 scripts/gpu/bench_compute.py --lib .carry/libcuslice.so --sections cap,matmul,graphs,split,conservation > $OUT/compute.md 2>$OUT/compute.err
echo "rc=$?"; grep -E "^\|" $OUT/compute.md | grep -v "^|---" ; tail -3 $OUT/compute.err
date
