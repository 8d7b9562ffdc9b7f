"""How exactly cuslice charges GPU time (issue #19): for three tenant kinds
(a saturating trainer, a launch-bound decode loop, an idle-ish service),
alone and beside the trainer, the GPU time `cuslice status` reports per
tenant against the ground truth and against NVML.

    python3 scripts/gpu/gpu_time_check.py --lib target/release/libcuslice.so --cli target/release/cuslice [--seconds 8]

Each scenario runs twice on this GPU, in this one invocation:
- natively, each tenant under torch.profiler: the ground truth, the sum of
  its kernels' durations (CUPTI) as % of the run's wall time;
- under cuslice (every tenant `compute = 50`, no profiler, so that cuslice's
  own meter has CUPTI): `cuslice status --json --interval` over the middle
  of the run gives each tenant's GPU % (and the GPU time it was charged:
  for a process with the GPU to itself its wall time in flight, which
  status's GPU % sets against NVML's per-process time), and NVML's
  per-process smUtil is averaged over the same run.
Prints a markdown table; cuslice's error against the truth and NVML's.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "src", "gpu_time_worker.py")

p = argparse.ArgumentParser()
p.add_argument("--lib", required=True)
p.add_argument("--cli", required=True)
p.add_argument("--seconds", type=float, default=8.0)
p.add_argument("--logs", default=None, help="directory for cuslice's messages of each run")
args = p.parse_args()
if args.logs:
    os.makedirs(args.logs, exist_ok=True)
LIB, CLI = os.path.abspath(args.lib), os.path.abspath(args.cli)
WORK = tempfile.mkdtemp(prefix="cuslice-gtc-")
GPUSEG = os.path.join(WORK, "gpu")

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "src"))
from nvml_samples import samples  # noqa: E402


_runs = 0


def run(kinds, under_cuslice):
    """Returns {kind: (truth %, status %, nvml %, charged %)} for one run."""
    global _runs
    _runs += 1
    tmp = os.path.join(WORK, f"run{_runs}")
    os.makedirs(tmp)
    procs = []
    for i, k in enumerate(kinds):
        out = os.path.join(tmp, f"{i}-{k}")
        env = dict(os.environ)
        env.pop("LD_PRELOAD", None)
        if under_cuslice:
            q = os.path.join(tmp, f"{k}.toml")
            with open(q, "w") as f:
                f.write(f'tenant = "{k}"\nsegment_dir = "{tmp}/mem-{k}"\ngpu_segment_dir = "{GPUSEG}"\n'
                        f'[all]\ncompute = 50\n')
            env.update({"LD_PRELOAD": LIB, "CUSLICE_CONFIG": q, "NO_PROFILER": "1", "CUSLICE_LOG": "info"})
        err = open(os.path.join(args.logs, f"{_runs:02d}-{'-'.join(kinds)}-{k}.log"), "w") if args.logs else None
        procs.append((k, out, subprocess.Popen([sys.executable, WORKER, k, str(args.seconds), out], env=env,
                                               stderr=err if err else subprocess.DEVNULL)))
    while not all(os.path.exists(o + ".ready") for _, o, _ in procs):
        if any(p.poll() is not None for _, _, p in procs):
            raise RuntimeError(f"a worker of {kinds} died")
        time.sleep(0.01)
    for _, o, _ in procs:
        open(o + ".go", "w").close()
    while not all(os.path.exists(o + ".started") for _, o, _ in procs):
        time.sleep(0.01)
    start_us = int(time.time() * 1e6)
    status = None
    if under_cuslice:
        # The middle of the run: skip its first second, stop a second early.
        time.sleep(1.0)
        status = subprocess.Popen([CLI, "status", "--gpu-dir", GPUSEG, "--json", "--interval",
                                   str(max(1.0, args.seconds - 2.5))], stdout=subprocess.PIPE, text=True)
    seen = {}
    while any(p.poll() is None for _, _, p in procs):
        for pid, ts, sm in samples(start_us):
            if ts > start_us:
                seen.setdefault(pid, {})[ts] = sm
        time.sleep(0.1)
    pct = {}
    if status is not None:
        snap = json.loads(status.communicate(timeout=60)[0])
        for g in snap["gpus"]:
            for t in g["tenants"]:
                if t.get("gpu_percent") is not None:
                    charged = t.get("charged_percent")
                    pct[t["name"]] = (t["gpu_percent"], float("nan") if charged is None else charged)
    res = {}
    for k, o, _ in procs:
        r = json.load(open(o))
        s = seen.get(r["pid"], {})
        ts = sorted(s)
        tw = sum(s[b] * (b - a) for a, b in zip(ts, ts[1:]))
        span = (ts[-1] - ts[0]) if len(ts) > 1 else 0
        nv = tw / span if span else float("nan")
        truth = r["kernel_us"] / 1e6 / r["wall"] * 100 if r["kernels"] else float("nan")
        st, charged = pct.get(k, (float("nan"), float("nan")))
        res[k] = (truth, st, nv, charged)
    return res


gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                     capture_output=True, text=True).stdout.strip().splitlines()[0]
print(f"# GPU time per tenant: cuslice against the truth, on {gpu}\n")
print(f"`python3 scripts/gpu/gpu_time_check.py --seconds {args.seconds:g}`: truth = kernel time from "
      "torch.profiler (CUPTI) in a native run; cuslice = `cuslice status` GPU % over the middle of a run "
      "of the same scenario with every tenant at `compute = 50`; NVML = per-process smUtil over that run.\n")
print("| scenario | tenant | truth % (native, CUPTI) | cuslice status % | charged % | NVML smUtil % (under cuslice) "
      "| cuslice - truth | cuslice - NVML |")
print("|---|---|---|---|---|---|---|---|")
for kinds in (["trainer"], ["decode"], ["service"], ["trainer", "decode"], ["trainer", "service"]):
    native = run(kinds, False)
    shim = run(kinds, True)
    for k in kinds:
        truth = native[k][0]
        st, nv, charged = shim[k][1], shim[k][2], shim[k][3]
        print(f"| {' + '.join(kinds)} | {k} | {truth:.1f} | {st:.1f} | {charged:.1f} | {nv:.1f} | {st - truth:+.1f} "
              f"| {st - nv:+.1f} |", flush=True)
