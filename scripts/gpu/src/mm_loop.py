# A realistic tenant: a PyTorch bf16 8192x8192 matmul loop, optionally as a
# replayed CUDA graph. Prints "START <monotonic ms>" and "TFLOPS <held rate>".
#   [START_AT=<monotonic s>] [MM_N=8192] [MM_PROGRESS=1] mm_loop.py SECONDS [graph]
import os
import signal
import sys
import time

import torch

# SIGTERM ends the run early, as a normal exit: the results are printed and
# the shim's exit report runs.
stopped = []
signal.signal(signal.SIGTERM, lambda *_: stopped.append(1))
seconds = float(sys.argv[1])
graph = len(sys.argv) > 2 and sys.argv[2] == "graph"
n = int(os.environ.get("MM_N", "8192"))
a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
c = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
per = 10
if graph:
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            torch.matmul(a, b, out=c)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(per):
            torch.matmul(a, b, out=c)
    step = g.replay
else:
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    kernel_ms = []

    def step():
        # Time one matmul of each step on the GPU itself (events), to see
        # the kernel's own speed apart from any waiting between kernels.
        e0.record()
        torch.matmul(a, b, out=c)
        e1.record()
        for _ in range(per - 1):
            torch.matmul(a, b, out=c)
for _ in range(3):
    step()
torch.cuda.synchronize()
# START_AT (CLOCK_MONOTONIC seconds): line up with other processes.
start_at = float(os.environ.get("START_AT", "0"))
while time.monotonic() < start_at:
    time.sleep(min(0.01, max(0.0, start_at - time.monotonic())))
t0 = time.monotonic()
print(f"START {t0 * 1e3:.3f}", flush=True)
iters = 0
# MM_PROGRESS=1: "P <monotonic s> <matmuls so far>" after each step, so that
# a benchmark can take the rate over another process's window.
progress = os.environ.get("MM_PROGRESS") == "1"
while time.monotonic() - t0 < seconds and not stopped:
    step()
    torch.cuda.synchronize()
    if not graph:
        kernel_ms.append(e0.elapsed_time(e1))
    iters += per
    if progress:
        print(f"P {time.monotonic():.4f} {iters}", flush=True)
dt = time.monotonic() - t0
print(f"TFLOPS {2 * n**3 * iters / dt / 1e12:.1f}", flush=True)
if not graph and kernel_ms:
    kernel_ms.sort()
    print(f"KERNELMS {kernel_ms[len(kernel_ms) // 2]:.4f}", flush=True)
