#!/bin/bash
# Session 9, call 4: the co-location section of bench_compute on the meter-probes shim.
exec > >(tee $OUT/run22.log) 2>&1
nvidia-smi --query-gpu=name,driver_version,serial --format=csv,noheader
date
timeout 420 python3 scripts/gpu/bench_compute.py --lib .carry/libcuslice.so --quick --sections colocation > $OUT/compute.md 2>$OUT/compute.err
sed -n '/^| section/,$p' $OUT/compute.md
tail -3 $OUT/compute.err
date
