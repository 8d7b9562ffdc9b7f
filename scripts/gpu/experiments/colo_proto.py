# Experiment (not part of the shipped benchmark): how much of an inference
# service's latency beside a matmul trainer can a hold-back scheme win, with
# no shim at all? The service stamps "active until now + LINGER" into a
# shared file before each layer; the trainer, before each launch, waits
# while that stamp is in the future and keeps at most DEPTH kernels queued.
# This is an upper bound on what cuslice's latency class can do with the
# driver's time-slicing, measured before building it.
#
#   colo_proto.py service FLAG LINGER_MS START_AT SECONDS
#   colo_proto.py trainer FLAG DEPTH N START_AT SECONDS     (DEPTH 0: no hold-back, native)
import mmap
import os
import struct
import sys
import time

import torch

role, flag = sys.argv[1], sys.argv[2]
fd = os.open(flag, os.O_RDWR | os.O_CREAT, 0o666)
os.ftruncate(fd, 4096)
m = mmap.mmap(fd, 4096)


def now_ns():
    return time.monotonic_ns()


if role == "service":
    linger = int(float(sys.argv[3]) * 1e6)
    start_at, seconds = float(sys.argv[4]), float(sys.argv[5])
    torch.manual_seed(0)
    layers = []
    for _ in range(6):
        layers += [torch.nn.Linear(2048, 2048), torch.nn.GELU()]
    model = torch.nn.Sequential(*layers).cuda().to(torch.bfloat16).eval()

    def stamp(*_):
        if linger:
            m[0:8] = struct.pack("<Q", now_ns() + linger)

    for mod in model:
        mod.register_forward_pre_hook(stamp)
    x = torch.randn(16, 2048, device="cuda", dtype=torch.bfloat16)

    def request():
        with torch.no_grad():
            return model(x).float().sum().item()

    for _ in range(50):
        request()
    while time.monotonic() < start_at:
        time.sleep(0.005)
    period, t0 = 0.01, time.monotonic()
    n = int(seconds / period) + 1
    lat, served, end = [], 0, t0 + seconds + period
    for i in range(n):
        due = t0 + i * period
        now = time.monotonic()
        if now > end:
            break
        if now < due:
            time.sleep(max(0.0, due - now - 0.0005))
            while time.monotonic() < due:
                pass
        request()
        done = time.monotonic()
        lat.append((done - due) * 1e3)
        served += done <= end
    lat.sort()
    q = lambda f: lat[min(len(lat) - 1, int(f * len(lat)))]
    print(f"LAT {q(0.5):.3f} {q(0.99):.3f} {lat[-1]:.3f}")
    print(f"SERVED {served} {n}")
else:
    depth, n = int(sys.argv[3]), int(sys.argv[4])
    start_at, seconds = float(sys.argv[5]), float(sys.argv[6])
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    c = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(5):
        torch.matmul(a, b, out=c)
    torch.cuda.synchronize()
    ring = [torch.cuda.Event() for _ in range(max(depth, 1))]
    while time.monotonic() < start_at:
        time.sleep(0.005)
    t0, k = time.monotonic(), 0
    held = 0.0
    while time.monotonic() - t0 < seconds:
        if depth:
            if k >= depth:
                ring[k % depth].synchronize()
            h0 = None
            while struct.unpack("<Q", m[0:8])[0] > now_ns():
                h0 = h0 or time.monotonic()
                time.sleep(0)
            if h0:
                held += time.monotonic() - h0
        torch.matmul(a, b, out=c)
        if depth:
            ring[k % depth].record()
        k += 1
        if not depth and k % 10 == 0:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    dt = time.monotonic() - t0
    print(f"TFLOPS {2 * n**3 * k / dt / 1e12:.1f}")
    print(f"HELD {100 * held / dt:.1f}")
