#!/usr/bin/env bash
# One report of everything cuslice claims, measured side by side on this
# GPU in one run: pass-through overhead, training and inference throughput
# with a share that does not bind, compute-share accuracy (caps x kernel
# lengths, splits, work conservation), start-up of 64 processes at once,
# and the memory quota per framework. Cells outside their target are
# marked FAIL. Writes OUTDIR/report.md.
# Usage: scripts/gpu/bench.sh PATH/TO/libcuslice.so OUTDIR
#   PARTS=overhead,inference,compute,startup,memory (default: all) runs a
#   subset (the whole report takes about 13 minutes on an H200).
set -uo pipefail
PARTS=${PARTS:-overhead,inference,compute,startup,memory}
part() { case ",$PARTS," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }
SHIM=$(realpath "$1")
OUT=$2
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUT"
R=$OUT/report.md
export PYTHONUNBUFFERED=1
GPU=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)
COMMIT=$(git -C "$HERE/../.." describe --always --dirty 2>/dev/null || echo unknown)
{
    echo "# cuslice benchmark report"
    echo
    echo "GPU: $GPU. cuslice commit: $COMMIT. Date: $(date -u +%F)."
    echo
    if part overhead; then
    echo "## Pass-through overhead (no limits)"
    echo
    ROUNDS=${ROUNDS:-7} bash "$HERE/bench-overhead.sh" "$SHIM" "$OUT/overhead" 2>/dev/null | grep -Ev '^(BENCH|hook )'
    echo
    fi
    if part inference; then
    echo "## Inference throughput, compute = 100 % (does not bind)"
    echo
    Q=$(mktemp -d)
    nat=$(python3 "$HERE/src/infer_bench.py" | awk '/^IPS/{print $2}')
    shm=$(CUSLICE_COMPUTE=100 CUSLICE_SEGMENT_DIR=$Q/s CUSLICE_GPU_SEGMENT_DIR=$Q/g LD_PRELOAD=$SHIM python3 "$HERE/src/infer_bench.py" | awk '/^IPS/{print $2}')
    python3 -c "
n, s = float('$nat' or 0), float('$shm' or 0)
r = 100 * s / n if n else 0
print('| measurement | native | shim | ratio | target | verdict |')
print('|---|---|---|---|---|---|')
print(f'| conv net bf16 inference, images/s | {n:.0f} | {s:.0f} | {r:.1f} % | >= 98 % | ' + ('PASS' if r >= 98 else '**FAIL**') + ' |')
"
    echo
    fi
    if part compute; then
    python3 "$HERE/bench_compute.py" --lib "$SHIM" --work "$OUT/compute-work" ${QUICK:+--quick} 2>/dev/null | sed '1s/^# /## /'
    echo
    fi
    if part startup; then
    echo "## Start-up"
    echo
    python3 "$HERE/startup.py" --lib "$SHIM" -n 64 --rounds 3 --memory 64GiB 2>/dev/null
    echo
    python3 "$HERE/startup.py" --lib "$SHIM" -n 256 --rounds 3 --init-only --memory 64GiB 2>/dev/null
    echo
    fi
    if part memory; then
    echo "## Memory quota per framework (4 GiB)"
    echo
    bash "$HERE/memory-check.sh" "$SHIM" "$OUT/memory" 4GiB 2>/dev/null >"$OUT/memory.txt"
    python3 "$HERE/memory_table.py" --quota-gib 4 <"$OUT/memory.txt"
    echo
    echo "Raw output:"
    echo
    sed 's/^/    /' "$OUT/memory.txt"
    fi
} | tee "$R"
echo
echo "report: $R ($(grep -c '\*\*FAIL\*\*' "$R") cells outside target)"
