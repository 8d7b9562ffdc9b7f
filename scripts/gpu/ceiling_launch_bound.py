"""A launch-bound server alone on the GPU under a ceiling: does it run as
without limits? (A ceiling holds a tenant to a share of GPU time even when
the GPU is otherwise idle; a decode loop's kernels run a few percent of
its time, so a 30 % ceiling should cost it nothing. Charged its time in
flight, it was held to 30 % of that.)

The decode server of colo_starts.py (a transformers Llama-architecture
model, 16 new tokens per request, one request every PERIOD ms), alone,
under `cuslice run` without limits and with `--compute-max CEILING`, in
interleaved starts; with --lib-b, also with the ceiling under a second
build (an A/B in one run). Prints a table: each run's p50 / p99 and
requests served, and the ceiling's median p50 against the no-limits
median (issue #19's bar for a launch-bound tenant alone: within 5 %).

    python3 scripts/gpu/ceiling_launch_bound.py --lib L --cli C [--lib-b B] [--starts 3] [--ceiling 30]
"""
import argparse
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
p = argparse.ArgumentParser()
p.add_argument("--lib", required=True)
p.add_argument("--cli", required=True, help="the cuslice command")
p.add_argument("--lib-b", default=None, help="a second build of libcuslice.so, run with the ceiling too")
p.add_argument("--starts", type=int, default=3)
p.add_argument("--ceiling", type=int, default=30)
p.add_argument("--seconds", type=float, default=6.0)
p.add_argument("--period-ms", type=float, default=420.0)
a = p.parse_args()

server = [sys.executable, os.path.join(HERE, "src", "decode_probe.py"), "--seconds", str(a.seconds),
          "--period-ms", str(a.period_ms)]
modes = [("no limits", a.lib, []), (f"--compute-max {a.ceiling}", a.lib, ["--compute-max", str(a.ceiling)])]
if a.lib_b:
    modes.append((f"--compute-max {a.ceiling}, build b", a.lib_b, ["--compute-max", str(a.ceiling)]))


def run(lib, extra):
    r = subprocess.run([a.cli, "run", "--lib", lib, *extra, "--", *server], capture_output=True, text=True,
                       timeout=a.seconds + 120)
    v = {}
    for line in r.stdout.splitlines():
        w = line.split()
        if w and w[0] in ("LAT", "SERVED"):
            v[w[0]] = [float(x) for x in w[1:]]
        elif w and w[0] == "SKIP":
            sys.exit(line)
    if r.returncode != 0 or "LAT" not in v:
        sys.exit(f"{extra}: exit {r.returncode}: {r.stderr[-2000:]}")
    meter = [x for x in r.stderr.splitlines() if "GPU time meter: rec" in x or "holding the lease" in x]
    return v, meter


res = {m[0]: [] for m in modes}
for s in range(a.starts):
    order = modes[s % len(modes):] + modes[:s % len(modes)]
    for name, lib, extra in order:
        v, meter = run(lib, extra)
        res[name].append(v)
        print(f"start {s} {name}: p50 {v['LAT'][0]:.1f} p99 {v['LAT'][1]:.1f} ms, served "
              f"{v['SERVED'][0]:.0f}/{v['SERVED'][1]:.0f}", file=sys.stderr, flush=True)
        for line in meter:
            print("   " + line[:220], file=sys.stderr, flush=True)

ref = statistics.median(v["LAT"][0] for v in res["no limits"])
print(f"# A launch-bound server alone under a ceiling ({a.starts} interleaved starts, request every "
      f"{a.period_ms:.0f} ms, {a.seconds:.0f} s each)\n")
print("| run | p50 per start (ms) | p99 per start (ms) | served (worst) | median p50 vs no limits |")
print("|---|---|---|---|---|")
for name, _, _ in modes:
    vs = res[name]
    p50 = [v["LAT"][0] for v in vs]
    p99 = [v["LAT"][1] for v in vs]
    served = min(v["SERVED"][0] / max(v["SERVED"][1], 1) for v in vs)
    ratio = statistics.median(p50) / ref
    verdict = "reference" if name == "no limits" else ("PASS" if ratio <= 1.05 and served >= 1.0 else "**FAIL**")
    print(f"| {name} | {', '.join(f'{x:.0f}' for x in p50)} | {', '.join(f'{x:.0f}' for x in p99)} | "
          f"{100 * served:.0f} % | {ratio:.2f}x ({verdict}) |")
