# A launch-bound inference server for the co-location benchmarks (issue
# #19): a Llama-architecture model built from a config with `transformers`
# (12 layers, hidden 2048, random weights, nothing downloaded), each request
# a `generate` of 16 new tokens after a 128-token prompt, greedy. Such a
# decode loop keeps a trickle of small kernels in flight most of the time
# while using a few percent of the GPU. Requests arrive on a fixed schedule
# (request i is due at t0 + i * period); latency is measured from the due
# time, so time spent behind schedule counts.
#
#   decode_probe.py [--seconds 8] [--period-ms 200] [--start-at MONOTONIC_S]
#
# Prints "LAT <p50 ms> <p99 ms> <max ms>", "SERVED <answered within the
# window> <due within the window>", "START <monotonic ms>" and "SLOW
# <due monotonic ms>:<latency ms> ..." (the 8 slowest requests); "SKIP ..."
# without transformers.
import argparse
import time

import torch

p = argparse.ArgumentParser()
p.add_argument("--seconds", type=float, default=8.0)
p.add_argument("--period-ms", type=float, default=200.0)
p.add_argument("--start-at", type=float, default=0.0)
p.add_argument("--new-tokens", type=int, default=16)
a = p.parse_args()

try:
    from transformers import LlamaConfig, LlamaForCausalLM
except ImportError:
    print("SKIP transformers is not installed", flush=True)
    raise SystemExit(0)

torch.manual_seed(0)
cfg = LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=12, num_attention_heads=16,
                  num_key_value_heads=16, vocab_size=32000, max_position_embeddings=512)
with torch.device("cuda"):
    model = LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
prompt = torch.randint(0, cfg.vocab_size, (1, 128), device="cuda")


def request():
    with torch.no_grad():
        out = model.generate(prompt, max_new_tokens=a.new_tokens, min_new_tokens=a.new_tokens,
                             do_sample=False, pad_token_id=0)
    return int(out[0, -1])


for _ in range(3):  # warm up
    request()
torch.cuda.synchronize()

while time.monotonic() < a.start_at:
    time.sleep(min(0.01, max(0.0, a.start_at - time.monotonic())))
period = a.period_ms / 1e3
n = int(a.seconds / period) + 1
t0 = time.monotonic()
print(f"START {t0 * 1e3:.3f}", flush=True)
lat = []
dues = []
served = 0
end = t0 + a.seconds + period
for i in range(n):
    due = t0 + i * period
    now = time.monotonic()
    if now > end:
        break
    if now < due:
        time.sleep(max(0.0, due - now))
    request()
    done = time.monotonic()
    lat.append((done - due) * 1e3)
    dues.append(due * 1e3)
    if done <= end:
        served += 1
# The slowest requests, with when they were due (CLOCK_MONOTONIC ms, as the
# shim's debug log's probe times): to line them up with what else ran.
slow = sorted(zip(lat, dues), reverse=True)[:8]
print("SLOW " + " ".join(f"{d:.3f}:{x:.3f}" for x, d in slow), flush=True)
lat.sort()
q = lambda f: lat[min(len(lat) - 1, int(f * len(lat)))]
print(f"LAT {q(0.5):.3f} {q(0.99):.3f} {lat[-1]:.3f}", flush=True)
print(f"SERVED {served} {n}", flush=True)
