"""A program that uses CUPTI's callback API itself (cuptiSubscribe through
ctypes, a privately opened libcupti), run under cuslice beside a trainer:
its callbacks must keep coming for the whole run, across the meter's
probes (cuslice must not detach CUPTI from under it).

    cuslice run --compute 50 -- python3 cupti_subscriber.py SECONDS

Prints one line per second: `T <s> callbacks <count in that second>
launches <count>`, then `SUBSCRIBER ok|LOST` (LOST: a second after the
first with launches but no callback)."""
import ctypes, glob, os, sys, time

import torch

secs = float(sys.argv[1]) if len(sys.argv) > 1 else 6.0


def cupti():
    names = ["libcupti.so.13", "libcupti.so.12", "libcupti.so"]
    for n in names:
        try:
            return ctypes.CDLL(n)
        except OSError:
            pass
    pats = ["/usr/local/cuda*/extras/CUPTI/lib64/libcupti.so*", "/usr/local/cuda*/lib64/libcupti.so*",
            os.path.join(os.path.dirname(torch.__file__), "..", "nvidia", "cuda_cupti", "lib", "libcupti.so*")]
    for p in pats:
        for f in sorted(glob.glob(p)):
            try:
                return ctypes.CDLL(f)
            except OSError:
                pass
    sys.exit("no libcupti")


lib = cupti()
count = [0]
CB = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint, ctypes.c_void_p)


def on_call(user, domain, cbid, data):
    count[0] += 1


cb = CB(on_call)
sub = ctypes.c_void_p()
r = lib.cuptiSubscribe(ctypes.byref(sub), cb, None)
if r != 0:
    sys.exit(f"cuptiSubscribe: {r}")
DRIVER_API = 1
r = lib.cuptiEnableDomain(1, sub, DRIVER_API)
if r != 0:
    sys.exit(f"cuptiEnableDomain: {r}")
print(f"subscribed through {lib._name}", flush=True)

x = torch.randn(1024, 1024, device="cuda")
w = torch.randn(1024, 1024, device="cuda")
torch.cuda.synchronize()
t0 = time.monotonic()
lost = False
sec = 0
while True:
    c0, n = count[0], 0
    end = t0 + sec + 1
    while time.monotonic() < end:
        for _ in range(8):
            y = x @ w
        torch.cuda.synchronize()
        n += 8
        time.sleep(0.002)
    got = count[0] - c0
    print(f"T {sec + 1} callbacks {got} launches {n}", flush=True)
    if sec > 0 and n > 0 and got == 0:
        lost = True
    sec += 1
    if sec >= secs:
        break
print("SUBSCRIBER", "LOST" if lost else "ok", flush=True)
