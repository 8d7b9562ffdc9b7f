"""What recording kernel activity (CUPTI) costs a launch-bound tenant alone:
the decode server of colo_starts.py alone, natively and under cuslice with
the GPU time meter always on, in variants of one experimental build
(CUSLICE_EXP_FLUSH_MS: the flush period; CUSLICE_EXP_DUTY=ON_MS,PERIOD_MS:
record only ON_MS of every PERIOD_MS). Rounds interleave the variants.

    python3 meter_cost.py --lib libcuslice.so --exp libexp.so [--rounds 3]
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(HERE, "..", "src")
p = argparse.ArgumentParser()
p.add_argument("--lib", required=True)
p.add_argument("--exp", required=True)
p.add_argument("--rounds", type=int, default=3)
p.add_argument("--seconds", type=float, default=4.0)
p.add_argument("--period-ms", type=float, default=250.0)
a = p.parse_args()
W = tempfile.mkdtemp(prefix="meter-cost-")
q = os.path.join(W, "q.toml")
with open(q, "w") as f:
    f.write(f'tenant = "d"\nsegment_dir = "{W}/mem"\ngpu_segment_dir = "{W}/gpu"\n[all]\ncompute = 50\n')
variants = [
    ("native", None, {}),
    ("cuslice, meter off (alone)", a.lib, {}),
    ("meter always, flush 4 ms", a.lib, {"CUSLICE_METER": "always"}),
    ("meter always, flush 50 ms", a.exp, {"CUSLICE_METER": "always", "CUSLICE_EXP_FLUSH_MS": "50"}),
    ("meter always, flush 1000 ms", a.exp, {"CUSLICE_METER": "always", "CUSLICE_EXP_FLUSH_MS": "1000"}),
    ("meter 50 of 500 ms", a.exp, {"CUSLICE_METER": "always", "CUSLICE_EXP_DUTY": "50,500"}),
    ("meter 20 of 1000 ms", a.exp, {"CUSLICE_METER": "always", "CUSLICE_EXP_DUTY": "20,1000"}),
]
res = {v[0]: [] for v in variants}
for r in range(a.rounds):
    k = r % len(variants)
    for name, lib, env in variants[k:] + variants[:k]:
        e = dict(os.environ)
        e.pop("LD_PRELOAD", None)
        e.update(env)
        if lib:
            e["LD_PRELOAD"] = os.path.abspath(lib)
            e["CUSLICE_CONFIG"] = q
        out = subprocess.run([sys.executable, os.path.join(SRC, "decode_probe.py"), "--seconds", str(a.seconds),
                              "--period-ms", str(a.period_ms)], capture_output=True, text=True, env=e, timeout=300)
        lat = [l for l in out.stdout.splitlines() if l.startswith("LAT ")]
        if not lat:
            print(f"{name}: no result\n{out.stdout}\n{out.stderr[-2000:]}", file=sys.stderr)
            continue
        res[name].append(float(lat[0].split()[1]))
        print(f"round {r} {name}: p50 {res[name][-1]:.1f} ms", file=sys.stderr, flush=True)
base = statistics.median(res["native"])
print("| variant | request p50, median of rounds (ms) | vs native | each round |")
print("|---|---|---|---|")
for name, _, _ in variants:
    if res[name]:
        m = statistics.median(res[name])
        print(f"| {name} | {m:.1f} | {m / base:.2f}x | {', '.join(f'{x:.1f}' for x in res[name])} |")
