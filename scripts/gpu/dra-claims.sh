#!/usr/bin/env bash
# Two DRA claims on one real GPU (issue #20), without a cluster: the
# plugin prepares two allocated ResourceClaims by hand (`cuslice-dra-plugin
# prepare --claim`, the same code as the kubelet's NodePrepareResources),
# one consuming memory 20Gi + compute 30, the other 40Gi + 70, both on
# gpu-0 (the plugin reads the GPU from NVML). Each claim's programs then
# run as the claim's CDI hook would set them up: its quota file (with the
# segment directories the hook would mount, here the host paths) and the
# shim preloaded. Shows, per claim: the GPU size PyTorch sees and how far
# it allocates (mem_torch.py), and the two matmul loops' split (mm_loop.py,
# each alone, then both together).
# Usage: scripts/gpu/dra-claims.sh PLUGIN CUSLICE LIBCUSLICE [SECONDS=10]
set -euo pipefail
PLUGIN=$(realpath "$1")
CLI=$(realpath "$2")
LIB=$(realpath "$3")
SECS=${4:-10}
HERE=$(cd "$(dirname "$0")" && pwd)
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
NODE=gpu-host
# shellcheck source=dra-common.sh
. "$HERE/dra-common.sh"
claim() { # NAME UID MEMORY COMPUTE
    prepare_claim "$@"
    # What the claim's CDI hook gives its containers: the quota file, with
    # the claim's segment directory and the host's GPU segments mounted
    # where it names them.
    sed -e "s|^segment_dir = .*|segment_dir = \"$W/root/claims/$2/segment\"|" \
        -e "s|^gpu_segment_dir = .*|gpu_segment_dir = \"$W/root/gpu\"|" \
        "$W/root/claims/$2/quota.toml" >"$W/$1.toml"
    mkdir -p "$W/root/claims/$2/segment" "$W/root/gpu"
    cat "$W/root/claims/$2/quota.toml"
}
A=0a1b2c3d-0000-4000-8000-000000000030
B=0a1b2c3d-0000-4000-8000-000000000070
claim trainer-30 $A 20Gi 30
claim trainer-70 $B 40Gi 70
under() { # NAME CMD...
    local n=$1
    shift
    CUSLICE_CONFIG="$W/$n.toml" LD_PRELOAD="$LIB" "$@"
}
echo "== memory: what each claim's PyTorch sees and allocates (256 MiB steps)"
(cd "$HERE/src" && under trainer-30 python3 mem_torch.py claim-20Gi)
(cd "$HERE/src" && under trainer-70 python3 mem_torch.py claim-40Gi)
echo "== compute: matmul loops, ${SECS} s"
solo=$(python3 "$HERE/src/mm_loop.py" "$SECS" | awk '/^TFLOPS/ {print $2}')
echo "native alone: $solo TFLOP/s"
under trainer-30 python3 "$HERE/src/mm_loop.py" "$SECS" >"$W/a.out" &
pa=$!
under trainer-70 python3 "$HERE/src/mm_loop.py" "$SECS" >"$W/b.out" &
pb=$!
wait $pa $pb
ta=$(awk '/^TFLOPS/ {print $2}' "$W/a.out")
tb=$(awk '/^TFLOPS/ {print $2}' "$W/b.out")
split_table "$solo" "$ta" "$tb" "claim"
echo "== status (the claims' rows)"
"$CLI" status --gpu-dir "$W/root/gpu" --containers-root "$W/root/containers" | head -12 || true
echo "== unprepare"
run_plugin unprepare --uid $A
run_plugin unprepare --uid $B
ls "$W/cdi" "$W/root/claims"
