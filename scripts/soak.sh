#!/usr/bin/env bash
# Soak: the randomized multi-container run of tests/soak.rs (processes
# started, SIGKILLed and forked at random on the fake driver, invariants
# checked every 50 ms) for longer than the 60 s run in `cargo test`:
# SECONDS (default 600, about 11 minutes with the build) in release mode.
# The seed is printed at the start and in the summary; pass it as SEED to
# replay the same containers and process sequence.
#   scripts/soak.sh [SECONDS] [SEED]
set -euo pipefail
cd "$(dirname "$0")/.."
export CUSLICE_SOAK_SECS=${1:-600}
if [ -n "${2:-}" ]; then
    export CUSLICE_SOAK_SEED=$2
fi
cargo test --release -p cuslice --test soak -- --nocapture
