#!/bin/bash
# Session 12, call 2: decode beside the trainer, 3 starts, native / latency / latency-b (blocking-sync checkpoint events in the standard-class trainer)
exec > >(tee $OUT/run46.log) 2>&1
nvidia-smi --query-gpu=name,driver_version,serial --format=csv,noheader
date
rm -rf /tmp/dec; mkdir -p /tmp/dec
COLO_LOGS=/tmp/dec timeout 560 python3 scripts/gpu/colo_starts.py --lib .carry/libcuslice.so --lib-b .carry/libcuslice-block.so --pin --window 5 --starts 3 --cells decode --modes native,latency,latency-b --dump /tmp/dec.json > $OUT/dec.md 2>$OUT/dec.err
cp /tmp/dec.json $OUT/ 2>/dev/null
cat $OUT/dec.md; grep "^start" $OUT/dec.err
for f in /tmp/dec/*latency*trainer*.log; do echo "== $f"; grep -h "waited\|exit\|lease" $f | cut -c1-300 | tail -3; done
tar czf $OUT/dec-logs.tgz -C /tmp dec
date
