#!/bin/bash
# Session 10, call 2: decode cell, starts 4-7 (offsets 4, 0.25, 1.5, 3), same machine, the period of call 1.
exec > >(tee $OUT/run25.log) 2>&1
nvidia-smi --query-gpu=name,driver_version,serial --format=csv,noheader
date
P=0
[ -f /tmp/decode-a.json ] && P=$(python3 -c "import json; print(json.load(open('/tmp/decode-a.json'))['decode_period_ms'])")
echo "period from call 1: $P"
rm -rf /tmp/dec; mkdir -p /tmp/dec
COLO_LOGS=/tmp/dec timeout 585 python3 scripts/gpu/colo_starts.py --lib .carry/libcuslice.so --pin --window 5 --starts 4 --first-start 4 --decode-period-ms $P --cells decode --modes native,standard,latency --dump /tmp/decode-b.json > $OUT/decode-b.md 2>$OUT/decode-b.err
cp /tmp/decode-b.json $OUT/
cat $OUT/decode-b.md; grep "^start" $OUT/decode-b.err; tail -3 $OUT/decode-b.err
[ -f /tmp/decode-a.json ] && python3 scripts/gpu/colo_starts.py --lib x --merge /tmp/decode-a.json,/tmp/decode-b.json > $OUT/decode-merged.md && cat $OUT/decode-merged.md
grep -h "GPU time meter: rec\|passes launching" /tmp/dec/*-service.log | head -24
tar czf $OUT/dec-b-logs.tgz -C /tmp dec
date
