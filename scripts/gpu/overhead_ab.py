#!/usr/bin/env python3
"""The shim's per-call cost, two builds side by side: `bench_ab` (one
process, the same loop through the shim's hook and through the driver's own
function, in alternating blocks) under build A and build B in turn, with a
compute share that does not bind (`compute = 100`), TRIALS times each with
the order alternating. Prints, per build, the hook's cost over the driver's
for cuLaunchKernel and for a 1 MiB cuMemAlloc + cuMemFree (median and worst
of the trials), and build A's cost minus build B's (each trial's A against
the B next to it).

Usage: overhead_ab.py --lib A.so --lib-b B.so [--trials 5] [--all 'memory = "8GiB"']
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(HERE, "src")

p = argparse.ArgumentParser()
p.add_argument("--lib", required=True, help="build A (the change)")
p.add_argument("--lib-b", required=True, help="build B (the build before it)")
p.add_argument("--trials", type=int, default=5)
p.add_argument("--all", default="", help='more lines for the quota files\' [all] table, e.g. \'memory = "8GiB"\'')
args = p.parse_args()
LIBS = {"A": os.path.abspath(args.lib), "B": os.path.abspath(args.lib_b)}
WORK = tempfile.mkdtemp(prefix="cuslice-ovab-")


def sh(cmd):
    subprocess.run(cmd, check=True, cwd=WORK)


arch = subprocess.run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"],
                      capture_output=True, text=True).stdout.split()[0].replace(".", "")
sh(["nvcc", "-ptx", f"-arch=sm_{arch}", "-o", "kernels.ptx", os.path.join(SRC, "kernels.cu")])
sh(["nvcc", "-O2", "-o", "bench_ab", os.path.join(SRC, "bench_ab.cu"), "-lcuda", "-ldl"])
cuda_lib = subprocess.run(["sh", "-c", f"ldd {WORK}/bench_ab | awk '/libcuda.so.1/{{print $3}}'"],
                          capture_output=True, text=True).stdout.strip()
syms = subprocess.run(["nm", "-D", "--defined-only", cuda_lib], capture_output=True, text=True).stdout.split("\n")
off = {l.split()[2]: l.split()[0] for l in syms if len(l.split()) == 3}


def run(which):
    name = f"q{which}"
    quota = os.path.join(WORK, f"{name}.toml")
    with open(quota, "w") as f:
        f.write(f'tenant = "{name}"\nsegment_dir = "{WORK}/mem-{name}"\ngpu_segment_dir = "{WORK}/gpu-{name}"\n'
                "[all]\ncompute = 100\n" + (args.all.replace("\\n", "\n") + "\n" if args.all else ""))
    env = dict(os.environ, LD_PRELOAD=LIBS[which], CUSLICE_CONFIG=quota)
    out = subprocess.run([os.path.join(WORK, "bench_ab"), "kernels.ptx", off["cuLaunchKernel"], off["cuMemAlloc_v2"],
                          off["cuMemFree_v2"]], capture_output=True, text=True, env=env, cwd=WORK, timeout=300)
    if out.returncode != 0:
        sys.exit(f"bench_ab under {which} failed ({out.returncode}): {out.stderr[-2000:]}")
    r = {}
    for line in out.stdout.splitlines():
        w = line.split()
        if w[:1] == ["BENCHAB"]:
            r[w[1]] = (float(w[2]), float(w[3]), float(w[4]))  # driver ns, hook ns, overhead %
    print(f"{which}: {r}", file=sys.stderr, flush=True)
    return r


res = {"A": [], "B": []}
for t in range(args.trials):
    for which in (("A", "B") if t % 2 == 0 else ("B", "A")):
        res[which].append(run(which))

print(f"| call | build | hook over driver, median / worst of {args.trials} | hook ns, median |")
print("|---|---|---|---|")
# The hook's cost is judged against the driver's own function in the same
# process: absolute times move by 10-30 % from one process to the next
# (seen on an H200), the driver's as much as the hook's.
for call, label in (("launch", "cuLaunchKernel"), ("allocfree", "1 MiB cuMemAlloc + cuMemFree")):
    for which in ("A", "B"):
        ov = [r[call][2] for r in res[which]]
        hook = statistics.median(r[call][1] for r in res[which])
        print(f"| {label} | {which} | {statistics.median(ov):+.2f} % / {max(ov):+.2f} % | {hook:.1f} |")
print()
print("| call | A's overhead minus B's, median (largest) of trial pairs |")
print("|---|---|")
for call, label in (("launch", "cuLaunchKernel"), ("allocfree", "1 MiB cuMemAlloc + cuMemFree")):
    diffs = [a[call][2] - b[call][2] for a, b in zip(res["A"], res["B"])]
    print(f"| {label} | {statistics.median(diffs):+.2f} points ({max(diffs):+.2f}) |")
