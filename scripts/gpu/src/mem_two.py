# Two processes sharing one quota. Usage: mem_two.py hold GIB READY_FILE STOP_FILE | mem_two.py try GIB
import os
import sys
import time

import torch

role, gib = sys.argv[1], float(sys.argv[2])
n = int(gib * 2**30)
if role == "hold":
    t = torch.empty(n, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    open(sys.argv[3], "w").close()
    while not os.path.exists(sys.argv[4]):
        time.sleep(0.05)
    print("RESULT two[hold] ok")
else:
    try:
        t = torch.empty(n, dtype=torch.uint8, device="cuda")
        torch.cuda.synchronize()
        print(f"RESULT two[try {gib}GiB] allocated")
    except torch.OutOfMemoryError:
        print(f"RESULT two[try {gib}GiB] OutOfMemoryError")
