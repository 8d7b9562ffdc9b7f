#!/bin/bash
# Session 12, call 7: A/B of 2abf45e (standard, latency) and the lengthened-rests build (-b) where the compute section's
# single trials failed: two small services (pair) and the small service in the latency class beside the trainer; 3 starts each
exec > >(tee $OUT/run51.log) 2>&1
nvidia-smi --query-gpu=name,driver_version,serial --format=csv,noheader
date
timeout 260 python3 scripts/gpu/colo_starts.py --lib .carry/libcuslice.so --lib-b .carry/libcuslice-b.so --pin --starts 3 --cells pair --modes native,standard,standard-b --dump /tmp/pair.json > $OUT/pair.md 2>$OUT/pair.err
cat $OUT/pair.md | grep "^| pair"; grep "^start" $OUT/pair.err
timeout 280 python3 scripts/gpu/colo_starts.py --lib .carry/libcuslice.so --lib-b .carry/libcuslice-b.so --pin --starts 3 --cells small --modes native,latency,latency-b --dump /tmp/small.json > $OUT/small.md 2>$OUT/small.err
cat $OUT/small.md | grep "^| small"; grep "^start" $OUT/small.err
cp /tmp/pair.json /tmp/small.json $OUT/ 2>/dev/null
date
