#!/bin/bash
# Session 11, call 3: bench_compute's whole compute section with CUPTI detached between probes (CUSLICE_METER_DETACH=1 in every tenant's environment: the default to be).
exec > >(tee $OUT/run39.log) 2>&1
nvidia-smi --query-gpu=name,driver_version,serial --format=csv,noheader
date
export CUSLICE_METER_DETACH=1
timeout 570 python3 scripts/gpu/bench_compute.py --lib .carry/libcuslice.so --quick > $OUT/compute.md 2>$OUT/compute.err
echo "rc=$?"
cat $OUT/compute.md; tail -5 $OUT/compute.err
date
