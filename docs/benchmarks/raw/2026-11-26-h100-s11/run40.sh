#!/bin/bash
# Session 11, call 4: small service + trainer, 8 starts, pinned: native / standard / latency, CUPTI detached between probes (CUSLICE_METER_DETACH=1 in every tenant's environment: the default to be).
exec > >(tee $OUT/run40.log) 2>&1
nvidia-smi --query-gpu=name,driver_version,serial --format=csv,noheader
date
export CUSLICE_METER_DETACH=1
rm -rf /tmp/small; mkdir -p /tmp/small
COLO_LOGS=/tmp/small timeout 560 python3 scripts/gpu/colo_starts.py --lib .carry/libcuslice.so --pin --starts 8 --cells small --modes native,standard,latency --dump /tmp/small.json > $OUT/small.md 2>$OUT/small.err
echo "rc=$?"
cp /tmp/small.json $OUT/
cat $OUT/small.md; grep "^start" $OUT/small.err; tail -3 $OUT/small.err
for f in /tmp/small/*.log; do echo "$(basename $f): $(grep -o 'GPU 0: .*' $f | cut -c1-150)"; done | grep -v ": $" | head -60
tar czf $OUT/small-logs.tgz -C /tmp small
date
