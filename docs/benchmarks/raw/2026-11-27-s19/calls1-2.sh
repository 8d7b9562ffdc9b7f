#!/bin/bash
# Session 19, calls 1 and 2 (one warm H200): a 630 s health soak, longer
# than one device call (600 s), so started in a session of its own in call
# 1, which only waits, and collected in call 2, which then ran the compute
# section on the idle GPU.
#
# call 1:
mkdir -p /tmp/soak && rm -rf /tmp/g && cp -r scripts/gpu /tmp/g && cp .carry/cuslice .carry/libcuslice.so /tmp/g/
nvidia-smi --query-gpu=name,driver_version,serial,memory.used --format=csv,noheader
(setsid nohup bash /tmp/g/health_soak.sh /tmp/g/cuslice /tmp/g/libcuslice.so /tmp/soak 630 > /tmp/soak.log 2>&1 < /dev/null &)
sleep 586
# call 2 (started 7 s after call 1 returned):
exec > >(tee $OUT/call2.log) 2>&1; export PYTHONUNBUFFERED=1; date
for i in $(seq 120); do grep -q verdict /tmp/soak.log && break; sleep 2; done; date; cat /tmp/soak.log
tar czf $OUT/soak.tgz --exclude=root -C /tmp soak soak.log
L=.carry/libcuslice.so
timeout 420 python3 scripts/gpu/bench_compute.py --lib $L --quick --sections cap,matmul,graphs,split,conservation,colocation > $OUT/compute.md 2>$OUT/compute.err
echo "rc=$?"; date; grep "^|" $OUT/compute.md; tail -5 $OUT/compute.err
