"""The load beside the health soak (scripts/gpu/health_soak.sh): what a
shared GPU runs, so that the health source is judged under load, not on an
idle GPU.

    python3 health_load.py matmul SECONDS   bf16 8192^2 matmuls without a pause
    python3 health_load.py churn SECONDS    allocations of 64 MiB to 1 GiB made
                                            and freed, small matmuls between,
                                            the caching allocator emptied now
                                            and then (cudaMalloc/cudaFree reach
                                            the driver)

Prints one line at the end: what it did.
"""
import random
import sys
import time

import torch


def matmul(secs):
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    n, t0 = 0, time.time()
    end = t0 + secs
    while time.time() < end:
        for _ in range(20):
            a @ b
        torch.cuda.synchronize()
        n += 20
    dt = time.time() - t0
    print(f"matmul: {n} bf16 8192^2 matmuls in {dt:.0f} s, {2 * 8192**3 * n / dt / 1e12:.0f} TFLOP/s")


def churn(secs):
    rng = random.Random(35)
    held, n, peak = [], 0, 0
    x = torch.randn(2048, 2048, device="cuda")
    end = time.time() + secs
    while time.time() < end:
        size = rng.choice([64, 256, 1024]) << 20
        held.append(torch.empty(size, dtype=torch.uint8, device="cuda"))
        if len(held) > 8:
            held.pop(rng.randrange(len(held)))
        x = (x @ x).clamp_(-1, 1)
        n += 1
        if n % 50 == 0:
            torch.cuda.synchronize()
            peak = max(peak, torch.cuda.memory_allocated())
            held.clear()
            torch.cuda.empty_cache()
    torch.cuda.synchronize()
    print(f"churn: {n} allocations (peak {peak >> 20} MiB held), the cache emptied {n // 50} times")


if __name__ == "__main__":
    {"matmul": matmul, "churn": churn}[sys.argv[1]](float(sys.argv[2]))
