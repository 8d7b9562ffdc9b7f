# PyTorch: allocate, matmul, backward. Prints results that must not change
# under the shim.
import torch

torch.manual_seed(0)
torch.backends.cuda.matmul.allow_tf32 = False
x = torch.randn(2048, 2048, device="cuda", requires_grad=True)
w = torch.randn(2048, 2048, device="cuda", requires_grad=True)
y = torch.relu(x @ w).sum()
y.backward()
torch.cuda.synchronize()
free, total = torch.cuda.mem_get_info()
big = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
del big
print(f"RESULT torch loss={y.item():.6e} gx={x.grad.abs().sum().item():.6e} "
      f"gw={w.grad.abs().sum().item():.6e} total_gib={total / 2**30:.3f}")
