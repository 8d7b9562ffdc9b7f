#!/bin/bash
# Session 16, call 4 (run inline, 200 s limit, the last of the device
# time): the graphs cell three more times on HEAD, then the decode cell's
# start 1 for the modes call 3 did not reach (native, latency-b). Cut at
# 200 s: the third graphs run crashed, the decode start did not finish.
export PYTHONUNBUFFERED=1; L=.carry/libcuslice.so B=.carry/libcuslice-b.so; date
for i in 3 4 5; do timeout 45 python3 scripts/gpu/bench_compute.py --lib $L --quick --sections graphs 2>&1 | grep -E "^\| graphs|Error" | cut -c1-300; echo "HEAD graphs $i rc=${PIPESTATUS[0]}"; done; date
timeout 100 python3 scripts/gpu/colo_starts.py --lib $L --lib-b $B --pin --window 5 --starts 1 --first-start 1 --decode-period-ms 420 --cells decode --modes native,latency-b 2>&1 | grep -E "^start|^\| decode"; date
