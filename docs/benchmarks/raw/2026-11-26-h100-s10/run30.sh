#!/bin/bash
# Session 10, machine 2, call 1: the DRA podman run (two claims' containers), then decode starts 0-3 on the relaxed-probe build.
exec > >(tee $OUT/run30.log) 2>&1
nvidia-smi --query-gpu=name,driver_version,serial --format=csv,noheader
date
echo "== DRA podman"
rm -rf /tmp/tools; tar xJf .carry/podman-tools.tar.xz -C /tmp
timeout 150 bash scripts/gpu/dra-podman.sh .carry/cuslice-dra-plugin .carry/cuslice .carry/libcuslice.so /tmp/tools 10 > $OUT/dra-podman.log 2>&1
echo "rc=$?" >> $OUT/dra-podman.log
cat $OUT/dra-podman.log
date
rm -rf /tmp/dec; mkdir -p /tmp/dec
COLO_LOGS=/tmp/dec timeout 430 python3 scripts/gpu/colo_starts.py --lib .carry/libcuslice.so --pin --window 5 --starts 4 --first-start 0 --cells decode --modes native,standard,latency --dump /tmp/decode-a.json > $OUT/decode-a.md 2>$OUT/decode-a.err
cp /tmp/decode-a.json $OUT/
cat $OUT/decode-a.md; grep "^start" $OUT/decode-a.err; tail -3 $OUT/decode-a.err
grep -h "GPU time meter: rec\|passes launching" /tmp/dec/*-service.log | head -24
tar czf $OUT/dec-a-logs.tgz -C /tmp dec
date
