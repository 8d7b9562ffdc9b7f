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
nvcc -O2 -arch=sm_${ARCH} -o "$W/bench_ab" "$HERE/src/bench_ab.cu" -lcuda -ldl
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
# In-process A/B: the driver's own entry points, found by their symbol offsets.
CUDA_LIB=$(ldd "$W/bench_ab" | awk '/libcuda.so.1/{print $3}')
off() { nm -D --defined-only "$CUDA_LIB" | awk -v s="$1" '$3==s{print $1}'; }
LD_PRELOAD="$SHIM" "$W/bench_ab" "$W/kernels.ptx" "$(off cuLaunchKernel)" "$(off cuMemAlloc_v2)" "$(off cuMemFree_v2)" >"$OUT/ab.raw"
# ...and with a (non-binding) memory quota, so allocations take the accounting path.
QSEG=$(mktemp -d)
CUSLICE_MEMORY=64GiB CUSLICE_SEGMENT_DIR=$QSEG LD_PRELOAD="$SHIM" "$W/bench_ab" "$W/kernels.ptx" \
    "$(off cuLaunchKernel)" "$(off cuMemAlloc_v2)" "$(off cuMemFree_v2)" | sed 's/^BENCHAB /BENCHAB quota64GiB-/' >>"$OUT/ab.raw"
python3 - "$RAW" "$GPU" "$N" "$A" "$ROUNDS" "$OUT/ab.raw" <<'PY'
import sys, statistics
raw, gpu, n, a, rounds, ab = sys.argv[1:7]
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
print(f"Pass-through overhead on {gpu}, median of {rounds} alternating rounds:\n")
print("| loop | native ns/op | shim ns/op | overhead | spread native / shim |")
print("|---|---|---|---|---|")
for mode in ["drv-launch", "rt-launch", "drv-alloc", "rt-alloc"]:
    nat, shm = d[mode]["native"], d[mode]["shim"]
    mn, ms = statistics.median(nat), statistics.median(shm)
    sp = lambda v: f"{min(v):.0f}-{max(v):.0f}"
    print(f"| {desc[mode]} | {mn:.1f} | {ms:.1f} | {100*(ms/mn-1):+.2f} % | {sp(nat)} / {sp(shm)} |")
print()
print("\nIn one process, under the shim: the same loop through the driver's own function and through")
print("the shim's hook, alternating in 101 blocks each (10k launches / 1k alloc+free pairs a block); medians, and the median of the per-block ratios:\n")
print("| loop | driver ns/op | hook ns/op | overhead (median block ratio) |")
print("|---|---|---|---|")
for line in open(ab):
    if line.startswith("BENCHAB"):
        _, what, r, h, ov = line.split()
        print(f"| {what} | {float(r):.1f} | {float(h):.1f} | {float(ov):+.2f} % |")
PY
