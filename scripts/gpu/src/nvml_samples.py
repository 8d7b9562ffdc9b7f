# NVML's per-process utilization samples of GPU 0 (nvmlDeviceGetProcessUtilization),
# for the GPU-time benchmarks and experiments: samples(last_us) -> [(pid, timestamp_us, smUtil)].
import ctypes

_nvml = ctypes.CDLL("libnvidia-ml.so.1")
assert _nvml.nvmlInit_v2() == 0
_dev = ctypes.c_void_p()
assert _nvml.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(_dev)) == 0


class _Sample(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_uint), ("ts", ctypes.c_ulonglong), ("sm", ctypes.c_uint),
                ("mem", ctypes.c_uint), ("enc", ctypes.c_uint), ("dec", ctypes.c_uint)]


def samples(last):
    n = ctypes.c_uint(0)
    _nvml.nvmlDeviceGetProcessUtilization(_dev, None, ctypes.byref(n), ctypes.c_ulonglong(last))
    if n.value == 0:
        return []
    buf = (_Sample * (n.value + 8))()
    n = ctypes.c_uint(n.value + 8)
    if _nvml.nvmlDeviceGetProcessUtilization(_dev, buf, ctypes.byref(n), ctypes.c_ulonglong(last)) != 0:
        return []
    return [(buf[i].pid, buf[i].ts, buf[i].sm) for i in range(n.value)]
