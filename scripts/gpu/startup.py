"""Start-up cost: N processes start CUDA at once (cuInit, primary context,
one allocation, exit), natively and under the shim with a memory quota and
a compute share; alternating rounds, medians. Prints a markdown table.

    python3 scripts/gpu/startup.py --lib target/release/libcuslice.so [-n 64]
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
p.add_argument("-n", type=int, default=64)
p.add_argument("--rounds", type=int, default=5)
args = p.parse_args()
work = tempfile.mkdtemp(prefix="cuslice-startup-")
probe = os.path.join(work, "init_probe")
subprocess.run(["nvcc", "-O2", "-o", probe, os.path.join(HERE, "src", "init_probe.cpp"), "-lcuda"], check=True)


def wave(shim):
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    if shim:
        env.update({"LD_PRELOAD": os.path.abspath(args.lib), "CUSLICE_MEMORY": "8GiB", "CUSLICE_COMPUTE": "50",
                    "CUSLICE_SEGMENT_DIR": os.path.join(work, "seg"), "CUSLICE_GPU_SEGMENT_DIR": os.path.join(work, "gpu")})
    t0 = time.monotonic()
    procs = [subprocess.Popen([probe], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(args.n)]
    fails = sum(1 for q in procs if q.wait() != 0)
    return time.monotonic() - t0, fails


nat, shm, failed = [], [], 0
for r in range(args.rounds):
    for shim in ((False, True) if r % 2 == 0 else (True, False)):
        t, f = wave(shim)
        (shm if shim else nat).append(t)
        failed += f
gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True).stdout.strip().splitlines()[0]
mn, ms = statistics.median(nat), statistics.median(shm)
print(f"Start-up of {args.n} processes at once on {gpu}, median of {args.rounds} alternating rounds:\n")
print("| measurement | native | shim (8 GiB quota, 50 % share) | added per process | failed processes |")
print("|---|---|---|---|---|")
print(f"| all {args.n} processes done | {mn:.2f} s | {ms:.2f} s | {1000 * (ms - mn) / args.n:+.1f} ms | {failed} |")
