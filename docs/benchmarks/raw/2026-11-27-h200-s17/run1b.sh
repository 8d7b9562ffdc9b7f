#!/bin/bash
# Session 17, call 2 (call 1 ran past its limit in the compute sections):
# splits (spin and matmul), aggregate and conservation on HEAD then b; the
# per-call cost A/B, two more trials; the README's main command.
exec > >(tee $OUT/run1b.log) 2>&1
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,serial --format=csv,noheader
L=.carry/libcuslice.so B=.carry/libcuslice-b.so
date
for who in head b; do
  lib=$L; [ $who = b ] && lib=$B
  timeout 130 python3 scripts/gpu/bench_compute.py --lib $lib --quick --sections split,conservation > $OUT/split-$who.md 2>$OUT/split-$who.err
  echo "$who rc=$?"; grep "^\[" $OUT/split-$who.err; tail -2 $OUT/split-$who.err | grep -v "^\["
  date
done
timeout 240 python3 scripts/gpu/overhead_ab.py --lib $L --lib-b $B --trials 2 > $OUT/overhead-ab.md 2>$OUT/overhead-ab.err
echo "rc=$?"; cat $OUT/overhead-ab.md; grep -v "^|" $OUT/overhead-ab.err | tail -5
date
timeout 60 .carry/cuslice run --memory 4GiB -- python3 examples/train.py
echo "rc=$?"
date
