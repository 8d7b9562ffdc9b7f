#!/bin/bash
# Session 17, call 6 (run inline): the decode cell's standard class only,
# starts 4-7, HEAD against b; call 7: gpu_time_check.py (status after the
# discovery merge).
export PYTHONUNBUFFERED=1; L=.carry/libcuslice.so B=.carry/libcuslice-b.so; date
timeout 420 python3 scripts/gpu/colo_starts.py --lib $L --lib-b $B --pin --window 5 --starts 4 --first-start 4 --decode-period-ms 420 --cells decode --modes standard,standard-b --dump $OUT/decode-4.json > $OUT/decode-4.md 2>$OUT/decode-4.err
echo "rc=$?"; grep "^start" $OUT/decode-4.err; date
# call 7
mkdir -p /tmp/gtc
timeout 280 python3 scripts/gpu/gpu_time_check.py --lib .carry/libcuslice.so --cli .carry/cuslice --seconds 8 --logs /tmp/gtc > $OUT/gpu-time.md 2>$OUT/gpu-time.err
# call 8 (another machine): the decode cell's standard class, starts 8-11
timeout 420 python3 scripts/gpu/colo_starts.py --lib $L --lib-b $B --pin --window 5 --starts 4 --first-start 8 --decode-period-ms 420 --cells decode --modes standard-b,standard --dump $OUT/decode-8.json > $OUT/decode-8.md 2>$OUT/decode-8.err
