# What a CUDA context costs: NVML's per-process usage right after a primary
# context is created through the driver API, and after PyTorch initialises.
import ctypes
import sys

from mem_common import process_used_mib

if sys.argv[1] == "driver":
    cu = ctypes.CDLL("libcuda.so.1")
    assert cu.cuInit(0) == 0
    dev = ctypes.c_int()
    ctx = ctypes.c_void_p()
    assert cu.cuDeviceGet(ctypes.byref(dev), 0) == 0
    assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0
    assert cu.cuCtxSetCurrent(ctx) == 0
    print(f"RESULT ctx[driver] nvml_process_mib={process_used_mib()}")
else:
    import torch
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    print(f"RESULT ctx[torch] nvml_process_mib={process_used_mib()} torch_reserved_mib={torch.cuda.memory_reserved() >> 20}")
