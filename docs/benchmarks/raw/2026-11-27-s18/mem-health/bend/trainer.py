
import os, sys, time, torch
name, target, hold, start_after, free_after_file = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
def say(*a):
    print(f"{time.monotonic():.3f} {name}", *a, flush=True)
time.sleep(start_after)
x = torch.randn(2048, 2048, device="cuda")
f, t = torch.cuda.mem_get_info()
say(f"start total={t/2**30:.2f} free={f/2**30:.2f}")
held = []
for i in range(target):
    t0 = time.monotonic()
    try:
        held.append(torch.empty(1 << 30, dtype=torch.uint8, device="cuda"))
    except torch.OutOfMemoryError:
        say(f"oom at={len(held)} asked_s={time.monotonic()-t0:.2f}")
        break
    dt = time.monotonic() - t0
    if dt > 0.5:
        say(f"waited s={dt:.2f} at={len(held)}")
    y = x @ x
    torch.cuda.synchronize()
f, t = torch.cuda.mem_get_info()
say(f"reached={len(held)} total={t/2**30:.2f} free={f/2**30:.2f}")
end = time.monotonic() + hold
while time.monotonic() < end:
    if free_after_file != "-" and os.path.exists(free_after_file):
        break
    y = x @ x
    torch.cuda.synchronize()
    time.sleep(0.05)
held.clear()
torch.cuda.empty_cache()
say("freed")
time.sleep(1)
say("done")
