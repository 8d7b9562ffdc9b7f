# PyTorch inference: a small conv net in eval mode on fixed input.
import torch

torch.manual_seed(0)
torch.backends.cudnn.deterministic = True
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
m = torch.nn.Sequential(
    torch.nn.Conv2d(3, 16, 3), torch.nn.ReLU(), torch.nn.Conv2d(16, 32, 3), torch.nn.ReLU(),
    torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(32, 10),
).cuda().eval()
x = torch.randn(64, 3, 64, 64, device="cuda")
with torch.no_grad():
    y = m(x)
print(f"RESULT infer sum={y.sum().item():.5e} argmax={y.argmax(1).sum().item()}")
