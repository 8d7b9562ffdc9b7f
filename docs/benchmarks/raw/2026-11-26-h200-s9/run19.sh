#!/bin/bash
# Session 9, call 1: meter probes. Two light services side by side (native / standard / continuous meter), then split + conservation.
exec > >(tee $OUT/run19.log) 2>&1
nvidia-smi --query-gpu=name,driver_version,serial --format=csv,noheader
date
COLO_LOGS=$OUT/pair timeout 280 python3 scripts/gpu/colo_starts.py --lib .carry/libcuslice.so --pin --starts 4 --cells pair --modes native,standard,continuous > $OUT/pair.md 2>$OUT/pair.err
cat $OUT/pair.md; tail -5 $OUT/pair.err
grep -h "GPU time meter\|passes launching" $OUT/pair/*standard* | sort | uniq -c | head -20
date
timeout 250 python3 scripts/gpu/bench_compute.py --lib .carry/libcuslice.so --quick --sections split,conservation > $OUT/compute.md 2>$OUT/compute.err
sed -n '/^| section/,$p' $OUT/compute.md
tail -3 $OUT/compute.err
date
