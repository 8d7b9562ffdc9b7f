#!/bin/bash
# Session 9, call 2: two light services, 6 starts: native / standard / no meter (CUSLICE_CUPTI=off).
exec > >(tee $OUT/run20.log) 2>&1
nvidia-smi --query-gpu=name,driver_version,serial --format=csv,noheader
date
mkdir -p /tmp/pair
COLO_LOGS=/tmp/pair timeout 330 python3 scripts/gpu/colo_starts.py --lib .carry/libcuslice.so --pin --starts 6 --cells pair --modes native,standard,nometer > $OUT/pair.md 2>$OUT/pair.err
cat $OUT/pair.md; grep "^start" $OUT/pair.err
tar czf $OUT/pair-logs.tgz -C /tmp pair
date
