# Inference throughput: a ResNet-like conv stack, bf16, fixed batch.
# Prints "IPS <images per second>".
import time

import torch

torch.backends.cudnn.benchmark = True
layers = []
c = 3
for w in (64, 128, 256, 512):
    layers += [torch.nn.Conv2d(c, w, 3, padding=1), torch.nn.BatchNorm2d(w), torch.nn.ReLU(), torch.nn.MaxPool2d(2)]
    c = w
m = torch.nn.Sequential(*layers, torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(c, 1000))
m = m.cuda().eval().to(torch.bfloat16)
x = torch.randn(256, 3, 224, 224, device="cuda", dtype=torch.bfloat16)
with torch.no_grad():
    for _ in range(5):
        m(x)
    torch.cuda.synchronize()
    t0, n = time.perf_counter(), 0
    while time.perf_counter() - t0 < 5:
        m(x)
        n += 1
    torch.cuda.synchronize()
print(f"IPS {n * x.shape[0] / (time.perf_counter() - t0):.1f}")
