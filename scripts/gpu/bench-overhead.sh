#!/usr/bin/env bash
# Pass-through overhead of the shim, measured side by side in one run: the
# same binary, natively and under the shim, alternating, 7 rounds; the table
# shows medians and the ratio. Usage:
#   scripts/gpu/bench-overhead.sh PATH/TO/libcuslice.so OUTDIR [LAUNCHES] [ALLOCS]
set -euo pipefail
SHIM=$(realpath "$1")
OUT=$2
N=${3:-200000}
A=${4:-20000}
ROUNDS=${ROUNDS:-7}
HERE=$(cd "$(dirname "$0")" && pwd)
W=${WORK:-$(mktemp -d)}
mkdir -p "$OUT"
mkdir -p "$W"
ARCH=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d .)
nvcc -ptx -arch=sm_${ARCH} -o "$W/kernels.ptx" "$HERE/src/kernels.cu"
nvcc -O2 -arch=sm_${ARCH} -o "$W/bench" "$HERE/src/bench.cu" -lcuda
RAW=$OUT/overhead.raw
: >"$RAW"
for r in $(seq 1 "$ROUNDS"); do
    for mode in drv-launch rt-launch drv-alloc rt-alloc; do
        n=$N
        case $mode in *alloc) n=$A ;; esac
        # Alternate which side goes first, so drift (clocks, caches) cancels.
        if [ $((r % 2)) -eq 0 ]; then order="native shim"; else order="shim native"; fi
        for side in $order; do
            if [ $side = shim ]; then
                v=$(LD_PRELOAD="$SHIM" "$W/bench" $mode $n "$W/kernels.ptx" | awk '/^BENCH/{print $3}')
            else
                v=$("$W/bench" $mode $n "$W/kernels.ptx" | awk '/^BENCH/{print $3}')
            fi
            echo "$mode $side $v" >>"$RAW"
        done
    done
done
GPU=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)
python3 - "$RAW" "$GPU" "$N" "$A" "$ROUNDS" <<'PY'
import sys, statistics
raw, gpu, n, a, rounds = sys.argv[1:6]
d = {}
for line in open(raw):
    mode, side, v = line.split()
    d.setdefault(mode, {}).setdefault(side, []).append(float(v))
desc = {
    "drv-launch": f"{n} empty cuLaunchKernel (exported symbol)",
    "rt-launch": f"{n} empty <<<1,1>>> (cudart, via cuGetProcAddress)",
    "drv-alloc": f"{a} cuMemAlloc+cuMemFree of 1 MiB",
    "rt-alloc": f"{a} cudaMalloc+cudaFree of 1 MiB",
}
print(f"Pass-through overhead on {gpu}, median of {rounds} alternating rounds\n")
print("| loop | native ns/op | shim ns/op | overhead | spread native / shim |")
print("|---|---|---|---|---|")
for mode in ["drv-launch", "rt-launch", "drv-alloc", "rt-alloc"]:
    nat, shm = d[mode]["native"], d[mode]["shim"]
    mn, ms = statistics.median(nat), statistics.median(shm)
    sp = lambda v: f"{min(v):.0f}-{max(v):.0f}"
    print(f"| {desc[mode]} | {mn:.1f} | {ms:.1f} | {100*(ms/mn-1):+.2f} % | {sp(nat)} / {sp(shm)} |")
PY
