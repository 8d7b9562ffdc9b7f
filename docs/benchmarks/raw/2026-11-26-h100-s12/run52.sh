#!/bin/bash
# Session 12, call 8: decode beside the trainer, 3 more starts (offsets 2, 4, 0.25 s): native / standard (2abf45e) / standard-b (lengthened rests)
exec > >(tee $OUT/run52.log) 2>&1
nvidia-smi --query-gpu=name,driver_version,serial --format=csv,noheader
date
timeout 480 python3 scripts/gpu/colo_starts.py --lib .carry/libcuslice.so --lib-b .carry/libcuslice-b.so --pin --window 5 --starts 3 --first-start 3 --decode-period-ms 420 --cells decode --modes native,standard,standard-b --dump /tmp/dec2.json > $OUT/dec2.md 2>$OUT/dec2.err
cat $OUT/dec2.md | grep "^| decode"; grep "^start" $OUT/dec2.err
cp /tmp/dec2.json $OUT/ 2>/dev/null
echo "== README main command (lengthened-rests build)"
timeout 120 .carry/cuslice run --lib .carry/libcuslice-b.so --memory 4GiB -- python3 examples/train.py 2>&1 | tail -3; echo "rc=${PIPESTATUS[0]}"
date
