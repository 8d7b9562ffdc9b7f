#!/bin/bash
# Session 18, issues #34 and #35 on one GPU, one call: the health source
# runs for SOAK_S seconds (scripts/gpu/health_soak.sh: its load is a
# matmul loop under a quota and share, and native allocation churn), and
# beside it, as more load: memory burst and waiting (memory_bend.py), live
# resize (resize_check.py), and the 1 MiB alloc+free cost under a memory
# quota against the build before this session (1e0306c,
# .carry/libcuslice-d.so). Everything but the log is packed in all.tgz.
exec > $OUT/run.log 2>&1
export PYTHONUNBUFFERED=1
L=.carry/libcuslice.so; C=.carry/cuslice; D=.carry/libcuslice-d.so
W=/tmp/s18; rm -rf $W; mkdir -p $W
date; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
bash scripts/gpu/health_soak.sh $C $L $W/soak ${SOAK_S:-540} > $W/soak.out 2>&1 &
soak=$!
sleep 20
echo "== memory_bend"; timeout 200 python3 scripts/gpu/memory_bend.py --cli $C --lib $L --out $W/bend > $W/bend.md 2> $W/bend.err; echo "rc=$?"; cat $W/bend.md; tail -3 $W/bend.err
echo "== resize"; timeout 150 python3 scripts/gpu/resize_check.py --cli $C --lib $L --out $W/resize > $W/resize.md 2> $W/resize.err; echo "rc=$?"; cat $W/resize.md; tail -3 $W/resize.err
echo "== alloc+free A/B"; timeout 200 python3 scripts/gpu/overhead_ab.py --lib $L --lib-b $D --trials ${TRIALS:-4} --all 'memory = "8GiB"' > $W/ovab.md 2> $W/ovab.err; echo "rc=$?"; cat $W/ovab.md
date
wait $soak; echo "== soak rc=$?"; cat $W/soak.out | tail -30
date
rm -rf $W/bend/gpu $W/resize/gpu 2>/dev/null
tar czf $OUT/all.tgz -C $W . 2>/dev/null; ls -la $OUT
