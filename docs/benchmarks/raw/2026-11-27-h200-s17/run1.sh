#!/bin/bash
# Session 17, call 1: HEAD (the cut of issue #33: src/compute + src/gputime,
# policy bounds, discovery) against b (6a56600) side by side: the graph
# replay that crashed under a ceiling, 8 runs on HEAD and one beside a
# trainer; the per-call cost A/B; the compute section's caps, matmul,
# splits and conservation on HEAD then b.
exec > >(tee $OUT/run1.log) 2>&1
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,serial --format=csv,noheader
L=.carry/libcuslice.so B=.carry/libcuslice-b.so
W=$(mktemp -d); date
q() { printf 'tenant = "%s"\nsegment_dir = "%s/mem-%s"\ngpu_segment_dir = "%s/gpu"\n[all]\n%s\n' "$1" "$W" "$1" "$W" "$2" > $W/$1.toml; echo $W/$1.toml; }
Q=$(q g30 "compute_max = 30")
for i in 1 2 3 4 5 6 7 8; do
  timeout 60 env LD_PRELOAD=$L CUSLICE_CONFIG=$Q CUSLICE_LOG=info python3 scripts/gpu/src/mm_loop.py 7 graph > $W/g$i.out 2> $W/g$i.err
  echo "graph replay under a 30 % ceiling, run $i: rc=$? $(grep TFLOPS $W/g$i.out) $(grep -o 'unspecified launch failure' $W/g$i.err | head -1) $(grep -o 'keeps CUPTI attached[^;]*' $W/g$i.err | head -1)"
done
date
QA=$(q gt "compute = 50"); QB=$(q tr "compute = 50")
AT=$(python3 -c 'import time;print(time.monotonic()+10)')
START_AT=$AT timeout 60 env LD_PRELOAD=$L CUSLICE_CONFIG=$QB python3 scripts/gpu/src/mm_loop.py 8 > $W/tr.out 2>$W/tr.err &
START_AT=$AT timeout 60 env LD_PRELOAD=$L CUSLICE_CONFIG=$QA CUSLICE_LOG=info python3 scripts/gpu/src/mm_loop.py 8 graph > $W/gt.out 2>$W/gt.err
echo "graph replay beside a trainer, both compute = 50: rc=$? graph $(grep TFLOPS $W/gt.out) trainer $(wait; grep TFLOPS $W/tr.out) $(grep -o 'unspecified launch failure' $W/gt.err | head -1)"
grep -h "GPU time meter\|keeps CUPTI" $W/gt.err | cut -c1-300
date
timeout 150 python3 scripts/gpu/overhead_ab.py --lib $L --lib-b $B --trials 4 > $OUT/overhead-ab.md 2>$OUT/overhead-ab.err
echo "rc=$?"; cat $OUT/overhead-ab.md; tail -3 $OUT/overhead-ab.err
date
timeout 170 python3 scripts/gpu/bench_compute.py --lib $L --quick --sections cap,matmul,split,conservation > $OUT/compute-head.md 2>$OUT/compute-head.err
echo "rc=$?"; grep "^|" $OUT/compute-head.md; tail -3 $OUT/compute-head.err
date
timeout 170 python3 scripts/gpu/bench_compute.py --lib $B --quick --sections cap,matmul,split,conservation > $OUT/compute-b.md 2>$OUT/compute-b.err
echo "rc=$?"; grep "^|" $OUT/compute-b.md; tail -3 $OUT/compute-b.err
date
