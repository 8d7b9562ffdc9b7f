#!/usr/bin/env bash
# The host watchdog's own cost (issue #12: under 1 % of one CPU core at a
# 1 s interval with 64 GPU processes): N GPU processes that hold 64 MiB
# each (src/hold.c), in 8 `cuslice run` sessions of 8 GiB (each process
# is charged its context, 640 MiB by default), watched by
# `cuslice watch --interval 1 --policy report` for SECONDS; prints the
# watchdog's CPU time (user + system, from /proc/PID/stat) as a percent
# of one core, with its start-up excluded.
# Usage: scripts/gpu/watch-cost.sh PATH/TO/cuslice OUTDIR [N=64] [SECONDS=60]
set -uo pipefail
CLI=$(realpath "$1")
OUT=$2
N=${3:-64}
SECS=${4:-60}
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUT"
gcc -O2 -I/usr/local/cuda/include "$HERE/src/hold.c" -o "$OUT/hold" -lcuda || exit 1
per=$(( (N + 7) / 8 ))
pgids=()
cleanup() {
    [ -n "${W:-}" ] && kill "$W" 2>/dev/null
    for g in "${pgids[@]}"; do kill -- "-$g" 2>/dev/null; done
    wait 2>/dev/null
}
trap cleanup EXIT
for s in $(seq 8); do
    setsid "$CLI" run --memory 8GiB --compute 10 -- bash -c \
        "for i in \$(seq $per); do '$OUT/hold' 64 $((SECS + 300)) & done; wait" \
        >"$OUT/session-$s.txt" 2>&1 &
    pgids+=($!)
done
n=0
for _ in $(seq 180); do
    n=$(nvidia-smi --query-compute-apps=pid --format=csv,noheader | wc -l)
    [ "$n" -ge $((per * 8)) ] && break
    sleep 1
done
echo "GPU processes listed by NVML: $n (in 8 cuslice run sessions)"
"$CLI" watch --interval 1 --policy report >"$OUT/watch.log" 2>&1 &
W=$!
sleep 5
ticks() { awk '{print $14 + $15}' "/proc/$W/stat"; }
t0=$(ticks); s0=$(date +%s.%N)
sleep "$SECS"
t1=$(ticks); s1=$(date +%s.%N)
kill -0 "$W" 2>/dev/null || { echo "cuslice watch exited early:"; cat "$OUT/watch.log"; exit 1; }
python3 - "$t0" "$t1" "$s0" "$s1" "$(getconf CLK_TCK)" "$n" <<'PY'
import sys
t0, t1, s0, s1, hz, n = map(float, sys.argv[1:])
cpu = (t1 - t0) / hz
wall = s1 - s0
pct = 100 * cpu / wall
print("| measurement | value | target | verdict |")
print("|---|---|---|---|")
print(f"| cuslice watch CPU, {n:.0f} GPU processes, 1 s interval, {wall:.0f} s | {cpu:.2f} s CPU = {pct:.2f} % of one core | < 1 % | " + ("PASS" if pct < 1 else "**FAIL**") + " |")
PY
echo "== watch log (first 40 lines)"
head -40 "$OUT/watch.log"
