#!/usr/bin/env bash
# Sets up a fresh Debian/Ubuntu machine to build and test cuslice:
# libclang (bindgen parses cuda-headers/ at build time), binutils (nm, used
# by a test), pip (the ABI test downloads NVIDIA's headers from PyPI), runc
# (a test starts a real container through cuslice's OCI hook), podman (the
# podman tests: CDI and hooks.d, end to end) and tmux (a test reads
# `cuslice top`'s screen).
# Then fetches the pinned cargo-nextest the tests run under
# (scripts/nextest.sh) and builds the release library and command.
# Idempotent: installs only what is missing. Needs root or sudo for apt.
#
#   bash scripts/setup.sh               all of the above
#   bash scripts/setup.sh --no-build    the packages and nextest only (what
#                                       scripts/test.sh and .ci/run call:
#                                       the tests use the debug build)
#   bash scripts/setup.sh --build-deps  only what building needs (libclang,
#                                       gcc): what scripts/cuslice calls
set -euo pipefail

build=1
tests=1
case "${1:-}" in
    "") ;;
    --no-build) build=0 ;;
    --build-deps) build=0 tests=0 ;;
    *) echo "setup.sh: unknown argument ${1} (expected nothing, --no-build or --build-deps)" >&2; exit 2 ;;
esac

need=()
# (grep reads all of ldconfig's output: with -q it could stop early, and
# under pipefail ldconfig's SIGPIPE then read as "no libclang")
ldconfig -p 2>/dev/null | grep 'libclang\(-[0-9.]*\)\?\.so' >/dev/null || need+=(libclang-dev)
command -v gcc >/dev/null || need+=(gcc)
if [ "$tests" -eq 1 ]; then
    command -v nm >/dev/null || need+=(binutils)
    command -v python3 >/dev/null || need+=(python3)
    python3 -m pip --version >/dev/null 2>&1 || need+=(python3-pip)
    command -v runc >/dev/null || need+=(runc) # the container test starts a real container
    command -v podman >/dev/null || need+=(podman)
    command -v tmux >/dev/null || need+=(tmux)
fi

if [ ${#need[@]} -gt 0 ]; then
    SUDO=
    [ "$(id -u)" -eq 0 ] || SUDO=sudo
    echo "setup: installing ${need[*]}" >&2
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

command -v cargo >/dev/null || { echo "setup: cargo not found; install Rust (https://rustup.rs)" >&2; exit 1; }
cd "$(dirname "$0")/.."
[ "$tests" -eq 0 ] || echo "setup: cargo-nextest at $(bash scripts/nextest.sh)" >&2
[ "$build" -eq 1 ] || exit 0
cargo build --release --workspace
echo "setup: ok: target/release/libcuslice.so and target/release/cuslice"
