#!/usr/bin/env bash
# Runs CI's job the way CI does, on a busy machine, several times in a row,
# with no retry: each run is `CI=true bash .ci/run </dev/null` in a fresh
# clone of HEAD (committed work only), beside load it starts first and
# ends after (`yes >/dev/null`, LOAD per core). Prints, per run, its time,
# its exit status and its closing line ("N passed, N failed") with every
# FAILED line, then a table; exit status 0 only if every run passed.
#
#   bash scripts/ci-busy.sh [RUNS] [LOAD]     default: 3 runs, 2 per core
#   NEXTEST_TEST_THREADS=4 bash scripts/ci-busy.sh 1
#                                             one run with nextest running
#                                             4 tests at once (oversubscribed)
#
# Each run's whole output is kept in $CUSLICE_BUSY_LOGS (default
# /tmp/cuslice-ci-busy), as run-N.log. The clones are removed afterwards.
# As root (CI's container and mount-namespace tests need it).
set -euo pipefail
runs=${1:-3}
per_core=${2:-2}
repo="$(cd "$(dirname "$0")/.." && pwd)"
logs=${CUSLICE_BUSY_LOGS:-/tmp/cuslice-ci-busy}
mkdir -p "$logs"
head=$(git -C "$repo" rev-parse HEAD)
cores=$(nproc)

load=()
stop_load() {
    [ ${#load[@]} -eq 0 ] || kill "${load[@]}" 2>/dev/null || true
    load=()
}
trap stop_load EXIT
for _ in $(seq $((cores * per_core))); do
    yes >/dev/null &
    load+=($!)
done
echo "ci-busy: $runs run(s) of .ci/run on $head, beside ${#load[@]} \`yes\` on $cores cores${NEXTEST_TEST_THREADS:+, NEXTEST_TEST_THREADS=$NEXTEST_TEST_THREADS}; logs in $logs"

table=()
failed=0
for i in $(seq "$runs"); do
    clone=$(mktemp -d /tmp/cuslice-ci-busy-clone.XXXXXX)
    # mktemp's 0700 would keep the tests' unprivileged users (cuslice run
    # as a user, resize as that user) from the built binaries; a checkout
    # is 0755.
    chmod 755 "$clone"
    git clone --quiet "$repo" "$clone"
    git -C "$clone" checkout --quiet "$head"
    start=$(date +%s)
    rc=0
    (cd "$clone" && CI=true bash .ci/run </dev/null) >"$logs/run-$i.log" 2>&1 || rc=$?
    secs=$(($(date +%s) - start))
    last=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$logs/run-$i.log" | tail -1 || true)
    grep '^FAILED ' "$logs/run-$i.log" || true
    line="run $i: $((secs / 60))m$((secs % 60))s, exit $rc, ${last:-no closing line}"
    echo "ci-busy: $line"
    table+=("$line")
    [ "$rc" -eq 0 ] || failed=1
    rm -rf "$clone"
done
stop_load
echo "ci-busy: $head, ${cores} cores, $((cores * per_core)) yes${NEXTEST_TEST_THREADS:+, NEXTEST_TEST_THREADS=$NEXTEST_TEST_THREADS}:"
printf '  %s\n' "${table[@]}"
exit "$failed"
