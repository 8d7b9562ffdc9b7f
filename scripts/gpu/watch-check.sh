#!/usr/bin/env bash
# The host watchdog on a real GPU (issue #12): `cuslice watch --interval 1`
# with policy report, then kill, while scripts/gpu/attacks.sh runs its
# three hostile tenants; every line of both is time-stamped, and the
# merged log shows when each attack began and when the watch found it and
# acted. Then the watch's own cost (watch-cost.sh, 64 GPU processes).
# Usage: scripts/gpu/watch-check.sh PATH/TO/cuslice ATTACKS_DIR OUTDIR
#   ATTACKS_DIR holds attack-quota, attack-gpuseg, attack_noshim (see
#   attacks.sh).
set -uo pipefail
CLI=$(realpath "$1")
ATT=$(realpath "$2")
OUT=$3
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUT"
stamp() { while IFS= read -r l; do printf '%.3f %s\n' "$(date +%s.%N)" "$l"; done; }
for policy in report kill; do
    echo "== policy $policy"
    "$CLI" watch --interval 1 --policy "$policy" 2> >(stamp >"$OUT/watch-$policy.log") &
    W=$!
    sleep 2
    CUSLICE=$CLI ATTACKS=$ATT bash "$HERE/attacks.sh" 12 2>&1 | stamp >"$OUT/attacks-$policy.log"
    "$CLI" status >"$OUT/status-$policy.txt" 2>&1
    kill "$W"; wait "$W" 2>/dev/null
    sleep 1
    sort -n "$OUT/watch-$policy.log" "$OUT/attacks-$policy.log" \
        | grep -E 'ATTACK|cuslice watch|^== |exit' | cut -c1-260
    echo "-- status after the attacks:"
    head -30 "$OUT/status-$policy.txt"
done
echo "== cost"
bash "$HERE/watch-cost.sh" "$CLI" "$OUT/cost" 64 60
