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
# The tests cannot see, or touch, the host's own cuslice: where the host
# has any of
#
#   /etc/cuslice      a host-wide quota file (the shim prefers it to every
#                     test's CUSLICE_CONFIG, by design: a container's
#                     mounted file wins over its environment)
#   /dev/shm/cuslice  live memory and GPU segments (the defaults)
#   /run/cuslice      the OCI hook's and DRA plugin's state
#
# the tests run in a private mount namespace with an empty tmpfs over each
# (as root: a mount namespace; otherwise a user namespace mapping the
# caller to itself). The host's files are never read or written; processes
# of the host's own tenants keep running as they were. Where the namespace
# cannot be made, it says why and stops: it never runs the tests against
# the host's state. (tests/common's `env()` refuses to run a test that
# sees a host-wide quota file, for `cargo test` run by hand.)
set -euo pipefail
cd "$(dirname "$0")/.."

hidden=(/etc/cuslice /dev/shm/cuslice /run/cuslice)

if [ -z "${CUSLICE_TESTS_PRIVATE:-}" ]; then
    present=()
    for d in "${hidden[@]}"; do
        [ -e "$d" ] && present+=("$d")
    done
    if [ ${#present[@]} -gt 0 ]; then
        echo "test.sh: this host has ${present[*]}: running the tests in a private mount namespace with an empty tmpfs over each" >&2
        ns=(unshare --mount --propagation private)
        [ "$(id -u)" -eq 0 ] || ns=(unshare --user --map-current-user --mount --propagation private)
        # (unshare says why where it cannot: the tests then do not run)
        CUSLICE_TESTS_HIDE="${present[*]}" exec "${ns[@]}" bash -c '
            for d in $CUSLICE_TESTS_HIDE; do
                mount -t tmpfs -o mode=0755,size=256m cuslice-tests "$d" ||
                    { echo "test.sh: cannot hide $d (see above); not running the tests" >&2; exit 1; }
            done
            exec env CUSLICE_TESTS_PRIVATE=1 bash scripts/test.sh "$@"' test.sh "$@"
    fi
fi

nextest=$(bash scripts/nextest.sh)

# The reaper every test process runs under (nextest's target runner), and
# what the tests start (the shim, the attack programs: each test process
# would otherwise build them itself, one at a time under cargo's lock).
cargo build --quiet -p cuslice-testkit -p cuslice -p cuslice-attacks
target=$(rustc -vV | sed -n 's/^host: //p')
runner_var="CARGO_TARGET_$(echo "$target" | tr 'a-z-' 'A-Z_')_RUNNER"
export "$runner_var=$PWD/target/debug/test-reaper"

junit=target/nextest/default/junit.xml
rm -f "$junit"
# Positional arguments that are not options are test-name filters.
rc=0
"$nextest" nextest run --workspace --no-fail-fast "$@" || rc=$?

# The closing line: every test nextest ran, from its JUnit report (a test
# killed at its time limit or leaking counts as failed, and is named).
if [ -f "$junit" ]; then
    totals=0
    python3 - "$junit" <<'PY' || totals=$?
import sys
import xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
passed, failed = 0, []
for case in root.iter("testcase"):
    if case.find("failure") is not None or case.find("error") is not None:
        failed.append(f'{case.get("classname")} {case.get("name")}')
    elif case.find("skipped") is None:
        passed += 1
for name in failed:
    print(f"FAILED {name}")
print(f"{passed} passed, {len(failed)} failed")
sys.exit(1 if failed or passed == 0 else 0)
PY
    [ "$rc" -ne 0 ] || rc=$totals
else
    echo "test.sh: nextest wrote no report ($junit): the tests did not run (exit status $rc)" >&2
    echo "0 passed, 0 failed"
    [ "$rc" -ne 0 ] || rc=1
fi
exit "$rc"
