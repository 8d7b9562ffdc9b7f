#!/bin/bash
# Session 13, call 4 (build 6a56600): bench_compute --quick colocation (issue-bound rows on a GPU for the first time)
exec > >(tee $OUT/run58.log) 2>&1
nvidia-smi --query-gpu=name,driver_version,serial --format=csv,noheader
date
timeout 340 python3 scripts/gpu/bench_compute.py --lib .carry/libcuslice.so --quick --sections colocation > $OUT/colo.md 2>$OUT/colo.err
echo "rc=$?"; cat $OUT/colo.md | grep -E "^\|" | tail -30; tail -3 $OUT/colo.err
date
