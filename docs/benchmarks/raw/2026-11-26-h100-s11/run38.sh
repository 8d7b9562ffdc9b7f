#!/bin/bash
# Session 11, call 2: decode + trainer, starts 3-5 (the period of call 1): native / standard / detach / latency-detach (CUSLICE_METER_DETACH A/B).
exec > >(tee $OUT/run38.log) 2>&1
nvidia-smi --query-gpu=name,driver_version,serial --format=csv,noheader
date
rm -rf /tmp/dec; mkdir -p /tmp/dec
COLO_LOGS=/tmp/dec timeout 560 python3 scripts/gpu/colo_starts.py --lib .carry/libcuslice.so --pin --window 5 --starts 3 --first-start 3 --decode-period-ms 320 --cells decode --modes native,standard,detach,latency-detach --dump /tmp/decode-b.json > $OUT/decode-b.md 2>$OUT/decode-b.err
cp /tmp/decode-b.json $OUT/
cat $OUT/decode-b.md; grep "^start" $OUT/decode-b.err; tail -3 $OUT/decode-b.err
grep -h "GPU time meter\|passes launching\|detach" /tmp/dec/*-service.log | sort | uniq -c | sort -rn | head -20
grep -il "panic\|error\|abort" /tmp/dec/*.log | head
tar czf $OUT/dec-b-logs.tgz -C /tmp dec
date
