# An inference service for the co-location benchmark: a small bf16 MLP that
# answers one request every PERIOD ms and waits for each result (.item()),
# as a latency-bound service does. Requests arrive on a fixed schedule
# (request i is due at t0 + i * period); a request is issued when it is due
# or, if the service is behind, as soon as the previous one is answered.
# Latency is measured from the request's due time, so time spent behind
# schedule counts (no coordinated omission).
#
#   infer_probe.py [--seconds 8] [--period-ms 10] [--start-at MONOTONIC_S]
#
# Prints "LAT <p50 ms> <p99 ms> <max ms>", "SERVED <answered within the
# window> <due within the window>", "START <monotonic ms>" and "SLOW
# <due monotonic ms>:<latency ms> ..." (the 8 slowest requests).
import argparse
import time

import torch

p = argparse.ArgumentParser()
p.add_argument("--seconds", type=float, default=8.0)
p.add_argument("--period-ms", type=float, default=10.0)
p.add_argument("--start-at", type=float, default=0.0,
               help="CLOCK_MONOTONIC second at which to start (to line up several processes)")
p.add_argument("--batch", type=int, default=16)
p.add_argument("--width", type=int, default=2048)
p.add_argument("--layers", type=int, default=6)
a = p.parse_args()

torch.manual_seed(0)
layers = []
for _ in range(a.layers):
    layers += [torch.nn.Linear(a.width, a.width), torch.nn.GELU()]
model = torch.nn.Sequential(*layers).cuda().to(torch.bfloat16).eval()
x = torch.randn(a.batch, a.width, device="cuda", dtype=torch.bfloat16)


def request():
    with torch.no_grad():
        return model(x).float().sum().item()


for _ in range(50):  # warm up: cuBLAS handles, allocator
    request()
torch.cuda.synchronize()

while time.monotonic() < a.start_at:
    time.sleep(min(0.01, max(0.0, a.start_at - time.monotonic())))
period = a.period_ms / 1e3
n = int(a.seconds / period) + 1
t0 = time.monotonic()
print(f"START {t0 * 1e3:.3f}", flush=True)
lat = []
dues = []
served = 0
end = t0 + a.seconds + period
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
    dues.append(due * 1e3)
    if done <= end:
        served += 1
# The slowest requests, with when they were due (CLOCK_MONOTONIC ms, as the
# shim's debug log's probe times): to line them up with what else ran.
slow = sorted(zip(lat, dues), reverse=True)[:8]
print("SLOW " + " ".join(f"{d:.3f}:{x:.3f}" for x, d in slow), flush=True)
lat.sort()
q = lambda f: lat[min(len(lat) - 1, int(f * len(lat)))]
print(f"LAT {q(0.5):.3f} {q(0.99):.3f} {lat[-1]:.3f}", flush=True)
print(f"SERVED {served} {n}", flush=True)
