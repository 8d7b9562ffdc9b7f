#!/bin/bash
# Session 12, call 4: decode beside the trainer, 3 starts: native / standard / standard-b / latency-b, where -b is the
# build with lengthened rests between steady probes (libcuslice-b.so) and the rest 2abf45e; probe times at debug.
exec > >(tee $OUT/run48.log) 2>&1
nvidia-smi --query-gpu=name,driver_version,serial --format=csv,noheader
date
rm -rf /tmp/dec; mkdir -p /tmp/dec
COLO_LOG_LEVEL=debug COLO_LOGS=/tmp/dec timeout 540 python3 scripts/gpu/colo_starts.py --lib .carry/libcuslice.so --lib-b .carry/libcuslice-b.so --pin --window 5 --starts 3 --cells decode --modes native,standard,standard-b,latency-b --dump /tmp/dec.json > $OUT/dec.md 2>$OUT/dec.err
cp /tmp/dec.json $OUT/ 2>/dev/null
cat $OUT/dec.md; grep "^start" $OUT/dec.err
for f in /tmp/dec/*service.log; do echo "== $f"; grep -h "^LAT\|GPU time meter: rec\|cut short\|moved from" $f | cut -c1-300; done
tar czf $OUT/dec-logs.tgz -C /tmp dec
date
