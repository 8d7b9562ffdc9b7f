# Experiment (issue #19): which signal says how much GPU time a tenant got?
# For three tenant kinds -- a saturating trainer (bf16 8192^2 matmuls), a
# launch-bound decode loop (per token 12 layers of small kernels, .item()
# per token, a 16-token request every 100 ms) and an idle-ish service
# (8 x 4096^2 bf16 layers, .item(), one request every 10 ms) -- alone and
# beside the trainer, natively (no cuslice), it prints:
#   - NVML's per-process SM utilization (nvmlDeviceGetProcessUtilization),
#     averaged over the run, and the spacing of its samples;
#   - the ground truth: the sum of the process's kernel durations from
#     torch.profiler (CUPTI) over the same span, as % of wall time;
#   - wall time with work in flight (what cuslice charges light tenants
#     today), as % of wall time (from the workload's own timing);
#   - timing events around each stretch of work up to a synchronisation
#     (a request, a token, a training step), summed, as % of wall time;
# so that the error of each signal is visible per tenant kind.
#   gpu_time_signal.py [SECONDS=6]
import json
import os
import subprocess
import sys
import time

SECONDS = float(sys.argv[1]) if len(sys.argv) > 1 else 6.0

WORKER = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src", "gpu_time_worker.py")).read()


sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))
from nvml_samples import samples  # noqa: E402


def scenario(kinds):
    tmp = f"/tmp/gts-{os.getpid()}"
    os.makedirs(tmp, exist_ok=True)
    for f in os.listdir(tmp):
        os.remove(os.path.join(tmp, f))
    procs = []
    for i, k in enumerate(kinds):
        out = f"{tmp}/{i}-{k}"
        procs.append((k, out, subprocess.Popen([sys.executable, "-c", WORKER, k, str(SECONDS), out])))
    while not all(os.path.exists(o + ".ready") for _, o, _ in procs):
        time.sleep(0.01)
    for _, o, _ in procs:
        open(o + ".go", "w").close()
    while not all(os.path.exists(o + ".started") for _, o, _ in procs):
        time.sleep(0.01)
    start_us = int(time.time() * 1e6)
    seen = {}
    last = start_us
    while any(p.poll() is None for _, _, p in procs):
        for pid, ts, sm in samples(last):
            if ts > start_us:
                seen.setdefault(pid, {})[ts] = sm
        time.sleep(0.1)
    rows = []
    for k, o, p in procs:
        r = json.load(open(o))
        s = seen.get(r["pid"], {})
        ts = sorted(s)
        # Samples cover the run; the first may start before it.
        gaps = [(b - a) / 1e3 for a, b in zip(ts, ts[1:])]
        spacing = sorted(gaps)[len(gaps) // 2] if gaps else float("nan")
        # Time-weighted mean of smUtil over the samples' periods.
        tw = sum(s[b] * (b - a) for a, b in zip(ts, ts[1:]))
        span = (ts[-1] - ts[0]) if len(ts) > 1 else 0
        nv = tw / span if span else float("nan")
        truth = r["kernel_us"] / 1e6 / r["wall"] * 100
        print(f"  {k}: {r}", file=sys.stderr)
        rows.append((k, truth, nv, r["inflight"] / r["wall"] * 100, len(ts), spacing,
                     r["events_ms"] / 1e3 / r["wall"] * 100))
    return rows


print(f"# GPU-time signals, {SECONDS:.0f} s per scenario, native (no cuslice)\n")
print("| scenario | tenant | kernel time (CUPTI) % | NVML smUtil % | in flight (wall) % | events per stretch % | NVML samples | sample spacing ms |")
print("|---|---|---|---|---|---|---|---|")
for kinds in (["trainer"], ["decode"], ["service"], ["trainer", "decode"], ["trainer", "service"]):
    for k, truth, nv, infl, n, sp, evp in scenario(kinds):
        print(f"| {' + '.join(kinds)} | {k} | {truth:.1f} | {nv:.1f} | {infl:.1f} | {evp:.1f} | {n} | {sp:.0f} |", flush=True)
