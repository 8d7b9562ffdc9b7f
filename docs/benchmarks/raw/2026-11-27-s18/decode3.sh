#!/bin/bash
# Session 18: issue #32's open question (the decode server's standard-class
# p99 against 6a56600) with 2a81f63 (main before issue #33's cut) as a third
# build. One call per pair: OTHER=c (2a81f63) or OTHER=b (6a56600), HEAD as
# .carry/libcuslice.so, 4 starts, exit reports kept under $OUT/logs.
export PYTHONUNBUFFERED=1 COLO_LOGS=$OUT/logs; mkdir -p $COLO_LOGS
L=.carry/libcuslice.so; other=${OTHER:-c}; date
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 420 python3 scripts/gpu/colo_starts.py --lib $L --lib-b .carry/libcuslice-$other.so --pin --window 5 --starts 4 --first-start ${FIRST:-0} --decode-period-ms 420 --cells decode --modes ${MODES:-standard,standard-b} --dump $OUT/decode-$other.json > $OUT/decode-$other.md 2>$OUT/decode-$other.err
echo "rc=$?"; grep "^start\|against" $OUT/decode-$other.err
grep -h "GPU time meter\|keeps CUPTI\|passes launching" $COLO_LOGS/*decode*service.log | sed 's/cuslice\[[0-9]*\]/cuslice[N]/' | sort | uniq -c | sort -rn | head -20
date
