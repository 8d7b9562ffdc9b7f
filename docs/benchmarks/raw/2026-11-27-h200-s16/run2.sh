#!/bin/bash
# Session 16, call 2: the compute section's second half (overhead,
# co-location) on HEAD; the small service beside a trainer, starts 0-1,
# HEAD against 6a56600 (-b) interleaved.
exec > >(tee $OUT/run2.log) 2>&1
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,serial --format=csv,noheader
L=.carry/libcuslice.so B=.carry/libcuslice-b.so
date
timeout 360 python3 scripts/gpu/bench_compute.py --lib $L --quick --sections overhead,colocation > $OUT/compute2.md 2>$OUT/compute2.err
echo "rc=$?"; cat $OUT/compute2.md; tail -5 $OUT/compute2.err
date
timeout 220 python3 scripts/gpu/colo_starts.py --lib $L --lib-b $B --pin --starts 2 --cells small --modes native,standard,standard-b,latency,latency-b --dump $OUT/small-a.json > $OUT/small-a.md 2>$OUT/small-a.err
echo "rc=$?"; grep "^| small" $OUT/small-a.md; grep "^start" $OUT/small-a.err
date
