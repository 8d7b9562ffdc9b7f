#!/bin/bash
# Session 10, machine 3: the DRA podman run (the host's driver and Python paths into the containers);
# then whether CUPTI costs a decode loop while attached but not recording (3 processes).
exec > >(tee $OUT/run35.log) 2>&1
nvidia-smi --query-gpu=name,driver_version,serial --format=csv,noheader
date
echo "== DRA podman"
rm -rf /tmp/tools; tar xJf .carry/podman-tools.tar.xz -C /tmp
timeout 170 bash scripts/gpu/dra-podman.sh .carry/cuslice-dra-plugin .carry/cuslice .carry/libcuslice.so /tmp/tools 10 > $OUT/dra-podman.log 2>&1
echo "rc=$?" >> $OUT/dra-podman.log
cat $OUT/dra-podman.log
date
echo "== CUPTI attached, not recording"
for i in 1 2 3; do timeout 100 taskset -c 2,3 python3 scripts/gpu/experiments/cupti_attached.py --requests 8 --cycles 2 2>&1 | grep -v Warning; done
date
