#!/usr/bin/env bash
# Runs colo_predict.py's scenarios (issue #11 experiment); prints one line
# per scenario. Usage: colo_predict.sh [SECONDS=10]
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
S=${1:-10}
P=$HERE/colo_predict.py
F=$(mktemp /tmp/colo-predict.XXXXXX)
pair() {  # name, trainer args (PREDICT N MARGIN GRACE), linger
    local name=$1 predict=$2 n=$3 margin=$4 grace=$5 linger=$6
    printf '\0%.0s' $(seq 4096) >"$F"
    local at
    at=$(python3 -c "import time;print(time.monotonic()+12)")
    python3 "$P" service "$F" "$linger" "$at" "$S" >/tmp/svc.out 2>&1 &
    local sv=$!
    if [ "$n" != 0 ]; then
        python3 "$P" trainer "$F" "$predict" "$n" "$at" "$S" "$margin" "$grace" >/tmp/trn.out 2>&1 &
        local tr=$!
        wait $tr
    fi
    wait $sv
    echo "$name | $(tr '\n' ' ' </tmp/svc.out) | $( [ "$n" != 0 ] && tr '\n' ' ' </tmp/trn.out)"
}
tsolo() {  # trainer alone
    local n=$1
    printf '\0%.0s' $(seq 4096) >"$F"
    local at
    at=$(python3 -c "import time;print(time.monotonic()+8)")
    echo "trainer $n alone | $(python3 "$P" trainer "$F" 0 "$n" "$at" "$S" 0 0 | tr '\n' ' ')"
}
pair "service alone" 0 0 0 0 0
tsolo 8192
pair "8192 hold only (linger 0.5)" 0 8192 0 0 0.5
pair "8192 predict margin 0.1 grace 1" 1 8192 0.1 1 0.5
pair "8192 predict margin 0.3 grace 2" 1 8192 0.3 2 0.5
tsolo 4096
pair "4096 hold only" 0 4096 0 0 0.5
pair "4096 predict margin 0.1 grace 1" 1 4096 0.1 1 0.5
pair "service alone (again)" 0 0 0 0 0
rm -f "$F"
