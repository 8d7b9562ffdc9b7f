#!/bin/bash
# Session 10, call 4: bench_compute's whole compute section (caps, matmul ceiling, graphs, splits, conservation, overhead, co-location) on the final shim.
exec > >(tee $OUT/run27.log) 2>&1
nvidia-smi --query-gpu=name,driver_version,serial --format=csv,noheader
date
timeout 560 python3 scripts/gpu/bench_compute.py --lib .carry/libcuslice.so --quick > $OUT/compute.md 2>$OUT/compute.err
sed -n '/^| section/,$p' $OUT/compute.md
tail -3 $OUT/compute.err
date
