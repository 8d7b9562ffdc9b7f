#!/usr/bin/env bash
# Runs the workspace's tests (`cargo test --workspace`, extra arguments
# passed on) so that they cannot see, or touch, the host's own cuslice:
# where the host has any of
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

exec cargo test --workspace "$@"
