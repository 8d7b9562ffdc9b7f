#!/usr/bin/env bash
# Two podman containers from two prepared DRA claims on one real GPU
# (issue #20), without a cluster: the plugin prepares two allocated
# ResourceClaims by hand (`cuslice-dra-plugin prepare --claim`, the code of
# the kubelet's NodePrepareResources), 20Gi + compute 30 and 40Gi + 70, both
# on gpu-0 (the GPU from NVML), and writes each claim's CDI spec; podman
# runs one container per claim with `--device cuslice.io/claim=<uid>`, so
# the spec's hook (`cuslice oci-hook create --claim`) gives each container
# its claim's quota file, segment directory, library and GPU device nodes.
# Each container sees the host's root file system through an overlay
# (`--rootfs /:O`: its Python and PyTorch; nothing it or the hook writes
# reaches the host). Shows, per claim, the GPU size PyTorch sees and how far
# it allocates (mem_torch.py), then the two matmul loops' split, run
# together (mm_loop.py), against the same loop alone without a container.
#
# Usage: scripts/gpu/dra-podman.sh PLUGIN CUSLICE LIBCUSLICE [TOOLS] [SECONDS=10]
#   TOOLS: a directory with podman, conmon, runc and lib/ (the libraries
#   podman and conmon need), for a host without a container runtime (the
#   GPU hosts we borrow have none); default: the host's podman.
# Needs root. Tried on a host without a GPU (the fake driver, carried
# podman 4.3.1 + conmon + runc + their libraries, 49 MB): the claim's quota
# file inside, the preload in place, its 1 GiB quota holding, nothing
# written to the host's /etc. Run on an H100 (session 10): each container
# saw its claim's 20 / 40 GiB and held it, the pair split 30.2 / 69.8 %
# (docs/benchmarks/2026-11-26-h100-s10.md, section 4).
set -euo pipefail
PLUGIN=$(realpath "$1")
CLI=$(realpath "$2")
LIB=$(realpath "$3")
TOOLS=${4:-}
SECS=${5:-10}
HERE=$(cd "$(dirname "$0")" && pwd)
[ "$(id -u)" -eq 0 ] || { echo "dra-podman.sh: needs root (podman, the OCI hook)" >&2; exit 1; }
W=$(mktemp -d /tmp/cuslice-dra-podman.XXXXXX)
NODE=gpu-host

if [ -n "$TOOLS" ]; then
    TOOLS=$(realpath "$TOOLS")
    # podman starts conmon with an environment of its own (no
    # LD_LIBRARY_PATH): conmon gets its libraries through a wrapper.
    printf '#!/bin/sh\nLD_LIBRARY_PATH="%s/lib" exec "%s/conmon" "$@"\n' "$TOOLS" "$TOOLS" >"$W/conmon"
    chmod +x "$W/conmon"
    P=(env "LD_LIBRARY_PATH=$TOOLS/lib" "$TOOLS/podman" --conmon "$W/conmon" --runtime "$TOOLS/runc")
else
    P=(podman)
fi
# A private store and run directory: nothing of the host's podman is used
# or left behind; no systemd, no network.
P+=(--root "$W/storage" --runroot "$W/run" --storage-driver vfs --cgroup-manager cgroupfs
    --events-backend file)
cleanup() {
    "${P[@]}" rm --all --force >/dev/null 2>&1 || true
    rm -rf "$W"
}
trap cleanup EXIT

# shellcheck source=dra-common.sh
. "$HERE/dra-common.sh"
A=0a1b2c3d-0000-4000-8000-000000000030
B=0a1b2c3d-0000-4000-8000-000000000070
prepare_claim trainer-30 $A 20Gi 30
prepare_claim trainer-70 $B 40Gi 70
ls "$W/cdi"

# podman reads CDI specs from /etc/cdi and /run/cdi: the claims' specs are
# bind-mounted over /run/cdi in a mount namespace of this script's own.
mkdir -p /run/cdi
podman_cdi() {
    unshare --mount --propagation private sh -c 'mount --bind "$0" /run/cdi && exec "$@"' "$W/cdi" "${P[@]}" "$@"
}
# The host's Python and where it finds its packages (PyTorch may live on a
# path the host's environment names): the same paths exist in the
# container, whose root is the host's.
PY=$(python3 -c 'import sys; print(sys.executable)')
PYPATH=$(python3 -c 'import sys; print(":".join(p for p in sys.path if p))')
# The driver's libraries, where the host finds them through LD_LIBRARY_PATH
# (a cluster's NVIDIA container toolkit mounts them; here the host's root
# is the container's).
LDPATH=${LD_LIBRARY_PATH:-}
# Those directories may be mounts of their own, which the overlay of the
# host's root does not show: bound read-only where they exist.
DRV=()
IFS=: read -ra dirs <<<"$LDPATH"
for d in "${dirs[@]}"; do
    [ -n "$d" ] && [ -d "$d" ] && DRV+=(-v "$d:$d:ro")
done
# One container of claim UID running CMD... in /w (this directory's src/).
in_claim() { # UID NAME CMD...
    local uid=$1 name=$2
    shift 2
    # (`--rootfs` is a flag: the first argument after the options is the
    # root file system, `/:O` the host's through an overlay.)
    podman_cdi run --rm --name "$name" --network none --device "cuslice.io/claim=$uid" \
        --ulimit nofile=1024:1024 --ulimit nproc=1024:1024 -e "PYTHONPATH=$PYPATH" -e "LD_LIBRARY_PATH=$LDPATH" "${DRV[@]}" \
        -v "$HERE/src:/w:ro" -w /w --rootfs /:O "$@"
}

echo "== memory: what each claim's container sees and allocates (256 MiB steps)"
in_claim $A mem-30 "$PY" mem_torch.py claim-20Gi
in_claim $B mem-70 "$PY" mem_torch.py claim-40Gi

echo "== compute: matmul loops, ${SECS} s"
solo=$(python3 "$HERE/src/mm_loop.py" "$SECS" | awk '/^TFLOPS/ {print $2}')
echo "native alone, no container: $solo TFLOP/s"
# Both lined up on one start (each pays podman's start first).
at=$(python3 -c 'import time; print(time.monotonic() + 20)')
in_claim $A mm-30 env START_AT="$at" "$PY" mm_loop.py "$SECS" >"$W/a.out" 2>"$W/a.err" &
pa=$!
in_claim $B mm-70 env START_AT="$at" "$PY" mm_loop.py "$SECS" >"$W/b.out" 2>"$W/b.err" &
pb=$!
wait $pa || { cat "$W/a.err" >&2; exit 1; }
wait $pb || { cat "$W/b.err" >&2; exit 1; }
ta=$(awk '/^TFLOPS/ {print $2}' "$W/a.out")
tb=$(awk '/^TFLOPS/ {print $2}' "$W/b.out")
split_table "$solo" "$ta" "$tb" "claim (podman container)"
echo "== unprepare"
run_plugin unprepare --uid $A
run_plugin unprepare --uid $B
ls -A "$W/cdi" "$W/root/claims"
