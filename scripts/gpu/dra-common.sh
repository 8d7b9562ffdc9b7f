# Shared by scripts/gpu/dra-claims.sh and dra-podman.sh (sourced): the
# plugin run by hand on a work directory $W, and an allocated ResourceClaim
# prepared through it. Needs PLUGIN, CLI, LIB, W and NODE set; GPUS_FILE
# (the plugin's --gpus-file, a try without a GPU) is optional.
run_plugin() {
    "$PLUGIN" --node-name "$NODE" --root "$W/root" --cdi-dir "$W/cdi" \
        --plugin-dir "$W/plugin" --cuslice "$CLI" --lib "$LIB" \
        ${GPUS_FILE:+--gpus-file "$GPUS_FILE"} "$@"
}

# An allocated claim NAME (uid UID) consuming MEMORY and COMPUTE of gpu-0,
# written to $W/NAME.json and prepared.
prepare_claim() { # NAME UID MEMORY COMPUTE
    cat >"$W/$1.json" <<EOF
{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
 "metadata": {"namespace": "default", "name": "$1", "uid": "$2"},
 "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.cuslice.io"}}]}},
 "status": {"allocation": {"devices": {"results": [{"request": "gpu", "driver": "gpu.cuslice.io",
   "pool": "$NODE", "device": "gpu-0", "shareID": "$2",
   "consumedCapacity": {"memory": "$3", "compute": "$4"}}]}}}}
EOF
    echo "== prepare claim default/$1 (memory $3, compute $4)"
    run_plugin prepare --claim "$W/$1.json"
}

# The two claims' split table: the matmul loop's TFLOP/s alone (SOLO) and
# in claims trainer-30 (A) and trainer-70 (B) together; WHAT names a
# claim's column ("claim", "claim (podman container)").
split_table() { # SOLO A B WHAT
    python3 - "$@" <<'EOF'
import sys
solo, a, b = map(float, sys.argv[1:4])
what = sys.argv[4]
both = a + b
print(f"| {what} | compute | TFLOP/s together | share of the pair | of solo | target | verdict |")
print("|---|---|---|---|---|---|---|")
for name, want, v in (("default/trainer-30", 30, a), ("default/trainer-70", 70, b)):
    got = 100 * v / both
    ok = abs(got - want) <= 3
    print(f"| {name} | {want} | {v:.0f} | {got:.1f} % | {100 * v / solo:.1f} % | {want} ± 3 | {'PASS' if ok else 'FAIL'} |")
print(f"| together | | {both:.0f} | | {100 * both / solo:.1f} % | >= 97 % | {'PASS' if both >= 0.97 * solo else 'FAIL'} |")
EOF
}
