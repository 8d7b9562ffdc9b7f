#!/usr/bin/env python3
"""Live resize on a real GPU (issue #34, item 1): a running PyTorch program
under `cuslice run --memory 8GiB` is resized to 4 GiB, then to 16 GiB, by
`cuslice resize run:<pid>`. The program polls torch.cuda.mem_get_info()
every 50 ms and prints what it sees, with CLOCK_MONOTONIC time stamps (the
same clock as this script's time.monotonic()).

Checks, each a row of the table (PASS/FAIL), exit status 1 if any fails:

  - at each size (8 GiB at the start, then 4, then 16), the time from the
    start of `cuslice resize` until the program's mem_get_info() total is
    the new size: at most 1 s;
  - an allocation of 12 GiB fails with torch.OutOfMemoryError at 8 GiB,
    and succeeds after the raise to 16 GiB.

Needs no cargo: only the built `cuslice` and `libcuslice.so`, python3 with
torch, and a GPU with more than 16 GiB. Takes under 120 s (usually 20).

Usage: resize_check.py --cli PATH_TO_cuslice --lib PATH_TO_libcuslice.so --out DIR
"""
import argparse
import os
import queue
import subprocess
import sys
import threading
import time

p = argparse.ArgumentParser()
p.add_argument("--cli", required=True, help="the cuslice command")
p.add_argument("--lib", required=True, help="libcuslice.so")
p.add_argument("--out", required=True, help="where the logs go")
args = p.parse_args()
os.makedirs(args.out, exist_ok=True)
GIB = 1 << 30
DEADLINE = time.monotonic() + 110

CHILD = r'''
import sys, threading, time, torch
def say(*a):
    print(f"{time.monotonic():.6f}", *a, flush=True)
held = []
def commands():
    # "alloc N": one tensor of N GiB, kept; "free": all of them.
    for line in sys.stdin:
        w = line.split()
        if not w:
            continue
        if w[0] == "alloc":
            try:
                held.append(torch.empty(int(w[1]) << 30, dtype=torch.uint8, device="cuda"))
                say("alloc", w[1], "ok")
            except torch.OutOfMemoryError as e:
                say("alloc", w[1], "oom", str(e).splitlines()[0][:120].replace(" ", "_"))
        elif w[0] == "free":
            held.clear()
            torch.cuda.empty_cache()
            say("freed")
    say("stdin-closed")
torch.zeros(1, device="cuda")
threading.Thread(target=commands, daemon=True).start()
while True:
    free, total = torch.cuda.mem_get_info()
    say("info", total, free)
    time.sleep(0.05)
'''
child = os.path.join(args.out, "resize_child.py")
with open(child, "w") as f:
    f.write(CHILD)

log = open(os.path.join(args.out, "child.log"), "w")
env = dict(os.environ, PYTHONUNBUFFERED="1", CUSLICE_LOG="info")
run = subprocess.Popen(
    [args.cli, "run", "--lib", args.lib, "--memory", "8GiB", "--", sys.executable, child],
    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
    start_new_session=True)
lines = queue.Queue()
infos = []  # (time, total, free) the program saw


def reader():
    for line in run.stdout:
        log.write(line)
        log.flush()
        w = line.split()
        if len(w) >= 4 and w[1] == "info":
            try:
                infos.append((float(w[0]), int(w[2]), int(w[3])))
            except ValueError:
                pass
        elif len(w) >= 2 and w[1] in ("alloc", "freed", "stdin-closed"):
            lines.put(w)
    lines.put(None)


threading.Thread(target=reader, daemon=True).start()
rows = []
failed = False


def row(check, value, ok):
    global failed
    failed |= not ok
    rows.append((check, value, "PASS" if ok else "FAIL"))


def seen(size, since, limit):
    """When the program first saw total == size at or after `since`."""
    end = min(time.monotonic() + limit, DEADLINE)
    while time.monotonic() < end:
        for t, total, _ in list(infos):
            if t >= since and total == size:
                return t
        if run.poll() is not None:
            return None
        time.sleep(0.01)
    return None


def resize(size_gib):
    t0 = time.monotonic()
    r = subprocess.run([args.cli, "resize", f"run:{run.pid}", "--memory", f"{size_gib}GiB"],
                       capture_output=True, text=True, timeout=30)
    t1 = time.monotonic()
    with open(os.path.join(args.out, f"resize-{size_gib}.log"), "w") as f:
        f.write(f"exit {r.returncode}\n{r.stdout}{r.stderr}")
    if r.returncode != 0:
        print(f"cuslice resize --memory {size_gib}GiB failed: {r.stderr.strip()}", file=sys.stderr)
    t = seen(size_gib * GIB, t0, 5.0)
    took = t1 - t0
    if t is None:
        row(f"seen {size_gib} GiB", f"not within 5 s (resize took {took:.3f} s)", False)
    else:
        row(f"seen {size_gib} GiB", f"{t - t0:.3f} s after `cuslice resize` started (it took {took:.3f} s)",
            t - t0 <= 1.0)


def ask(cmd):
    run.stdin.write(cmd + "\n")
    run.stdin.flush()
    try:
        return lines.get(timeout=max(1.0, min(30.0, DEADLINE - time.monotonic())))
    except queue.Empty:
        return None


try:
    start = seen(8 * GIB, 0.0, 60.0)
    row("start at 8 GiB", "seen" if start else f"not seen (last: {infos[-1][1] if infos else 'nothing'})",
        start is not None)
    if start is None:
        raise SystemExit
    a = ask("alloc 12")
    row("12 GiB at 8 GiB", " ".join(a[2:]) if a else "no answer", bool(a) and a[3] == "oom")
    time.sleep(2)
    resize(4)
    time.sleep(3)
    resize(16)
    a = ask("alloc 12")
    row("12 GiB at 16 GiB", " ".join(a[2:]) if a else "no answer", bool(a) and a[3] == "ok")
finally:
    try:
        run.stdin.close()
    except OSError:
        pass
    try:
        os.killpg(run.pid, 9)
    except ProcessLookupError:
        pass
    run.wait()

print("| check | what was seen | result |")
print("|---|---|---|")
for c, v, r in rows:
    print(f"| {c} | {v} | {r} |")
print(f"\nlogs: {args.out} (child.log: every mem_get_info the program made, resize-*.log)")
sys.exit(1 if failed or not rows else 0)
