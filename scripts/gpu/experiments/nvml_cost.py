# Experiment (issue #12): what do the NVML calls `cuslice watch` makes per
# pass cost in CPU time, with the GPU processes present now? Prints CPU ms
# per call (time.process_time over ROUNDS calls) for each.
#   nvml_cost.py [ROUNDS=100]
import ctypes
import sys
import time

rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 100
nvml = ctypes.CDLL("libnvidia-ml.so.1")
assert nvml.nvmlInit_v2() == 0
dev = ctypes.c_void_p()
assert nvml.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(dev)) == 0


class Proc(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_uint), ("used", ctypes.c_ulonglong),
                ("gi", ctypes.c_uint), ("ci", ctypes.c_uint)]


class Sample(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_uint), ("ts", ctypes.c_ulonglong), ("sm", ctypes.c_uint),
                ("mem", ctypes.c_uint), ("enc", ctypes.c_uint), ("dec", ctypes.c_uint)]


class Util(ctypes.Structure):
    _fields_ = [("gpu", ctypes.c_uint), ("mem", ctypes.c_uint)]


procs = (Proc * 256)()
samples = (Sample * 256)()
util = Util()
last = ctypes.c_ulonglong(0)


def running():
    n = ctypes.c_uint(256)
    r = nvml.nvmlDeviceGetComputeRunningProcesses_v3(dev, ctypes.byref(n), procs)
    return r, n.value


def putil():
    n = ctypes.c_uint(256)
    r = nvml.nvmlDeviceGetProcessUtilization(dev, samples, ctypes.byref(n), last)
    if r == 0 and n.value:
        last.value = max(s.ts for s in samples[: n.value])
    return r, n.value


def dutil():
    return nvml.nvmlDeviceGetUtilizationRates(dev, ctypes.byref(util)), 1


for name, f in [("GetComputeRunningProcesses_v3", running),
                ("GetProcessUtilization", putil),
                ("GetUtilizationRates", dutil)]:
    f()
    c0, w0 = time.process_time(), time.monotonic()
    res = None
    for _ in range(rounds):
        res = f()
    c1, w1 = time.process_time(), time.monotonic()
    print(f"{name}: {1e3 * (c1 - c0) / rounds:.3f} ms CPU, {1e3 * (w1 - w0) / rounds:.3f} ms wall per call (last: rc {res[0]}, {res[1]} entries)")
