#!/bin/bash
# Session 10, call 1: decode cell, starts 0-3 (offsets 0, 0.5, 1, 2), pinned: native / standard / latency.
exec > >(tee $OUT/run24.log) 2>&1
nvidia-smi --query-gpu=name,driver_version,serial --format=csv,noheader
date
mkdir -p /tmp/dec
COLO_LOGS=/tmp/dec timeout 585 python3 scripts/gpu/colo_starts.py --lib .carry/libcuslice.so --pin --window 5 --starts 4 --first-start 0 --cells decode --modes native,standard,latency --dump /tmp/decode-a.json > $OUT/decode-a.md 2>$OUT/decode-a.err
cp /tmp/decode-a.json $OUT/
cat $OUT/decode-a.md; grep "^start" $OUT/decode-a.err; tail -3 $OUT/decode-a.err
grep -h "GPU time meter: rec\|passes launching" /tmp/dec/*-service.log | head -24
tar czf $OUT/dec-a-logs.tgz -C /tmp dec
date
