# Runs the co-location exploration on a GPU host and prints a table:
# (1) a tiny kernel's wait beside another process's long kernels (is there
# preemption between contexts, and at what time-slice?); (2) an inference
# service beside a bf16 matmul trainer, natively and with the hold-back
# prototype of colo_proto.py (queue depth, linger, matmul size).
#   python3 scripts/gpu/experiments/colo_explore.py WORKDIR
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(os.path.dirname(HERE), "src")
W = sys.argv[1]
os.makedirs(W, exist_ok=True)
SECS = 6.0


def sh(cmd):
    subprocess.run(cmd, check=True)


arch = subprocess.run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"],
                      capture_output=True, text=True).stdout.split()[0].replace(".", "")
sh(["nvcc", "-O2", f"-arch=sm_{arch}", "-o", f"{W}/spin_gpu", f"{SRC}/spin_gpu.cu"])
sh(["nvcc", "-O2", f"-arch=sm_{arch}", "-o", f"{W}/ts_probe", f"{SRC}/timeslice_probe.cu"])


def out(p):
    o, e = p.communicate(timeout=120)
    if p.returncode:
        raise RuntimeError(f"{p.args}: {e[-1500:]}")
    return {l.split()[0]: l.split()[1:] for l in o.splitlines() if l.strip()}


def pop(cmd):
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


print("## A tiny kernel beside another process's long kernels\n")
print("| other process | ping p50 | p90 | p99 | max (us) |")
print("|---|---|---|---|---|")
r = out(pop([f"{W}/ts_probe", "4", "5000"]))["PING"]
print(f"| none | {r[0]} | {r[1]} | {r[2]} | {r[3]} |", flush=True)
for us in (200, 2000, 10000, 50000):
    cyc = out(pop([f"{W}/spin_gpu", "calib", str(us)]))["CYCLES"][0]
    hog = pop([f"{W}/spin_gpu", "run", "7", cyc])
    time.sleep(1.5)
    r = out(pop([f"{W}/ts_probe", "4", "5000"]))["PING"]
    out(hog)
    print(f"| spin kernels of {us} us, all SMs | {r[0]} | {r[1]} | {r[2]} | {r[3]} |", flush=True)

flag = f"{W}/flag"
PY = sys.executable
PROTO = os.path.join(HERE, "colo_proto.py")


def scenario(label, service_linger=None, trainer=None, two_services=False):
    if os.path.exists(flag):
        os.unlink(flag)
    start_at = time.monotonic() + 12
    procs = []
    nserv = 2 if two_services else (1 if service_linger is not None else 0)
    for _ in range(nserv):
        procs.append(pop([PY, PROTO, "service", flag, str(service_linger), str(start_at), str(SECS)]))
    if trainer:
        depth, n = trainer
        procs.append(pop([PY, PROTO, "trainer", flag, str(depth), str(n), str(start_at), str(SECS)]))
    res = [out(p) for p in procs]
    cells = []
    for r in res:
        if "LAT" in r:
            cells.append(f"p50 {r['LAT'][0]} / p99 {r['LAT'][1]} / max {r['LAT'][2]} ms, {r['SERVED'][0]}/{r['SERVED'][1]}")
        else:
            cells.append(f"{r['TFLOPS'][0]} TFLOP/s (held {r['HELD'][0]} %)")
    print(f"| {label} | " + " ; ".join(cells) + " |", flush=True)


print("\n## Inference service (6 x 2048 bf16 MLP, batch 16, one request per 10 ms) and trainer\n")
print("| scenario | results |")
print("|---|---|")
scenario("service alone", service_linger=0)
scenario("two services, native", service_linger=0, two_services=True)
for n in (8192, 4096):
    scenario(f"trainer {n} alone", trainer=(0, n))
    scenario(f"service + trainer {n}, native", service_linger=0, trainer=(0, n))
    for depth, linger in ((1, 0.3), (2, 0.3), (1, 1.0)):
        scenario(f"service + trainer {n}, hold-back depth {depth}, linger {linger} ms",
                 service_linger=linger, trainer=(depth, n))
