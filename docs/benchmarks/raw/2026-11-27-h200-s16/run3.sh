#!/bin/bash
# Session 16, call 3: call 1's graph-replay cell under a 30 % ceiling died
# with "unspecified launch failure": the graphs section twice on HEAD, once
# with CUSLICE_CUPTI=off (no meter), once on 6a56600; then the sections
# call 1 did not reach (splits, conservation); then a decode server beside
# a trainer, starts 0-1, HEAD against 6a56600 (-b) interleaved.
exec > >(tee $OUT/run3.log) 2>&1
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,serial --format=csv,noheader
L=.carry/libcuslice.so B=.carry/libcuslice-b.so
date
g() { timeout 70 python3 scripts/gpu/bench_compute.py --lib $1 --quick --sections graphs 2>&1 | grep -E "graphs|Error|error|rc=|cuslice\[" | cut -c1-400; echo "graphs rc=${PIPESTATUS[0]}"; }
echo "== HEAD 1"; CUSLICE_LOG=info g $L
echo "== HEAD 2"; CUSLICE_LOG=info g $L
echo "== HEAD, CUSLICE_CUPTI=off"; CUSLICE_CUPTI=off g $L
echo "== 6a56600"; CUSLICE_LOG=info g $B
date
timeout 150 python3 scripts/gpu/bench_compute.py --lib $L --quick --sections split,conservation > $OUT/compute1b.md 2>$OUT/compute1b.err
echo "rc=$?"; cat $OUT/compute1b.md; tail -5 $OUT/compute1b.err
date
timeout 330 python3 scripts/gpu/colo_starts.py --lib $L --lib-b $B --pin --window 5 --starts 2 --decode-period-ms 420 --cells decode --modes native,standard,standard-b,latency,latency-b --dump $OUT/decode-a.json > $OUT/decode-a.md 2>$OUT/decode-a.err
echo "rc=$?"; grep "^| decode" $OUT/decode-a.md; grep "^start" $OUT/decode-a.err
date
