#!/bin/bash
# Session 11, call 7 (the shipped default): decode cell, starts 6-7, native / standard / latency.
exec > >(tee $OUT/run43.log) 2>&1
nvidia-smi --query-gpu=name,driver_version,serial --format=csv,noheader
date
rm -rf /tmp/dec; mkdir -p /tmp/dec
COLO_LOGS=/tmp/dec timeout 330 python3 scripts/gpu/colo_starts.py --lib .carry/libcuslice.so --pin --window 5 --starts 2 --first-start 6 --decode-period-ms 320 --cells decode --modes native,standard,latency --dump /tmp/decode-c.json > $OUT/decode-c.md 2>$OUT/decode-c.err
cp /tmp/decode-c.json $OUT/
cat $OUT/decode-c.md; grep "^start" $OUT/decode-c.err; tail -3 $OUT/decode-c.err
tar czf $OUT/dec-c-logs.tgz -C /tmp dec
date
