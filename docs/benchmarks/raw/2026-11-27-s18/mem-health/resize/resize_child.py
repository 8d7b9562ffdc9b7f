
import sys, threading, time, torch
def say(*a):
    print(f"{time.monotonic():.6f}", *a, flush=True)
held = []
def commands():
    # "alloc N": one tensor of N GiB, kept; "free": all of them.
    for line in sys.stdin:
        w = line.split()
        if not w:
            continue
        if w[0] == "alloc":
            try:
                held.append(torch.empty(int(w[1]) << 30, dtype=torch.uint8, device="cuda"))
                say("alloc", w[1], "ok")
            except torch.OutOfMemoryError as e:
                say("alloc", w[1], "oom", str(e).splitlines()[0][:120].replace(" ", "_"))
        elif w[0] == "free":
            held.clear()
            torch.cuda.empty_cache()
            say("freed")
    say("stdin-closed")
torch.zeros(1, device="cuda")
threading.Thread(target=commands, daemon=True).start()
while True:
    free, total = torch.cuda.mem_get_info()
    say("info", total, free)
    time.sleep(0.05)
