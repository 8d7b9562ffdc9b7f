#!/bin/bash
# Session 18, issue #34 on one GPU: memory burst and waiting (memory_bend.py),
# live resize (resize_check.py), the 1 MiB alloc+free cost under a memory
# quota against the build before this session (1e0306c, .carry/libcuslice-d.so),
# with the health source running beside (health soak, issue #35) when given.
export PYTHONUNBUFFERED=1
L=.carry/libcuslice.so; C=.carry/cuslice; D=.carry/libcuslice-d.so
date; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
if [ -n "$SOAK" ]; then
  bash -c "$SOAK" > $OUT/soak.md 2> $OUT/soak.err &
  soak=$!
fi
echo "== memory_bend"; timeout 200 python3 scripts/gpu/memory_bend.py --cli $C --lib $L --out $OUT/bend > $OUT/bend.md 2> $OUT/bend.err; echo "rc=$?"; cat $OUT/bend.md
if [ -f scripts/gpu/resize_check.py ]; then
  echo "== resize"; timeout 150 python3 scripts/gpu/resize_check.py --cli $C --lib $L --out $OUT/resize > $OUT/resize.md 2> $OUT/resize.err; echo "rc=$?"; cat $OUT/resize.md
fi
echo "== alloc+free A/B"; timeout 200 python3 scripts/gpu/overhead_ab.py --lib $L --lib-b $D --trials ${TRIALS:-4} --all 'memory = "8GiB"' > $OUT/ovab.md 2> $OUT/ovab.err; echo "rc=$?"; cat $OUT/ovab.md
date
if [ -n "$SOAK" ]; then wait $soak; echo "== soak"; cat $OUT/soak.md; tail -5 $OUT/soak.err; fi
date
