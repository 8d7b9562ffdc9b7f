#!/usr/bin/env bash
# Runs the workspace's tests under cargo-nextest, each test in a process of
# its own under a time limit (.config/nextest.toml: killed at 4 minutes and
# reported by name as TIMEOUT; the run goes on), below a reaper that ends
# whatever the test started (testkit/: processes, their process groups and
# sessions, the containers it labelled), and closes with the total over
# every test run: "N passed, N failed" (exit status 0 only with no failure
# and at least one test passed).
#
#   bash scripts/test.sh              every test (CI's command)
#   bash scripts/test.sh NAME...      only the tests whose names contain a
#                                     NAME, under the same limits (other
#                                     arguments go to `cargo nextest run`)
#
# Installs what it lacks first (scripts/setup.sh --no-build: libclang,
# runc, podman, tmux, pip, the pinned nextest; idempotent, needs root or
# sudo for apt), so that on a fresh machine this one command is enough.
#
# The tests neither see nor touch the host's own cuslice state:
#
#   /etc/cuslice      a host-wide quota file (the shim prefers it to every
#                     test's CUSLICE_CONFIG, by design: a container's
#                     mounted file wins over its environment)
#   /dev/shm/cuslice  live memory and GPU segments (the defaults)
#   /run/cuslice      the OCI hook's and DRA plugin's state
#   /etc/cdi, /run/cdi
#                     CDI specs (cuslice's, and the DRA plugin's claims')
#
# - Every path a test uses is pinned to its own temporary directory (the
#   tests' helpers set every directory the shim, the hook, the plugin and
#   the watch would otherwise take by default).
# - The tests run in a private mount namespace (as root a mount namespace;
#   otherwise a user namespace mapping the caller to itself), with an
#   empty tmpfs over each of those the host has: the host's files are
#   never read or written, its tenants' processes keep running as they
#   were. Where the host has one of them and the namespace cannot be made,
#   it says why and stops: it never runs the tests against the host's
#   state.
# - The check: after the run, each hiding tmpfs must still be empty, and
#   each of those the host did not have must still be absent; otherwise
#   the run fails (a `FAILED host-state: ...` line naming what was left,
#   counted in the closing line). The host's own files may change during
#   the run (its tenants come and go): the check looks only at what the
#   tests could have written. (tests/common's `env()` also refuses to run
#   a test that sees a host-wide quota file, for `cargo test` by hand.)
set -euo pipefail
cd "$(dirname "$0")/.."

hidden=(/etc/cuslice /dev/shm/cuslice /run/cuslice /etc/cdi /run/cdi)

# What the check found wrong, a line each (counted as failures in the
# closing line).
check=target/nextest/host-check
junit=target/nextest/default/junit.xml

if [ -n "${CUSLICE_TESTS_PRIVATE:-}" ]; then
    # Inside: the tests themselves, ahead of the machine's other work.
    # Many tests time a fake GPU against the shim's own threads (shares
    # within 3 points, a service's p99 beside a trainer): on a shared
    # machine, work at normal priority beside them (two `yes` per core in
    # scripts/ci-busy.sh) starved their processes enough to fail them.
    # As root the run takes nice -10 (CUSLICE_TESTS_NICE sets another; 0
    # leaves the priority as it is); the build and every test inherit it.
    nice_to=${CUSLICE_TESTS_NICE:--10}
    if [ "$nice_to" != 0 ] && ! python3 -c 'import os, sys; os.setpriority(os.PRIO_PROCESS, int(sys.argv[1]), int(sys.argv[2]))' $$ "$nice_to" 2>/dev/null; then
        echo "test.sh: cannot take nice $nice_to (not root?): the tests run at the caller's priority, and other work on the machine can make timing tests fail" >&2
    fi
    nextest=$(bash scripts/nextest.sh)
    # The reaper every test process runs under (nextest's target runner),
    # and what the tests start (the shim, the attack programs: each test
    # process would otherwise build them itself, one at a time under
    # cargo's lock).
    cargo build --quiet -p cuslice-testkit -p cuslice -p cuslice-attacks
    target=$(rustc -vV | sed -n 's/^host: //p')
    runner_var="CARGO_TARGET_$(echo "$target" | tr 'a-z-' 'A-Z_')_RUNNER"
    export "$runner_var=$PWD/target/debug/test-reaper"
    # Positional arguments that are not options are test-name filters.
    rc=0
    "$nextest" nextest run --workspace --no-fail-fast "$@" || rc=$?
    for d in ${CUSLICE_TESTS_HIDE:-}; do
        left=$(find "$d" -mindepth 1 | head -3 | tr '\n' ' ')
        [ -z "$left" ] || echo "host-state: the tests wrote into $d, a default the host uses: $left" >>"$check"
    done
    exit "$rc"
fi

bash scripts/setup.sh --no-build
mkdir -p target/nextest
rm -f "$junit" "$check"
present=() absent=()
for d in "${hidden[@]}"; do
    if [ -e "$d" ]; then present+=("$d"); else absent+=("$d"); fi
done
ns=(unshare --mount --propagation private)
[ "$(id -u)" -eq 0 ] || ns=(unshare --user --map-current-user --mount --propagation private)
rc=0
if "${ns[@]}" true 2>/dev/null; then
    [ ${#present[@]} -eq 0 ] ||
        echo "test.sh: this host has ${present[*]}: the tests run in a private mount namespace with an empty tmpfs over each" >&2
    CUSLICE_TESTS_HIDE="${present[*]}" "${ns[@]}" bash -c '
        for d in $CUSLICE_TESTS_HIDE; do
            mount -t tmpfs -o mode=0755,size=256m cuslice-tests "$d" ||
                { echo "test.sh: cannot hide $d (see above); not running the tests" >&2; exit 1; }
        done
        exec env CUSLICE_TESTS_PRIVATE=1 bash scripts/test.sh "$@"' test.sh "$@" || rc=$?
elif [ ${#present[@]} -gt 0 ]; then
    "${ns[@]}" true || true # (unshare says why)
    echo "test.sh: this host has ${present[*]} and no private mount namespace can be made (above): not running the tests against the host's state" >&2
    exit 1
else
    echo "test.sh: no private mount namespace can be made here; the host has none of ${hidden[*]}, so the tests run in its namespace (the check below still holds)" >&2
    CUSLICE_TESTS_PRIVATE=1 bash scripts/test.sh "$@" || rc=$?
fi
for d in "${absent[@]}"; do
    [ -e "$d" ] || continue
    case "$d" in
    # podman makes an empty /run/cdi where there is none: only a cuslice
    # spec there is the tests' doing.
    */cdi) left=$({ find "$d" -name '*cuslice*' || true; } | head -4 | tr '\n' ' ') ;;
    *) left=$({ find "$d" || true; } | head -4 | tr '\n' ' ') ;;
    esac
    [ -z "$left" ] || echo "host-state: the run made $d on the host: $left" >>"$check"
done

# The closing line: every test nextest ran, from its JUnit report (a test
# killed at its time limit or leaking counts as failed, and is named), and
# each thing the host-state check found, as a failure of its own.
if [ -f "$junit" ]; then
    totals=0
    python3 - "$junit" "$check" <<'PY' || totals=$?
import os
import sys
import xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
passed, failed = 0, []
for case in root.iter("testcase"):
    if case.find("failure") is not None or case.find("error") is not None:
        failed.append(f'{case.get("classname")} {case.get("name")}')
    elif case.find("skipped") is None:
        passed += 1
if os.path.exists(sys.argv[2]):
    failed += [line.rstrip("\n") for line in open(sys.argv[2]) if line.strip()]
for name in failed:
    print(f"FAILED {name}")
print(f"{passed} passed, {len(failed)} failed")
sys.exit(1 if failed or passed == 0 else 0)
PY
    [ "$rc" -ne 0 ] || rc=$totals
else
    [ ! -f "$check" ] || sed 's/^/FAILED /' "$check"
    echo "test.sh: nextest wrote no report ($junit): the tests did not run (exit status $rc)" >&2
    echo "0 passed, 0 failed"
    [ "$rc" -ne 0 ] || rc=1
fi
exit "$rc"
