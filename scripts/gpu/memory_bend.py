#!/usr/bin/env python3
"""Memory that bends, on a real GPU (issue #34's figures): two PyTorch
trainers, each `cuslice run --memory 20GiB --memory-max 60GiB`, on one GPU
whose memory nobody is guaranteed is made 40 GiB (a third tenant is
guaranteed the rest where the GPU has more than 80 GiB).

  1. burst:  A grows to 50 GiB while B is small: A passes its guarantee.
             Then B grows towards 50 GiB: it gets a clean
             torch.OutOfMemoryError once the 40 GiB nobody is guaranteed
             are taken (at about 30 GiB), A goes on, neither is killed.
  2. wait:   the same with B under --memory-wait 30s; A frees its memory
             5 s after B is refused: B waits instead of failing, and goes
             on to 50 GiB.

Each trainer runs a matmul step between allocations and reports what
torch.cuda.mem_get_info() says (total: its memory_max). Prints a table.

Usage: memory_bend.py --cli cuslice --lib libcuslice.so --out DIR
"""
import argparse
import os
import signal
import subprocess
import sys
import time

p = argparse.ArgumentParser()
p.add_argument("--cli", required=True)
p.add_argument("--lib", required=True)
p.add_argument("--out", required=True)
args = p.parse_args()
os.makedirs(args.out, exist_ok=True)
GIB = 1 << 30

TRAINER = r'''
import os, sys, time, torch
name, target, hold, start_after, free_after_file = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
def say(*a):
    print(f"{time.monotonic():.3f} {name}", *a, flush=True)
time.sleep(start_after)
x = torch.randn(2048, 2048, device="cuda")
f, t = torch.cuda.mem_get_info()
say(f"start total={t/2**30:.2f} free={f/2**30:.2f}")
held = []
for i in range(target):
    t0 = time.monotonic()
    try:
        held.append(torch.empty(1 << 30, dtype=torch.uint8, device="cuda"))
    except torch.OutOfMemoryError:
        say(f"oom at={len(held)} asked_s={time.monotonic()-t0:.2f}")
        break
    dt = time.monotonic() - t0
    if dt > 0.5:
        say(f"waited s={dt:.2f} at={len(held)}")
    y = x @ x
    torch.cuda.synchronize()
f, t = torch.cuda.mem_get_info()
say(f"reached={len(held)} total={t/2**30:.2f} free={f/2**30:.2f}")
end = time.monotonic() + hold
while time.monotonic() < end:
    if free_after_file != "-" and os.path.exists(free_after_file):
        break
    y = x @ x
    torch.cuda.synchronize()
    time.sleep(0.05)
held.clear()
torch.cuda.empty_cache()
say("freed")
time.sleep(1)
say("done")
'''
trainer = os.path.join(args.out, "trainer.py")
with open(trainer, "w") as f:
    f.write(TRAINER)

total = int(subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                           capture_output=True, text=True).stdout.split()[0]) << 20
reserve_gib = max(0, total // GIB - 80)
# A GPU segment directory (and so a memory pool) of the cells' own: the
# room they measure is what these tenants leave, whatever else runs.
GPU_DIR = os.path.join(os.path.abspath(args.out), "gpu")
env = dict(os.environ, PYTHONUNBUFFERED="1", CUSLICE_LOG="info", CUSLICE_GPU_SEGMENT_DIR=GPU_DIR)


def run(cmd, log):
    # A session of its own: the cell ends every process it started.
    return subprocess.Popen(cmd, stdout=open(log, "w"), stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)


def cell(name, b_wait):
    d = os.path.join(args.out, name)
    os.makedirs(d, exist_ok=True)
    sig = os.path.join(d, "a-free")
    procs = []
    if reserve_gib:
        procs.append(run([args.cli, "run", "--lib", args.lib, "--memory", f"{reserve_gib}GiB", "--", sys.executable,
                          "-c", "import torch,time; torch.zeros(1,device='cuda'); time.sleep(60)"],
                         os.path.join(d, "reserve.log")))
        time.sleep(3)
    a = run([args.cli, "run", "--lib", args.lib, "--memory", "20GiB", "--memory-max", "60GiB", "--",
             sys.executable, trainer, "A", "50", "40", "0", sig], os.path.join(d, "A.log"))
    bflags = ["--memory-wait", "30s"] if b_wait else []
    b = run([args.cli, "run", "--lib", args.lib, "--memory", "20GiB", "--memory-max", "60GiB", *bflags, "--",
             sys.executable, trainer, "B", "50", "2", "8", "-"], os.path.join(d, "B.log"))
    if b_wait:
        # A frees 5 s after B starts waiting.
        deadline = time.time() + 60
        while time.time() < deadline:
            blog = open(os.path.join(d, "B.log")).read()
            if "start total" in blog:
                break
            time.sleep(0.2)
        time.sleep(12)
        open(sig, "w").close()
    rb = b.wait(timeout=150)
    open(sig, "w").close()
    ra = a.wait(timeout=150)
    for q in procs:
        # Ended as an operator would (SIGTERM: `cuslice run` forwards it
        # and releases the session's guarantee at its end); a SIGKILLed
        # session's guarantee would linger 60 s into the next cell.
        os.killpg(q.pid, signal.SIGTERM)
        try:
            q.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(q.pid, signal.SIGKILL)
            q.wait()
    la = open(os.path.join(d, "A.log")).read()
    lb = open(os.path.join(d, "B.log")).read()
    return ra, rb, la, lb


def grab(log, who, key):
    for line in log.splitlines():
        w = line.split()
        if len(w) > 2 and w[1] == who and any(x.startswith(key) for x in w[2:]):
            return " ".join(w[2:])
    return "-"


print(f"GPU memory {total / GIB:.1f} GiB; a third tenant guaranteed {reserve_gib} GiB leaves 40 GiB nobody is guaranteed "
      f"(the cells' own memory pool, {GPU_DIR})\n")
print("| cell | A exit | B exit | A reached | B | B waited | A start (total/free) | B start |")
print("|---|---|---|---|---|---|---|---|")
for name, w in (("burst", False), ("wait", True)):
    ra, rb, la, lb = cell(name, w)
    b_end = grab(lb, "B", "oom") if "oom" in lb else grab(lb, "B", "reached")
    print(f"| {name} | {ra} | {rb} | {grab(la, 'A', 'reached')} | {b_end} | {grab(lb, 'B', 'waited')} | "
          f"{grab(la, 'A', 'start')} | {grab(lb, 'B', 'start')} |")
    sys.stdout.flush()
