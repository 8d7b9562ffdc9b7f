"""Turns the RESULT lines of scripts/gpu/memory-check.sh (on stdin) into a
markdown table with a verdict per cell, against the memory issue's targets
for a quota Q (default 4 GiB): every framework sees Q as the GPU's size;
PyTorch and CuPy raise their own out-of-memory error after at least Q
less the context charge (640 MiB, `context_overhead`) and one 256 MiB
step (the checks allocate in steps), and never beyond Q (NVML's
per-process figure, context included, stays within Q); JAX sizes its
preallocation from Q; two processes of one container share Q.

    scripts/gpu/memory-check.sh LIB OUT 4GiB | python3 scripts/gpu/memory_table.py --quota-gib 4
"""
import argparse
import sys

p = argparse.ArgumentParser()
p.add_argument("--quota-gib", type=float, default=4.0)
q = p.parse_args().quota_gib
rows = []
# What a process cannot allocate under Q: the context charge (640 MiB by
# default, docs/memory-quota.md) and, at 256 MiB steps, up to one step.
FLOOR_GIB = 0.625 + 0.25


def verdict(ok):
    return "PASS" if ok else "**FAIL**"


two = {}
for line in sys.stdin:
    w = line.split()
    if "RESULT" not in w:
        continue
    w = w[w.index("RESULT") + 1:]
    # A name may hold spaces inside its brackets: "two[try 2.5GiB]".
    while "[" in w[0] and "]" not in w[0] and len(w) > 1:
        w = [w[0] + " " + w[1]] + w[2:]
    name, kv = w[0], dict(x.split("=", 1) for x in w[1:] if "=" in x)
    if name.startswith("two["):
        two[name] = " ".join(w[1:])
        continue
    if "native" in name or name.startswith("ctx["):
        continue
    if "total_gib" in kv:
        total, got, nvml = float(kv["total_gib"]), float(kv["allocated_gib"]), float(kv.get("nvml_process_mib", "nan"))
        oom = "OutOfMemory" in kv.get("error", "")
        rows.append((name, "device size seen", f"{total:.3f} GiB", f"{q:g} GiB", verdict(abs(total - q) < 1e-3)))
        rows.append((name, "allocated before its own OOM error", f"{got:.3f} GiB" + ("" if oom else f" ({kv.get('error')})"),
                     f">= {q - FLOOR_GIB:g} GiB, OOM error", verdict(oom and got >= q - FLOOR_GIB)))
        rows.append((name, "NVML per-process memory at the end", f"{nvml:.0f} MiB", f"<= {q * 1024:.0f} MiB",
                     verdict(nvml <= q * 1024)))
    elif "bytes_limit_gib" in kv:
        lim = float(kv["bytes_limit_gib"])
        rows.append((name, "preallocation limit (75 % of the device by default)", f"{lim:.3f} GiB", f"<= {q:g} GiB",
                     verdict(0 < lim <= q)))
        rows.append((name, "allocation past the limit", kv.get("over_limit_alloc", "?"), "an error", verdict(
            "Error" in kv.get("over_limit_alloc", ""))))
        rows.append((name, "NVML per-process memory at the end", f"{float(kv['nvml_process_mib']):.0f} MiB",
                     f"<= {q * 1024:.0f} MiB", verdict(float(kv["nvml_process_mib"]) <= q * 1024)))
if two:
    big, small = two.get("two[try 2.5GiB]", "?"), two.get("two[try 0.75GiB]", "?")
    rows.append(("two processes", "with 2 GiB held by one: the other tries 2.5 GiB, then 0.75 GiB", f"{big}; {small}",
                 "OOM; allocated", verdict("OutOfMemory" in big and "allocated" in small)))
print("| program | measurement | value | target | verdict |")
print("|---|---|---|---|---|")
for r in rows:
    print("| " + " | ".join(r) + " |")
fails = sum(1 for r in rows if r[4] != "PASS")
print(f"\n{len(rows) - fails} passed, {fails} failed")
