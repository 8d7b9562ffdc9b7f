#!/bin/bash
# Session 10, machine 3, call 2: the DRA podman run (the driver's library directories bound into the containers).
exec > >(tee $OUT/run36.log) 2>&1
nvidia-smi --query-gpu=name,driver_version,serial --format=csv,noheader
date
findmnt -n -o TARGET,SOURCE /usr/local/nvidia 2>&1 | head -3
rm -rf /tmp/tools; tar xJf .carry/podman-tools.tar.xz -C /tmp
timeout 200 bash scripts/gpu/dra-podman.sh .carry/cuslice-dra-plugin .carry/cuslice .carry/libcuslice.so /tmp/tools 10 > $OUT/dra-podman.log 2>&1
echo "rc=$?" >> $OUT/dra-podman.log
cat $OUT/dra-podman.log
date
