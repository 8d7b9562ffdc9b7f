#!/bin/bash
# Session 11, call 8 (build b9b97e4): the small service beside the trainer, standard class, 6 starts, probe times at debug:
# do the slow requests (SLOW lines) fall in the service's probes?
exec > >(tee $OUT/run44.log) 2>&1
nvidia-smi --query-gpu=name,driver_version,serial --format=csv,noheader
date
rm -rf /tmp/small; mkdir -p /tmp/small
COLO_LOG_LEVEL=debug COLO_LOGS=/tmp/small timeout 200 python3 scripts/gpu/colo_starts.py --lib .carry/libcuslice.so --pin --starts 6 --cells small --modes standard --native-ref 3.53,1.0,635,1.36 --dump /tmp/small.json > $OUT/small.md 2>$OUT/small.err
cp /tmp/small.json $OUT/ 2>/dev/null
grep "^start" $OUT/small.err
for f in /tmp/small/*service.log; do echo "== $f"; grep -h "^START\|^LAT\|^SLOW\|meter on at\|meter off at\|GPU time meter:" $f | cut -c1-400; done
tar czf $OUT/small-logs.tgz -C /tmp small
date
