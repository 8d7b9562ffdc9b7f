#!/bin/bash
# Session 12, call 6: bench_compute's compute section, second half (overhead, co-location), on the build with lengthened rests between steady probes (libcuslice-b.so)
exec > >(tee $OUT/run50.log) 2>&1
nvidia-smi --query-gpu=name,driver_version,serial --format=csv,noheader
date
timeout 580 python3 scripts/gpu/bench_compute.py --lib .carry/libcuslice-b.so --quick --sections overhead,colocation > $OUT/compute2.md 2>$OUT/compute2.err
echo "rc=$?"
cat $OUT/compute2.md; tail -5 $OUT/compute2.err
date
