#!/usr/bin/env bash
# memory_wait's figures against the fake driver (no GPU): how soon a
# waiting allocation is granted after a free makes room, and how far past
# its deadline a wait that gets nothing ends. Runs tests/memory_bend.rs's
# two timing tests ROUNDS times (default 20) and prints a table.
#
#   bash scripts/memory-wait-figures.sh [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-20}
woke=(); late=()
for i in $(seq "$rounds"); do
    out=$(bash scripts/test.sh -E 'binary(memory_bend) & (test(an_allocation_waits_for_a_free) | test(a_wait_ends_at_its_deadline))' --no-capture 2>&1)
    woke+=("$(grep -o 'woken [0-9.]* ms' <<<"$out" | awk '{print $2}')")
    late+=("$(grep -o 'refused [0-9.-]* ms after' <<<"$out" | awk '{print $2}')")
done
python3 - "${woke[*]}" "${late[*]}" <<'PY'
import statistics, sys
w = [float(x) for x in sys.argv[1].split()]
l = [float(x) for x in sys.argv[2].split()]
print(f"| figure (fake driver, {len(w)} rounds) | median | worst | bound (issue #34) |")
print("|---|---|---|---|")
print(f"| granted after the free that made room, ms | {statistics.median(w):.2f} | {max(w):.2f} | 10 |")
print(f"| refused after its deadline, ms | {statistics.median(l):.2f} | {max(l):.2f} | 50 |")
PY
