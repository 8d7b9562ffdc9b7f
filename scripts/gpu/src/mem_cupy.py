# CuPy's pool under a memory quota.
import cupy as cp

from mem_common import process_used_mib

free, total = cp.cuda.runtime.memGetInfo()
step = 256 << 20
blocks = []
err = "none"
try:
    while len(blocks) < 4096:
        blocks.append(cp.empty(step, dtype=cp.uint8))
except cp.cuda.memory.OutOfMemoryError:
    err = "OutOfMemoryError"
except Exception as e:
    err = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
cp.cuda.Device().synchronize()
print(f"RESULT cupy total_gib={total / 2**30:.3f} allocated_gib={len(blocks) * step / 2**30:.3f} "
      f"error={err} nvml_process_mib={process_used_mib()}")
