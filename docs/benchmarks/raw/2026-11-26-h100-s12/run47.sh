#!/bin/bash
# Session 12, call 3 (build 2abf45e): decode beside the trainer, native / standard, 3 starts at debug: do the slow
# requests (SLOW due:latency) overlap the meter's re-attach (GPU time meter on at ...)?
exec > >(tee $OUT/run47.log) 2>&1
nvidia-smi --query-gpu=name,driver_version,serial --format=csv,noheader
date
rm -rf /tmp/dec; mkdir -p /tmp/dec
COLO_LOG_LEVEL=debug COLO_LOGS=/tmp/dec timeout 500 python3 scripts/gpu/colo_starts.py --lib .carry/libcuslice.so --pin --window 5 --starts 3 --first-start 3 --cells decode --modes native,standard --dump /tmp/dec.json > $OUT/dec.md 2>$OUT/dec.err
cp /tmp/dec.json $OUT/ 2>/dev/null
cat $OUT/dec.md; grep "^start" $OUT/dec.err
for f in /tmp/dec/*service.log; do echo "== $f"; grep -h "^START\|^LAT\|^SLOW\|meter on at\|meter off at\|GPU time meter: rec" $f | cut -c1-400; done
tar czf $OUT/dec-logs.tgz -C /tmp dec
date
