#!/bin/bash
# Session 9, call 5: the co-location section again on the same host, with the meter recording continuously (CUSLICE_METER=continuous: before probes) for A/B.
exec > >(tee $OUT/run23.log) 2>&1
nvidia-smi --query-gpu=name,driver_version,serial --format=csv,noheader
date
CUSLICE_METER=continuous timeout 420 python3 scripts/gpu/bench_compute.py --lib .carry/libcuslice.so --quick --sections colocation > $OUT/compute.md 2>$OUT/compute.err
sed -n '/^| section/,$p' $OUT/compute.md
date
