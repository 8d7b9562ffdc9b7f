#!/usr/bin/env python3
"""Guarantees in any order of arrival, on a real GPU (issue 41): three
`cuslice run` tenants beside `cuslice watch --policy kill --interval 1`.

  C  --memory 80GiB                      holds 1 GiB, later grows to 75 GiB
  A  --memory 20GiB --memory-max 100GiB  takes all it may (a burst)
  B  --memory 20GiB --memory-wait 120s   takes 20 GiB

Two orders:
  late:  C, A bursts, then B starts (its guarantee lent out to A's burst:
         it may take at once only what nobody reserved or holds, the rest
         pending; it waits for A's free), then C grows to 75 GiB (must be
         at once), then A frees (B then gets its 20 GiB).
  early: C, B takes its 20 GiB, then A bursts into what is left, then C
         grows to 75 GiB.

Every tenant must exit 0, nobody killed by the watch, C reaches 75 GiB at
once in both orders. Prints a table; logs under --out.

Usage: late_arrival.py --cli cuslice --lib libcuslice.so --out DIR
"""
import argparse
import json
import os
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

TENANT = r'''
import os, sys, time, torch
name, steps, free_file = sys.argv[1], sys.argv[2], sys.argv[3]
def say(*a):
    print(f"{time.monotonic():.3f} {name}", *a, flush=True)
x = torch.randn(1024, 1024, device="cuda")
held = []
for step in steps.split(","):
    target, go = step.split(":")
    target = int(target)
    while go != "-" and not os.path.exists(go):
        time.sleep(0.05)
    t0 = time.monotonic()
    waited = 0.0
    while len(held) < target:
        a = time.monotonic()
        try:
            held.append(torch.empty(1 << 30, dtype=torch.uint8, device="cuda"))
        except torch.OutOfMemoryError:
            say(f"oom at={len(held)}")
            break
        waited = max(waited, time.monotonic() - a)
    say(f"reached={len(held)} in_s={time.monotonic()-t0:.2f} longest_wait_s={waited:.2f}")
while not os.path.exists(free_file):
    y = x @ x
    torch.cuda.synchronize()
    time.sleep(0.05)
held.clear()
torch.cuda.empty_cache()
say("freed")
time.sleep(2)
say("done")
'''
tenant = os.path.join(args.out, "tenant.py")
with open(tenant, "w") as f:
    f.write(TENANT)

total = int(subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                           capture_output=True, text=True).stdout.split()[0]) << 20
env = dict(os.environ, PYTHONUNBUFFERED="1", CUSLICE_LOG="info")


def start(cmd, log):
    return subprocess.Popen(cmd, stdout=open(log, "w"), stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)


def wait_for(log, text, timeout=180):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if os.path.exists(log) and text in open(log).read():
            return True
        time.sleep(0.1)
    return False


def grab(log, key):
    for line in open(log).read().splitlines():
        for w in line.split():
            if w.startswith(key + "="):
                return w.split("=", 1)[1]
    return "-"


def lines(log, key):
    return [l for l in open(log).read().splitlines() if key in l]


def cell(order):
    d = os.path.join(args.out, order)
    os.makedirs(d, exist_ok=True)
    f = lambda n: os.path.join(d, n)
    watch = start([args.cli, "watch", "--interval", "1", "--policy", "kill"], f("watch.log"))
    time.sleep(2)
    run = lambda who, flags, steps: start(
        [args.cli, "run", "--lib", args.lib, *flags, "--", sys.executable, tenant, who, steps, f(who + "-free")],
        f(who + ".log"))
    c = run("C", ["--memory", "80GiB"], f"1:-,75:{f('c-go')}")
    wait_for(f("C.log"), "reached=1")
    procs = {"C": c}
    status = []
    if order == "late":
        procs["A"] = run("A", ["--memory", "20GiB", "--memory-max", "100GiB"], "100:-")
        wait_for(f("A.log"), "reached=")
        time.sleep(3)
        procs["B"] = run("B", ["--memory", "20GiB", "--memory-wait", "120s"], "20:-")
        time.sleep(6)
        status.append(subprocess.run([args.cli, "status", "--json"], capture_output=True, text=True, env=env).stdout)
        open(f("c-go"), "w").close()
        wait_for(f("C.log"), "reached=75")
        time.sleep(4)
        open(f("A-free"), "w").close()
        wait_for(f("B.log"), "reached=")
    else:
        procs["B"] = run("B", ["--memory", "20GiB", "--memory-wait", "120s"], "20:-")
        wait_for(f("B.log"), "reached=")
        procs["A"] = run("A", ["--memory", "20GiB", "--memory-max", "100GiB"], "100:-")
        wait_for(f("A.log"), "reached=")
        time.sleep(3)
        open(f("c-go"), "w").close()
        wait_for(f("C.log"), "reached=75")
        time.sleep(4)
    for who in "ABC":
        open(f(who + "-free"), "w").close()
    codes = {who: q.wait(timeout=120) for who, q in procs.items()}
    time.sleep(2)
    watch.terminate()
    watch.wait(timeout=30)
    with open(f("status.json"), "w") as s:
        s.write("\n".join(status))
    killed = [l for l in open(f("watch.log")).read().splitlines() if "killed" in l.lower()]
    return codes, killed, f


print(f"GPU memory {total / GIB:.1f} GiB\n")
print("| order | exits A/B/C | watch kills | A reached (GiB) | B reached, its longest wait (s) | C grew to 75 in (s) | B's pending line |")
print("|---|---|---|---|---|---|---|")
ok = True
for order in ("late", "early"):
    codes, killed, f = cell(order)
    c75 = [l for l in lines(f("C.log"), "reached=")][-1:]
    c_in = c75[0].split("in_s=")[1].split()[0] if c75 and "reached=75" in c75[0] else "not reached"
    pending = "yes" if lines(f("B.log"), "lent out") else "no"
    print(f"| {order} | {codes.get('A')}/{codes.get('B')}/{codes.get('C')} | {len(killed)} | {grab(f('A.log'), 'reached')} "
          f"| {grab(f('B.log'), 'reached')}, {grab(f('B.log'), 'longest_wait_s')} | {c_in} | {pending} |")
    ok &= all(v == 0 for v in codes.values()) and not killed and c_in != "not reached"
    for l in killed:
        print("   watch:", l[:300])
print("\nPASS" if ok else "\nFAIL")
