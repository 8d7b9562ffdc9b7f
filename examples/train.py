"""A small PyTorch training loop for trying cuslice: a transformer-ish MLP
stack on random data. Prints what the GPU looks like from inside (the quota
shows up as the device's size) and the training throughput.

    cuslice run --memory 4GiB -- python3 examples/train.py
"""
import argparse
import time

import torch
import torch.nn as nn

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=200)
p.add_argument("--batch", type=int, default=64)
p.add_argument("--width", type=int, default=4096)
args = p.parse_args()

free, total = torch.cuda.mem_get_info()
print(f"GPU: {torch.cuda.get_device_name()}, {total / 2**30:.2f} GiB visible, {free / 2**30:.2f} GiB free")
model = nn.Sequential(*[nn.Sequential(nn.Linear(args.width, args.width), nn.GELU()) for _ in range(8)]).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
x = torch.randn(args.batch, 512, args.width, device="cuda", dtype=torch.bfloat16)
for step in range(args.steps + 10):
    if step == 10:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(x).float().pow(2).mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
torch.cuda.synchronize()
dt = time.perf_counter() - t0
flops = 6 * sum(p.numel() for p in model.parameters()) * args.batch * 512 * args.steps
print(f"trained {args.steps} steps in {dt:.2f}s: {flops / dt / 1e12:.0f} TFLOP/s, "
      f"peak memory {torch.cuda.max_memory_reserved() / 2**30:.2f} GiB, loss {loss.item():.3e}")
