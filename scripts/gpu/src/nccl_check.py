# NCCL all-reduce across every visible GPU, one process per GPU.
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

def run(rank, world):
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29511")
    dist.init_process_group("nccl", rank=rank, world_size=world)
    torch.cuda.set_device(rank)
    t = torch.full((1 << 20,), float(rank + 1), device="cuda")
    dist.all_reduce(t)
    if rank == 0:
        print(f"RESULT nccl world={world} value={t[0].item():.1f}", flush=True)
    dist.destroy_process_group()

if __name__ == "__main__":
    os.environ["NCCL_NVLS_ENABLE"] = "0"
    n = torch.cuda.device_count()
    if n < 2:
        print("SKIP one GPU")
        sys.exit(0)
    mp.spawn(run, args=(n,), nprocs=n)
