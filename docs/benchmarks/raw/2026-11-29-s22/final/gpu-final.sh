#!/usr/bin/env bash
# Session 22, last call: the README's main job with the built command (the
# device has no cargo), a live resize of a running program's compute share
# (GPU segments written from the GPU directory's descriptor), and
# resize_check.py.
set -u
CLI=$PWD/target/release/cuslice
LIB=$PWD/target/release/libcuslice.so
nvidia-smi -L > $OUT/gpu.txt
timeout 150 $CLI run --memory 4GiB -- python3 examples/train.py > $OUT/main-job.txt 2>&1
echo "rc=$?" >> $OUT/main-job.txt
setsid $CLI run --memory 4GiB --compute 50 -- python3 -c "
import torch, time
a = torch.randn(4096, 4096, device='cuda')
t = time.time()
while time.time() - t < 30:
    (a @ a).sum().item()
print('program done')
" > $OUT/resize-prog.txt 2>&1 &
run=$!
sleep 10
$CLI status > $OUT/status-before.txt 2>&1
$CLI resize run:$run --compute 30 --compute-max 40 > $OUT/resize.txt 2>&1
echo "rc=$?" >> $OUT/resize.txt
sleep 3
$CLI status > $OUT/status-after.txt 2>&1
wait $run; echo "run rc=$?" >> $OUT/resize-prog.txt
timeout 150 python3 scripts/gpu/resize_check.py --cli $CLI --lib $LIB --out $OUT/resize-check > $OUT/resize-check.md 2>&1
echo "rc=$?" >> $OUT/resize-check.md
