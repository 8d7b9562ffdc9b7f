"""A small PyTorch training loop for trying cuslice: a transformer-ish MLP
stack on random data. Prints what the GPU looks like from inside (the quota
shows up as the device's size), the batch it chose to fit, and the training
throughput.

    cuslice run --memory 4GiB -- python3 examples/train.py

Without --batch, the batch is the largest power of two (at most 64) whose
estimated peak memory fits in 60 % of what the device says is free, so the
same command runs under a 4 GiB quota and on a whole GPU.
"""
import argparse
import sys
import time

import torch
import torch.nn as nn

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=200)
p.add_argument("--batch", type=int, default=None, help="sequences of 512 tokens per step (default: what fits)")
p.add_argument("--width", type=int, default=2048)
p.add_argument("--layers", type=int, default=8)
args = p.parse_args()
SEQ = 512

free, total = torch.cuda.mem_get_info()
print(f"GPU: {torch.cuda.get_device_name()}, {total / 2**30:.2f} GiB visible, {free / 2**30:.2f} GiB free")

params = args.layers * (args.width * args.width + args.width)
# fp32 weights, gradients and AdamW's two moments, plus autocast's bf16
# copies of the weights.
fixed = params * (4 * 4 + 2)
# Per token: each layer keeps its bf16 input and pre-activation for the
# backward pass; the backward pass and the fp32 loss need about as much
# again at their peak.
per_token = args.layers * args.width * 2 * 2 * 2 + args.width * 4 * 4
if args.batch is None:
    budget = 0.6 * free - fixed
    args.batch = 64
    while args.batch > 1 and args.batch * SEQ * per_token > budget:
        args.batch //= 2
    if args.batch * SEQ * per_token > budget:
        sys.exit(f"train.py: the model alone ({fixed / 2**30:.2f} GiB with its optimizer) does not fit in "
                 f"{free / 2**30:.2f} GiB free: give a smaller --width or --layers, or more memory")
estimate = fixed + args.batch * SEQ * per_token
print(f"model: {args.layers} x {args.width}x{args.width}, {params / 1e6:.0f} M parameters; "
      f"batch {args.batch} x {SEQ} tokens, about {estimate / 2**30:.2f} GiB at its peak")

model = nn.Sequential(*[nn.Sequential(nn.Linear(args.width, args.width), nn.GELU()) for _ in range(args.layers)]).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
x = torch.randn(args.batch, SEQ, args.width, device="cuda", dtype=torch.bfloat16)
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
flops = 6 * params * args.batch * SEQ * args.steps
print(f"trained {args.steps} steps in {dt:.2f}s: {flops / dt / 1e12:.0f} TFLOP/s, "
      f"peak memory {torch.cuda.max_memory_reserved() / 2**30:.2f} GiB, loss {loss.item():.3e}")
