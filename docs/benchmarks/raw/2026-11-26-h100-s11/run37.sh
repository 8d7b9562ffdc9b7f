#!/bin/bash
# Session 11, call 1: decode + trainer, starts 0-2: native / standard / detach / latency-detach (CUSLICE_METER_DETACH A/B).
exec > >(tee $OUT/run37.log) 2>&1
nvidia-smi --query-gpu=name,driver_version,serial --format=csv,noheader
date
rm -rf /tmp/dec; mkdir -p /tmp/dec
COLO_LOGS=/tmp/dec timeout 560 python3 scripts/gpu/colo_starts.py --lib .carry/libcuslice.so --pin --window 5 --starts 3 --first-start 0 --cells decode --modes native,standard,detach,latency-detach --dump /tmp/decode-a.json > $OUT/decode-a.md 2>$OUT/decode-a.err
cp /tmp/decode-a.json $OUT/
cat $OUT/decode-a.md; grep "^start" $OUT/decode-a.err; tail -3 $OUT/decode-a.err
grep -h "GPU time meter\|passes launching\|detach" /tmp/dec/*-service.log | sort | uniq -c | sort -rn | head -20
grep -il "panic\|error\|abort" /tmp/dec/*.log | head
tar czf $OUT/dec-a-logs.tgz -C /tmp dec
date
