#!/bin/bash
# Session 18: issue #33's comparison against the build before the cut
# (2a81f63, .carry/libcuslice-c.so): the small service beside a bf16
# 8192² trainer, 4 starts, HEAD against c interleaved, both classes.
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
L=.carry/libcuslice.so C=.carry/libcuslice-c.so
date
timeout 500 python3 scripts/gpu/colo_starts.py --lib $L --lib-b $C --pin --starts 4 --cells small --modes standard,standard-b,latency,latency-b --dump $OUT/small-c.json > $OUT/small-c.md 2>$OUT/small-c.err
echo "rc=$?"; grep "^| small" $OUT/small-c.md; grep "^start" $OUT/small-c.err
date
