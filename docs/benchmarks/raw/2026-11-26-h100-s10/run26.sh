#!/bin/bash
# Session 10, call 3: item 3 (the decode server alone: no limits / compute 50 / latency / meter always, 3 rounds)
# and the DRA podman run (two claims' containers on this GPU).
exec > >(tee $OUT/run26.log) 2>&1
nvidia-smi --query-gpu=name,driver_version,serial --format=csv,noheader
date
P=0
[ -f /tmp/decode-a.json ] && P=$(python3 -c "import json; print(json.load(open('/tmp/decode-a.json'))['decode_period_ms'])")
rm -rf /tmp/alone; mkdir -p /tmp/alone
COLO_LOGS=/tmp/alone timeout 370 python3 scripts/gpu/colo_starts.py --lib .carry/libcuslice.so --pin --window 5 --starts 0 --decode-period-ms $P --cells decode --modes solo --dump /tmp/decode-alone.json > $OUT/decode-alone.md 2>$OUT/decode-alone.err
cp /tmp/decode-alone.json $OUT/ 2>/dev/null
cat $OUT/decode-alone.md; tail -3 $OUT/decode-alone.err
grep -h "GPU time meter: rec\|passes launching" /tmp/alone/*-service.log | head -30
tar czf $OUT/alone-logs.tgz -C /tmp alone
date
echo "== DRA podman"
tar xJf .carry/podman-tools.tar.xz -C /tmp
timeout 200 bash scripts/gpu/dra-podman.sh .carry/cuslice-dra-plugin .carry/cuslice .carry/libcuslice.so /tmp/tools 10 > $OUT/dra-podman.log 2>&1
echo "rc=$?" >> $OUT/dra-podman.log
cat $OUT/dra-podman.log
date
