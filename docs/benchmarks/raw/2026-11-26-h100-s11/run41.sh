#!/bin/bash
# Session 11, call 5 (the shipped default: CUPTI detached between probes, guard for the program's own CUPTI use):
# a cuptiSubscribe user beside a trainer (both --compute 50), then the decode cell's starts 6-7.
exec > >(tee $OUT/run41.log) 2>&1
nvidia-smi --query-gpu=name,driver_version,serial --format=csv,noheader
date
C=.carry/cuslice; L=.carry/libcuslice.so
echo "== cuptiSubscribe user beside a trainer"
CUSLICE_LOG=info timeout 30 $C run --lib $L --compute 50 -- python3 -c "
import torch,time
a=torch.randn(8192,8192,device='cuda',dtype=torch.bfloat16)
t=time.monotonic()
while time.monotonic()-t<12:
    for _ in range(20): b=a@a
    torch.cuda.synchronize()
" > $OUT/sub-trainer.log 2>&1 &
sleep 3
CUSLICE_LOG=info timeout 40 $C run --lib $L --compute 50 -- python3 scripts/gpu/experiments/cupti_subscriber.py 7 > $OUT/sub.log 2>&1
echo "rc=$?"
wait
cat $OUT/sub.log | grep -v "^$" | cut -c1-220
grep "GPU 0:\|meter" $OUT/sub-trainer.log | cut -c1-200
echo "== control: the same with CUSLICE_METER_DETACH=0"
CUSLICE_LOG=info timeout 30 $C run --lib $L --compute 50 -- python3 -c "
import torch,time
a=torch.randn(8192,8192,device='cuda',dtype=torch.bfloat16)
t=time.monotonic()
while time.monotonic()-t<12:
    for _ in range(20): b=a@a
    torch.cuda.synchronize()
" > $OUT/sub-trainer0.log 2>&1 &
sleep 3
CUSLICE_METER_DETACH=0 CUSLICE_LOG=info timeout 40 $C run --lib $L --compute 50 -- python3 scripts/gpu/experiments/cupti_subscriber.py 7 > $OUT/sub0.log 2>&1
wait
cat $OUT/sub0.log | grep -v "^$" | cut -c1-220
date
rm -rf /tmp/dec; mkdir -p /tmp/dec
COLO_LOGS=/tmp/dec timeout 400 python3 scripts/gpu/colo_starts.py --lib $L --pin --window 5 --starts 2 --first-start 6 --decode-period-ms 320 --cells decode --modes native,standard,latency --dump /tmp/decode-c.json > $OUT/decode-c.md 2>$OUT/decode-c.err
cp /tmp/decode-c.json $OUT/
cat $OUT/decode-c.md; grep "^start" $OUT/decode-c.err; tail -3 $OUT/decode-c.err
for f in /tmp/dec/*.log; do echo "$(basename $f): $(grep -o 'GPU 0: .*' $f | cut -c1-150)"; done | grep -v ": $"
grep -il "panic\|abort\|segfault" /tmp/dec/*.log
tar czf $OUT/dec-c-logs.tgz -C /tmp dec
date
