# CUDA graphs: capture and replay (torch.cuda.CUDAGraph).
import torch

x = torch.arange(4096, device="cuda", dtype=torch.float32)
y = torch.empty_like(x)
s = torch.cuda.Stream()
s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s):
    for _ in range(3):
        y.copy_(x * 2 + 1)
torch.cuda.current_stream().wait_stream(s)
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g):
    y.copy_(x * 2 + 1)
total = 0.0
for i in range(10):
    x.add_(1)
    g.replay()
    total += y.sum().item()
print(f"RESULT graphs total={total:.6e}")
