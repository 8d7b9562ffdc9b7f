#!/usr/bin/env bash
# GPU check of the shim foundation: each program runs natively and under the
# shim (CUSLICE_LOG=debug); results must be identical and the shim's log must
# show device allocations and kernel launches intercepted.
# Usage: scripts/gpu/verify-foundation.sh PATH/TO/libcuslice.so OUTDIR
set -uo pipefail
SHIM=$(realpath "$1")
OUT=$2
HERE=$(cd "$(dirname "$0")" && pwd)
W=${WORK:-$(mktemp -d)}
mkdir -p "$OUT"
mkdir -p "$W"
LOG=$OUT/foundation.log
MD=$OUT/foundation.md
: >"$LOG"

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$W/gpu.txt" 2>&1
ARCH=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d .)
nvcc -ptx -arch=sm_${ARCH} -o "$W/kernels.ptx" "$HERE/src/kernels.cu" >>"$LOG" 2>&1
nvcc -O2 -arch=sm_${ARCH} -o "$W/drvapi" "$HERE/src/drvapi.cpp" -lcuda >>"$LOG" 2>&1
nvcc -O2 -arch=sm_${ARCH} -o "$W/rtapi" "$HERE/src/rtapi.cu" >>"$LOG" 2>&1   # cudart static (nvcc default)

declare -a NAMES CMDS
add() { NAMES+=("$1"); CMDS+=("$2"); }
add "driver-api (nvcc, -lcuda)" "$W/drvapi $W/kernels.ptx"
add "runtime (nvcc, static cudart)" "$W/rtapi"
add "pytorch" "python3 $HERE/src/torch_check.py"
add "cupy" "python3 $HERE/src/cupy_check.py"
add "jax" "python3 $HERE/src/jax_check.py"

{
    echo "# Foundation check on $(cat "$W/gpu.txt")"
    echo
    echo 'Command: `scripts/gpu/verify-foundation.sh target/release/libcuslice.so OUT`'
    echo
    echo "Driver: $(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1); nvcc: $(nvcc --version | tail -2 | head -1)"
    echo
    echo "| program | native | shim | same results | allocs intercepted | launches intercepted | verdict |"
    echo "|---|---|---|---|---|---|---|"
} >"$MD"

fails=0
for i in "${!NAMES[@]}"; do
    name=${NAMES[$i]}
    cmd=${CMDS[$i]}
    tag=$(echo "$name" | tr -c 'a-z0-9' '_')
    bash -c "$cmd" >"$W/$tag.native.out" 2>"$W/$tag.native.err"
    rn=$?
    CUSLICE_LOG=debug LD_PRELOAD="$SHIM" bash -c "$cmd" >"$W/$tag.shim.out" 2>"$W/$tag.shim.err"
    rs=$?
    a=$(grep '^RESULT' "$W/$tag.native.out")
    b=$(grep '^RESULT' "$W/$tag.shim.out")
    same=no
    [ -n "$a" ] && [ "$a" = "$b" ] && same=yes
    allocs=$(grep -oE 'intercepted (cuMemAlloc[A-Za-z_0-9]*|cuMemCreate)' "$W/$tag.shim.err" | awk '{print $2}' | sort -u | tr '\n' ' ')
    launches=$(grep -oE 'intercepted (cuLaunch[A-Za-z_0-9]*|cuGraphLaunch[A-Za-z_0-9]*)' "$W/$tag.shim.err" | awk '{print $2}' | sort -u | tr '\n' ' ')
    verdict=PASS
    if [ $rn -ne 0 ] || [ $rs -ne 0 ] || [ $same != yes ] || [ -z "$allocs" ] || [ -z "$launches" ]; then
        verdict=FAIL
        fails=$((fails + 1))
    fi
    echo "| $name | rc=$rn | rc=$rs | $same | ${allocs:-none} | ${launches:-none} | $verdict |" >>"$MD"
    {
        echo "=== $name: $cmd"
        echo "--- native (rc=$rn)"; cat "$W/$tag.native.out"; tail -5 "$W/$tag.native.err"
        echo "--- shim (rc=$rs)"; cat "$W/$tag.shim.out"
        echo "--- shim log: intercepted symbols and call counts"
        grep -E 'cuslice\[[0-9]+\]: (debug: (intercepted|calls)|info|warning|error)' "$W/$tag.shim.err" | sed -E 's/^cuslice\[[0-9]+\]: //' | sort | uniq -c | sort -rn | head -60
        grep -vE '^cuslice\[' "$W/$tag.shim.err" | tail -5
    } >>"$LOG"
done
echo >>"$MD"
echo "$((${#NAMES[@]} - fails)) passed, $fails failed" >>"$MD"
cat "$MD"
[ $fails -eq 0 ]
