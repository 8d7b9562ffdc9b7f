#!/bin/bash
# Session 9, call 3: decode cell with meter probes, 4 starts pinned: native / standard / latency.
exec > >(tee $OUT/run21.log) 2>&1
nvidia-smi --query-gpu=name,driver_version,serial --format=csv,noheader
date
mkdir -p /tmp/dec
COLO_LOGS=/tmp/dec timeout 560 python3 scripts/gpu/colo_starts.py --lib .carry/libcuslice.so --pin --window 5 --starts 4 --cells decode --modes native,standard,latency > $OUT/decode.md 2>$OUT/decode.err
cat $OUT/decode.md; grep "^start" $OUT/decode.err; tail -3 $OUT/decode.err
grep -h "GPU time meter: rec\|passes launching" /tmp/dec/*-service.log | head -20
tar czf $OUT/dec-logs.tgz -C /tmp dec
date
