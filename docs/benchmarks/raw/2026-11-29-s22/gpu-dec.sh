#!/usr/bin/env bash
# Session 22: the decode cell's A/B (this build against 5bf8acd), 2 starts
# per invocation, each dumped for --merge; args: FIRST_START INVOCATIONS MODES
set -u
NEW=$PWD/target/release/libcuslice.so
BASE=$PWD/.carry/base/libcuslice.so
first=${1:-0}; inv=${2:-2}; modes=${3:-native,standard,standard-b}
{ nvidia-smi -L; nvidia-smi --query-gpu=driver_version --format=csv,noheader; } > $OUT/gpu.txt 2>&1
t0=$(date +%s)
for i in $(seq 0 $((inv - 1))); do
  s=$((first + 2 * i))
  t=$(date +%s)
  timeout 290 python3 scripts/gpu/colo_starts.py --lib $NEW --lib-b $BASE --pin --starts 2 --first-start $s \
    --decode-period-ms 520 --cells decode --modes $modes --dump $OUT/decode-$s.json > $OUT/colo-decode-$s.md 2>&1
  echo "starts $s-$((s + 1)) rc=$? secs=$(( $(date +%s) - t ))" >> $OUT/gpu.txt
  [ $(( $(date +%s) - t0 )) -lt 280 ] || break
done
