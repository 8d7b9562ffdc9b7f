#!/usr/bin/env bash
# Longer fuzzing of the quota-file parser and the segment validation than
# the smoke in `cargo test`: PROPTEST_CASES per property (default 650000)
# for the in-memory properties, SEGMENT_CASES (default 100000) for the one
# that writes a segment file per case (file I/O bound). About 10 to 15
# minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
PROPTEST_CASES=${PROPTEST_CASES:-650000} cargo test --release -p cuslice-core --test fuzz -- \
    --test-threads=2 --skip corrupt_memory_segments_are_refused
PROPTEST_CASES=${SEGMENT_CASES:-100000} cargo test --release -p cuslice-core --test fuzz -- \
    --exact corrupt_memory_segments_are_refused
