#!/bin/bash
# Session 12, call 5: bench_compute's compute section, first half (caps, matmul, graphs, splits, conservation), on the build with lengthened rests between steady probes (libcuslice-b.so)
exec > >(tee $OUT/run49.log) 2>&1
nvidia-smi --query-gpu=name,driver_version,serial --format=csv,noheader
date
timeout 580 python3 scripts/gpu/bench_compute.py --lib .carry/libcuslice-b.so --quick --sections cap,matmul,graphs,split,conservation > $OUT/compute1.md 2>$OUT/compute1.err
echo "rc=$?"
cat $OUT/compute1.md; tail -5 $OUT/compute1.err
date
