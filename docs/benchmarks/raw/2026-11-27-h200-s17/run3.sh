#!/bin/bash
# Session 17, calls 3 and 4: the decode server beside the trainer, HEAD
# against b (6a56600) interleaved, starts FIRST..FIRST+1 (call 3: 0-1,
# call 4: 2-3; no native pair: the A/B needs none).
exec > >(tee $OUT/run3-$FIRST.log) 2>&1
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,serial --format=csv,noheader
L=.carry/libcuslice.so B=.carry/libcuslice-b.so
date
timeout 560 python3 scripts/gpu/colo_starts.py --lib $L --lib-b $B --pin --window 5 --starts 2 --first-start $FIRST --decode-period-ms 420 --cells decode --modes standard,standard-b,latency,latency-b --dump $OUT/decode-$FIRST.json > $OUT/decode-$FIRST.md 2>$OUT/decode-$FIRST.err
echo "rc=$?"; grep "^| decode" $OUT/decode-$FIRST.md; grep "^start" $OUT/decode-$FIRST.err
date
