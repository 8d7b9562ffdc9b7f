"""Start-up cost: N processes start CUDA at once (cuInit, primary context,
one allocation, exit), natively and under the shim with a memory quota and
a compute share (all in one container: one quota, one segment), for several
N; alternating rounds, medians. Prints a markdown table: the wall time of
the whole wave, the time added per process, and each process's own CUDA
start-up time (median over the processes). A global serialization in the
shim would make the added per-process time grow with N.

    python3 scripts/gpu/startup.py --lib target/release/libcuslice.so [-n 16,64,256] [--rounds 3]
"""
import argparse
import os
import statistics
import subprocess
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
p = argparse.ArgumentParser()
p.add_argument("--lib", required=True)
p.add_argument("-n", default="64", help="comma-separated process counts")
p.add_argument("--rounds", type=int, default=5)
p.add_argument("--init-only", action="store_true", help="cuInit and device queries only, no context (for N beyond what fits in GPU memory)")
p.add_argument("--memory", default="8GiB", help="the container's quota (every context is charged to it)")
args = p.parse_args()
work = tempfile.mkdtemp(prefix="cuslice-startup-")
probe = os.path.join(work, "init_probe")
subprocess.run(["nvcc", "-O2", "-o", probe, os.path.join(HERE, "src", "init_probe.cpp"), "-lcuda"], check=True)


def wave(n, shim):
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    if shim:
        env.update({"LD_PRELOAD": os.path.abspath(args.lib), "CUSLICE_MEMORY": args.memory, "CUSLICE_COMPUTE": "50",
                    "CUSLICE_SEGMENT_DIR": os.path.join(work, "seg"), "CUSLICE_GPU_SEGMENT_DIR": os.path.join(work, "gpu")})
    t0 = time.monotonic()
    procs = [subprocess.Popen([probe] + (["init"] if args.init_only else []), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(n)]
    fails, own = 0, []
    for q in procs:
        out, err = q.communicate()
        if q.returncode != 0:
            fails += 1
            why = (out + err).strip().splitlines()
            errors.setdefault(("shim" if shim else "native", why[-1] if why else f"exit {q.returncode}"), 0)
            errors[("shim" if shim else "native", why[-1] if why else f"exit {q.returncode}")] += 1
        own += [float(l.split()[1]) / 1e3 for l in out.splitlines() if l.startswith("INITUS")]
    return time.monotonic() - t0, fails, statistics.median(own) if own else float("nan")


gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True).stdout.strip().splitlines()[0]
counts = [int(x) for x in args.n.split(",")]
errors = {}
what = "cuInit, cuDeviceGet, cuDeviceTotalMem; no context" if args.init_only else "cuInit, context, one allocation"
print(f"Start-up of N processes at once on {gpu} ({what}), median of {args.rounds} alternating rounds;")
print(f"shim: one container with a {args.memory} quota and a 50 % share.\n")
print("| N | wave, native | wave, shim | added per process (wave) | one process's CUDA start-up, native → shim (median) | failed |")
print("|---|---|---|---|---|---|")
for n in counts:
    nat, shm, failed = [], [], 0
    for r in range(args.rounds):
        for shim in ((False, True) if r % 2 == 0 else (True, False)):
            t, f, own = wave(n, shim)
            (shm if shim else nat).append((t, own))
            failed += f
    mn, ms = statistics.median(t for t, _ in nat), statistics.median(t for t, _ in shm)
    on, os_ = statistics.median(o for _, o in nat), statistics.median(o for _, o in shm)
    print(f"| {n} | {mn:.2f} s | {ms:.2f} s | {1000 * (ms - mn) / n:+.2f} ms | {on:.0f} → {os_:.0f} ms ({os_ - on:+.0f} ms) | {failed} |",
          flush=True)
if errors:
    print()
    for (side, why), k in sorted(errors.items()):
        print(f"- {k} failed process(es) {side}: `{why}`")
