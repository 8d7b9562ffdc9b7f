#!/bin/bash
# Session 19, call 3: the memory cells with the pool's waiter fix (HEAD),
# the alloc+free cost A/B against 1e0306c (-d: before #34's pool), a
# launch-bound server alone under a ceiling, HEAD against 2a81f63 (-c).
exec > >(tee $OUT/run3.log) 2>&1
export PYTHONUNBUFFERED=1
L=.carry/libcuslice.so C=.carry/cuslice D=.carry/libcuslice-d.so B=.carry/libcuslice-c.so W=/tmp/s19
rm -rf $W; mkdir -p $W
date; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
echo "== memory_bend"; timeout 150 python3 scripts/gpu/memory_bend.py --cli $C --lib $L --out $W/bend > $W/bend.md 2> $W/bend.err; echo "rc=$?"; cat $W/bend.md; tail -3 $W/bend.err
date
echo "== alloc+free A/B"; timeout 170 python3 scripts/gpu/overhead_ab.py --lib $L --lib-b $D --trials 3 --all 'memory = "8GiB"' > $W/ovab.md 2> $W/ovab.err; echo "rc=$?"; cat $W/ovab.md; grep -v "^|" $W/ovab.err | tail -3
date
echo "== ceiling, launch-bound"; timeout 170 python3 scripts/gpu/ceiling_launch_bound.py --lib $L --cli $C --lib-b $B --starts 3 > $W/ceiling.md 2> $W/ceiling.err; echo "rc=$?"; cat $W/ceiling.md; tail -3 $W/ceiling.err
date
tar czf $OUT/all.tgz -C $W --exclude='*/gpu' .
