#!/bin/bash
# Session 12, call 1 (build 2abf45e; libcuslice-block.so = the same with blocking-sync checkpoint events for
# standard-class tenants): the README's main command; the small service beside the trainer, 6 starts, native /
# standard / standard-b, probe times at debug (do the slow requests fall in the service's probe?)
exec > >(tee $OUT/run45.log) 2>&1
nvidia-smi --query-gpu=name,driver_version,serial --format=csv,noheader
date
echo "== README main command"
timeout 120 .carry/cuslice run --lib .carry/libcuslice.so --memory 4GiB -- python3 examples/train.py 2>&1 | tail -8; echo "rc=${PIPESTATUS[0]}"
rm -rf /tmp/small; mkdir -p /tmp/small
echo "== small, 6 starts"
COLO_LOG_LEVEL=debug COLO_LOGS=/tmp/small timeout 480 python3 scripts/gpu/colo_starts.py --lib .carry/libcuslice.so --lib-b .carry/libcuslice-block.so --pin --starts 6 --cells small --modes native,standard,standard-b --dump /tmp/small.json > $OUT/small.md 2>$OUT/small.err
cp /tmp/small.json $OUT/ 2>/dev/null
cat $OUT/small.md; grep "^start" $OUT/small.err
for f in /tmp/small/*standard*service.log; do echo "== $f"; grep -h "^START\|^LAT\|^SLOW\|meter on at\|meter off at\|GPU time meter:" $f | cut -c1-400; done
tar czf $OUT/small-logs.tgz -C /tmp small
date
