# PyTorch under a memory quota: what it sees, and how far it gets in 256 MiB
# steps. Usage: mem_torch.py LABEL
import sys

import torch

from mem_common import process_used_mib

label = sys.argv[1]
free, total = torch.cuda.mem_get_info()
step = 256 << 20
blocks = []
err = "none"
try:
    while len(blocks) < 4096:
        blocks.append(torch.empty(step, dtype=torch.uint8, device="cuda"))
except torch.OutOfMemoryError:
    err = "OutOfMemoryError"
except Exception as e:  # anything else is a failure of the shim
    err = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
torch.cuda.synchronize()
peak = process_used_mib()
print(f"RESULT torch[{label}] total_gib={total / 2**30:.3f} allocated_gib={len(blocks) * step / 2**30:.3f} "
      f"error={err} nvml_process_mib={peak}")
