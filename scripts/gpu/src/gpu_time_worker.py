# A tenant of one of three kinds for the GPU-time benchmarks (issue #19): a
# saturating trainer (bf16 8192^2 matmuls), a launch-bound decode loop (per
# token 12 layers of small kernels, .item() per token, a 16-token request
# every 100 ms) and an idle-ish service (8 x 4096^2 bf16 layers, .item(),
# one request every 10 ms). It warms up, writes OUT.ready, waits for OUT.go,
# then runs SECONDS (under torch.profiler unless NO_PROFILER=1), writes
# OUT.started when its measured run begins, and finally OUT (JSON: pid, wall,
# in-flight wall time, kernel time from the profiler, timing events).
#   gpu_time_worker.py KIND SECONDS OUT
import json, os, sys, time, torch
kind, seconds, out = sys.argv[1], float(sys.argv[2]), sys.argv[3]
torch.backends.cuda.matmul.allow_tf32 = True
dev = "cuda"
# Timing events around each stretch of work up to a synchronisation (a
# request, or a token): the signal cuslice could read per pass.
e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
ev = [0.0]
if kind == "trainer":
    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    def step():
        e0.record()
        for _ in range(4):
            c = a @ b
        e1.record()
        torch.cuda.synchronize()
        ev[0] += e0.elapsed_time(e1)
    period = 0
elif kind == "decode":
    ws = [torch.randn(2048, 2048, device=dev, dtype=torch.bfloat16) / 45 for _ in range(12)]
    def step():
        x = torch.randn(1, 2048, device=dev, dtype=torch.bfloat16)
        for _ in range(16):
            e0.record()
            h = x
            for w in ws:
                h = torch.nn.functional.silu(h @ w) + h
                h = h * torch.rsqrt(h.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(h.dtype)
            x = h
            e1.record()
            x.sum().item()
            ev[0] += e0.elapsed_time(e1)
    period = 0.1
else:  # service
    ws = [torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16) / 64 for _ in range(8)]
    x0 = torch.randn(32, 4096, device=dev, dtype=torch.bfloat16)
    def step():
        e0.record()
        h = x0
        for w in ws:
            h = torch.relu(h @ w)
        e1.record()
        h.sum().item()
        ev[0] += e0.elapsed_time(e1)
    period = 0.01
for _ in range(3):
    step()
torch.cuda.synchronize()
ready = out + ".ready"
open(ready, "w").close()
while not os.path.exists(out + ".go"):
    time.sleep(0.005)
import contextlib
from torch.profiler import profile, ProfilerActivity
inflight = 0.0
ev[0] = 0.0
profiled = os.environ.get("NO_PROFILER") != "1"
with (profile(activities=[ProfilerActivity.CUDA]) if profiled else contextlib.nullcontext()) as prof:
    # The profiler takes seconds to start: the run begins once it has.
    t0 = time.perf_counter()
    open(out + ".started", "w").close()
    nxt = t0
    while time.perf_counter() - t0 < seconds:
        s = time.perf_counter()
        step()
        inflight += time.perf_counter() - s
        if period:
            nxt += period
            d = nxt - time.perf_counter()
            if d > 0:
                time.sleep(d)
            else:
                nxt = time.perf_counter()
    wall = time.perf_counter() - t0
    torch.cuda.synchronize()
kern, n = 0.0, 0
for e in (prof.events() if profiled else []):
    if e.device_type == torch.autograd.DeviceType.CUDA:
        kern += getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        n += 1
json.dump({"pid": os.getpid(), "wall": wall, "inflight": inflight, "kernel_us": kern, "kernels": n,
           "events_ms": ev[0]},
          open(out, "w"))
