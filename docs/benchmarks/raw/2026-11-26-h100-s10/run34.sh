#!/bin/bash
# Session 10, machine 2, call 3: the DRA podman run again (the host's Python path into the containers);
# then a decode diagnostic, 3 starts: native / standard / trainer-only (service native) / nometer (CUSLICE_CUPTI=off).
exec > >(tee $OUT/run34.log) 2>&1
nvidia-smi --query-gpu=name,driver_version,serial --format=csv,noheader
date
python3 -c 'import sys, torch; print(sys.executable, torch.__file__)'; env | grep -i "^python\|^path=\|^ld_lib" 
echo "== DRA podman"
rm -rf /tmp/tools; tar xJf .carry/podman-tools.tar.xz -C /tmp
timeout 150 bash scripts/gpu/dra-podman.sh .carry/cuslice-dra-plugin .carry/cuslice .carry/libcuslice.so /tmp/tools 10 > $OUT/dra-podman.log 2>&1
echo "rc=$?" >> $OUT/dra-podman.log
cat $OUT/dra-podman.log
date
rm -rf /tmp/diag; mkdir -p /tmp/diag
COLO_LOGS=/tmp/diag timeout 380 python3 scripts/gpu/colo_starts.py --lib .carry/libcuslice.so --pin --window 5 --starts 3 --first-start 5 --decode-period-ms 480 --cells decode --modes native,standard,trainer-only,nometer --dump /tmp/diag.json > $OUT/diag.md 2>$OUT/diag.err
cp /tmp/diag.json $OUT/
cat $OUT/diag.md; grep "^start" $OUT/diag.err; tail -3 $OUT/diag.err
grep -h "GPU time meter: rec\|passes launching" /tmp/diag/*-service.log | head -24
tar czf $OUT/diag-logs.tgz -C /tmp diag
date
