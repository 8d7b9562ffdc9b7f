# torch.compile: Triton kernels generated and launched under the shim.
import torch

def f(x, y):
    return (torch.sin(x) * torch.cos(y) + x * y).relu().sum(dim=1)

x = torch.arange(1 << 20, device="cuda", dtype=torch.float32).reshape(1024, 1024) / 1e6
y = x.flip(0)
c = torch.compile(f)
a, b = f(x, y), c(x, y)
print(f"RESULT compile eager={a.sum().item():.5e} compiled={b.sum().item():.5e} close={torch.allclose(a, b, rtol=1e-4)}")
