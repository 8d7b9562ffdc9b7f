"""Does CUPTI cost a launch-bound loop while attached but not recording?
(Issue #19: the decode server under cuslice beside a trainer was ~20-30 %
slower at p50 than natively although it waited ~1 ms for anyone and
recorded in probes only ~3 % of its run; alone, where the meter never
loads CUPTI, it ran as natively. Suspect: once CUPTI's activity API is
attached, every launch pays for it, recording or not.)

One process, no cuslice: the decode model of decode_probe.py, requests
back to back, in phases: before CUPTI is used; callbacks registered
but recording never enabled (a light tenant on a shared GPU, which loads
CUPTI but takes no probe, so is never detached); recording kernels
(CONCURRENT_KERNEL activity enabled); attached but not recording (enabled
once, then disabled and flushed, as after a probe); after cuptiFinalize
(CUPTI detached). Prints each phase's median request time.

    python3 cupti_attached.py [--requests 8] [--cycles 2]
"""
import argparse
import ctypes
import statistics
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

p = argparse.ArgumentParser()
p.add_argument("--requests", type=int, default=8)
p.add_argument("--cycles", type=int, default=2)
a = p.parse_args()

torch.manual_seed(0)
cfg = LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=12, num_attention_heads=16,
                  num_key_value_heads=16, vocab_size=32000, max_position_embeddings=512)
with torch.device("cuda"):
    model = LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
prompt = torch.randint(0, cfg.vocab_size, (1, 128), device="cuda")


def request():
    with torch.no_grad():
        out = model.generate(prompt, max_new_tokens=16, min_new_tokens=16, do_sample=False, pad_token_id=0)
    return int(out[0, -1])


def phase(name):
    t = []
    for _ in range(a.requests):
        t0 = time.perf_counter()
        request()
        t.append(1e3 * (time.perf_counter() - t0))
    print(f"{name}: median {statistics.median(t):.1f} ms, min {min(t):.1f}, max {max(t):.1f}", flush=True)
    return statistics.median(t)


# The CUPTI the process already has (PyTorch's), else one on the search path.
path = None
with open("/proc/self/maps") as f:
    for line in f:
        if "libcupti" in line:
            path = line.split()[-1]
            break
cupti = ctypes.CDLL(path or "libcupti.so")
print(f"CUPTI: {path or 'libcupti.so (search path)'}", flush=True)

REQ = ctypes.CFUNCTYPE(None, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_size_t),
                       ctypes.POINTER(ctypes.c_size_t))
COMP = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_uint32, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t)
SIZE = 1 << 20
keep = []
done = [0, 0]


def requested(buf, size, max_records):
    b = ctypes.create_string_buffer(SIZE)
    keep.append(b)
    buf[0] = ctypes.cast(b, ctypes.c_void_p).value
    size[0] = SIZE
    max_records[0] = 0


def completed(ctx, stream, buf, size, valid):
    done[0] += 1
    done[1] += valid


req_cb, comp_cb = REQ(requested), COMP(completed)
KIND = 10  # CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL


def check(r, what):
    if r != 0:
        raise SystemExit(f"{what}: CUPTI error {r}")


for _ in range(3):
    request()
torch.cuda.synchronize()
res = {}
res.setdefault("before CUPTI is used", []).append(phase("before CUPTI is used"))
for c in range(a.cycles):
    r = cupti.cuptiActivityRegisterCallbacks(req_cb, comp_cb)
    if r != 0:
        print(f"cycle {c}: cuptiActivityRegisterCallbacks: CUPTI error {r} (after cuptiFinalize?)")
        break
    # As a light tenant on a shared GPU: the meter loaded CUPTI and
    # registered its callbacks, and no probe ever came.
    res.setdefault("registered, never enabled", []).append(phase("registered, never enabled"))
    check(cupti.cuptiActivityEnable(KIND), "cuptiActivityEnable")
    res.setdefault("recording", []).append(phase("recording"))
    check(cupti.cuptiActivityDisable(KIND), "cuptiActivityDisable")
    check(cupti.cuptiActivityFlushAll(0), "cuptiActivityFlushAll")
    res.setdefault("attached, not recording", []).append(phase("attached, not recording"))
    check(cupti.cuptiFinalize(), "cuptiFinalize")
    res.setdefault("after cuptiFinalize", []).append(phase("after cuptiFinalize"))
print(f"records delivered: {done[1]} bytes in {done[0]} buffers")
base = res["before CUPTI is used"][0]
print("| phase | median request (ms) | vs before |")
print("|---|---|---|")
for k, v in res.items():
    m = statistics.median(v)
    print(f"| {k} | {m:.1f} ({', '.join(f'{x:.1f}' for x in v)}) | {m / base:.2f}x |")
