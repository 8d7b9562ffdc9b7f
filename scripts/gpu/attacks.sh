#!/usr/bin/env bash
# The three hostile tenants of issue #12 on a real GPU: each prints its
# ATTACK line, holds for SECONDS, and the script shows what the driver
# (nvidia-smi, i.e. NVML: the ground truth a watchdog reads) saw meanwhile.
# Run it with `cuslice watch` running on the host to see the findings.
#
#   scripts/gpu/attacks.sh [SECONDS]       (default 20)
#
# Needs target/release/cuslice and libcuslice.so (bash scripts/setup.sh),
# cargo (builds the Rust attacks) and cc (builds attack_noshim); or set
# ATTACKS=DIR holding prebuilt attack-quota, attack-gpuseg, attack_noshim
# (built on another machine with `cargo build --release -p cuslice-attacks`
# and `cc -O1 -o attack_noshim tests/apps/attack_noshim.c -ldl`).
set -euo pipefail
SECS=${1:-20}
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
CUSLICE=${CUSLICE:-$REPO/target/release/cuslice}
if [ -z "${ATTACKS:-}" ]; then
    ATTACKS=$REPO/target/release
    (cd "$REPO" && cargo build --release -p cuslice-attacks)
    "${CC:-cc}" -O1 -Wall -o "$ATTACKS/attack_noshim" "$REPO/tests/apps/attack_noshim.c" -ldl
fi
for b in attack-quota attack-gpuseg attack_noshim; do
    [ -x "$ATTACKS/$b" ] || { echo "attacks.sh: $ATTACKS/$b missing" >&2; exit 2; }
done
[ -x "$CUSLICE" ] || { echo "attacks.sh: $CUSLICE missing (bash scripts/setup.sh)" >&2; exit 2; }

smi() { nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader 2>/dev/null | sed 's/^/    nvidia-smi: /' || true; }

show() { # show PID: what NVML says about it, halfway through its hold
    sleep $((SECS / 2))
    echo "  after $((SECS / 2)) s, compute processes (pid, memory):"
    smi
    echo "  $CUSLICE status:"
    "$CUSLICE" status 2>&1 | sed 's/^/    /' || true
}

echo "== 1. attack-quota: raises its own 1 GiB quota in its memory segment, then allocates 3 GiB through the shim"
"$CUSLICE" run --memory 1GiB -- "$ATTACKS/attack-quota" 3GiB "$SECS" &
pid=$!
show
wait $pid || echo "  (exit $?)"

echo "== 2. attack_noshim: under a 1 GiB quota, allocates 3 GiB around the shim (own ELF symbol lookup)"
"$CUSLICE" run --memory 1GiB -- "$ATTACKS/attack_noshim" $((3 << 30)) "$SECS" &
pid=$!
show
wait $pid || echo "  (exit $?)"

echo "== 3. attack-gpuseg: a 20 % tenant makes itself 100 % (ceiling 100) and a 60 % victim 1 %, rewriting every 50 ms"
# The victim: any registered process of a 60 % tenant (attack-quota with a
# 1 MiB raise of its own 8 GiB quota serves: it calls cuInit and holds).
"$CUSLICE" run --memory 8GiB --compute 60% -- "$ATTACKS/attack-quota" 1MiB "$SECS" >/dev/null &
victim=$!
sleep 2
"$CUSLICE" run --compute 20% --compute-max 30% -- "$ATTACKS/attack-gpuseg" "$SECS" 50 &
pid=$!
show
wait $pid || echo "  (exit $?)"
kill "$victim" 2>/dev/null || true
wait "$victim" 2>/dev/null || true
