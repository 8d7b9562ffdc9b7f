#!/bin/bash
# Session 13, call 6 (ceiling build v2: queue-drained gate, first-measurement wait, stop at exit; uncommitted on 6a56600): launch-bound server alone under --compute-max 30 (new vs old); caps, matmul, graphs; decode cell 2 starts
exec > >(tee $OUT/run60.log) 2>&1
nvidia-smi --query-gpu=name,driver_version,serial --format=csv,noheader
date
timeout 200 python3 scripts/gpu/ceiling_launch_bound.py --lib .carry/libcuslice.so --lib-b .carry/libcuslice-old.so --cli .carry/cuslice --starts 3 > $OUT/ceiling.md 2>$OUT/ceiling.err
echo "rc=$?"; cat $OUT/ceiling.md; cat $OUT/ceiling.err | tail -30
date
timeout 200 python3 scripts/gpu/bench_compute.py --lib .carry/libcuslice.so --sections cap,matmul,graphs > $OUT/compute.md 2>$OUT/compute.err
echo "rc=$?"; grep -E "^\|" $OUT/compute.md | grep -v "^|---" ; tail -5 $OUT/compute.err
date
timeout 150 python3 scripts/gpu/colo_starts.py --lib .carry/libcuslice.so --pin --window 5 --starts 2 --decode-period-ms 420 --cells decode --modes native,standard --dump $OUT/dec.json > $OUT/dec.md 2>$OUT/dec.err
echo "rc=$?"; grep "^| decode" $OUT/dec.md; grep "^start" $OUT/dec.err
date
