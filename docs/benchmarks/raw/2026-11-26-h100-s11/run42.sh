#!/bin/bash
# Session 11, call 6 (the shipped default: CUPTI detached between probes): cuslice status vs truth vs NVML for the three tenant kinds.
exec > >(tee $OUT/run42.log) 2>&1
nvidia-smi --query-gpu=name,driver_version,serial --format=csv,noheader
date
mkdir -p /tmp/gtc
timeout 420 python3 scripts/gpu/gpu_time_check.py --lib .carry/libcuslice.so --cli .carry/cuslice --logs /tmp/gtc > $OUT/gpu-time.md 2>$OUT/gpu-time.err
echo "rc=$?"
cat $OUT/gpu-time.md; tail -5 $OUT/gpu-time.err
grep -h "keeps CUPTI\|cannot detach\|meter:" /tmp/gtc/* 2>/dev/null | sort | uniq -c | head
tar czf $OUT/gtc-logs.tgz -C /tmp gtc
date
