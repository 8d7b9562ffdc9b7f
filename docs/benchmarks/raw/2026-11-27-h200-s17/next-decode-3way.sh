#!/bin/bash
# For the next GPU session (not run): issue #32's open question, the decode
# server's standard-class p99 against 6a56600 (1.10x median over 12 starts
# in session 17), with 2a81f63 (main before issue #33's cut) as a third
# build, and the services' exit reports kept (COLO_LOGS). Carry three
# builds: .carry/libcuslice.so (HEAD), .carry/libcuslice-b.so (6a56600) and
# .carry/libcuslice-c.so (2a81f63), each `cargo build --release -p cuslice
# --lib` in a worktree. colo_starts.py takes two libraries per call: run
# HEAD against b, then HEAD against c, 4 starts per call (about 300 s each
# for two modes), and read the exit reports for probes taken, rests and
# time waited ("keeps CUPTI attached" would say a PyTorch process called
# cuptiSubscribe or cuptiProfilerInitialize).
export PYTHONUNBUFFERED=1 COLO_LOGS=$OUT/logs; mkdir -p $COLO_LOGS
L=.carry/libcuslice.so
for other in b c; do
  timeout 420 python3 scripts/gpu/colo_starts.py --lib $L --lib-b .carry/libcuslice-$other.so --pin --window 5 --starts 4 --first-start ${FIRST:-0} --decode-period-ms 420 --cells decode --modes standard,standard-b --dump $OUT/decode-$other.json > $OUT/decode-$other.md 2>$OUT/decode-$other.err
  grep "^start\|against" $OUT/decode-$other.err
  grep -h "GPU time meter\|keeps CUPTI\|passes launching" $COLO_LOGS/*decode*service.log | sort | uniq -c | sort -rn | head -20
done
