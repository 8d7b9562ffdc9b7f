"""Helpers for the memory-quota GPU checks."""
import os
import subprocess


def process_used_mib():
    """This process's GPU memory as NVML counts it (nvidia-smi, run without the shim)."""
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    out = subprocess.run(
        ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
        capture_output=True, text=True, env=env,
    ).stdout
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0] == str(os.getpid()):
            return int(parts[1])
    return -1
