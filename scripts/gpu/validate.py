"""Compatibility matrix: each program runs natively and under the shim with
a memory quota and a compute share; results must match and the shim must
have intercepted its allocations and launches. Missing software is
reported as SKIP with the reason. Prints a markdown table.

    python3 scripts/gpu/validate.py --lib target/release/libcuslice.so [--work DIR] [--only nccl,jax]
"""
import argparse
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(HERE, "src")
REPO = os.path.dirname(os.path.dirname(HERE))

p = argparse.ArgumentParser()
p.add_argument("--lib", required=True)
p.add_argument("--work", default=None)
p.add_argument("--memory", default="16GiB")
p.add_argument("--compute", default="50")
p.add_argument("--only", default="", help="comma-separated words: run only the checks whose names contain one (case-insensitive)")
p.add_argument("--cli", default=None, help="the cuslice command (default: next to --lib)")
args = p.parse_args()
if args.cli is None:
    args.cli = os.path.join(os.path.dirname(os.path.abspath(args.lib)), "cuslice")
ONLY = [w.strip().lower() for w in args.only.split(",") if w.strip()]


def wanted(name):
    return not ONLY or any(w in name.lower() for w in ONLY)
LIB = os.path.abspath(args.lib)
QUOTA_GIB = float(args.memory.lower().rstrip("ib").rstrip("g")) if args.memory.lower().endswith(("gib", "g")) else None
WORK = args.work or tempfile.mkdtemp(prefix="cuslice-validate-")
os.makedirs(WORK, exist_ok=True)
PY = sys.executable
rows = []


def have(module):
    return importlib.util.find_spec(module) is not None


def env(shim, extra=None):
    e = dict(os.environ)
    e.pop("LD_PRELOAD", None)
    e["PYTHONPATH"] = SRC
    e["NCCL_NVLS_ENABLE"] = "0"
    if shim:
        e.update({
            "LD_PRELOAD": LIB,
            "CUSLICE_LOG": "debug",
            "CUSLICE_MEMORY": args.memory,
            "CUSLICE_COMPUTE": args.compute,
            "CUSLICE_SEGMENT_DIR": os.path.join(WORK, "seg"),
            "CUSLICE_GPU_SEGMENT_DIR": os.path.join(WORK, "gpu"),
        })
    e.update(extra or {})
    return e


def run(cmd, shim, extra=None, timeout=300):
    r = subprocess.run(cmd, capture_output=True, text=True, env=env(shim, extra), cwd=WORK, timeout=timeout)
    results = [l for l in r.stdout.splitlines() if l.startswith(("RESULT", "trained "))]
    return r.returncode, results, r.stdout, r.stderr


def comparable(results):
    """RESULT lines without the device size, which the quota changes on
    purpose (checked separately)."""
    import re
    return [re.sub(r" total_gib=[0-9.]+", "", r) for r in results]


def total_gib(results):
    import re
    m = [re.search(r"total_gib=([0-9.]+)", r) for r in results]
    return next((float(x.group(1)) for x in m if x), None)


def intercepted(stderr, prefix):
    return sorted({w.split()[-1] for w in stderr.splitlines() if f"intercepted {prefix}" in w})


def check(name, cmd, needs=None, extra=None, compare=True):
    if not wanted(name):
        return
    if needs and not needs[0]:
        rows.append((name, "SKIP", needs[1]))
        return
    try:
        rn, a, _, en = run(cmd, False, extra)
        rs, b, out, es = run(cmd, True, extra)
    except subprocess.TimeoutExpired:
        rows.append((name, "FAIL", "timed out"))
        return
    if "SKIP" in out:
        rows.append((name, "SKIP", out.split("SKIP", 1)[1].strip().splitlines()[0]))
        return
    if rn != 0:
        # Broken without cuslice too: not ours to judge.
        last = en.strip().splitlines()[-1] if en.strip() else f"exit {rn}"
        rows.append((name, "SKIP", f"fails without the shim too: {last[:160]}"))
        return
    allocs, launches = intercepted(es, "cuMem"), intercepted(es, "cuLaunch") + intercepted(es, "cuGraphLaunch")
    why = []
    if rs != 0:
        tail = [l for l in es.splitlines() if not l.startswith("cuslice[")][-1:] or [""]
        why.append(f"shim exit {rs}: {tail[0][:160]}")
    if compare and comparable(a) != comparable(b):
        why.append(f"results differ: {a} vs {b}")
    seen = total_gib(b)
    if seen is not None and QUOTA_GIB is not None and abs(seen - QUOTA_GIB) > 0.001:
        why.append(f"the device looks like {seen} GiB, not the {QUOTA_GIB} GiB quota")
    if not b:
        why.append("no RESULT line")
    if not allocs or not launches:
        why.append("shim saw no allocation" if not allocs else "shim saw no launch")
    detail = f"{'; '.join(b)[:120]} (hooks: {', '.join(allocs[:3] + launches[:3])})"
    rows.append((name, "FAIL" if why else "PASS", "; ".join(why) if why else detail))


arch = subprocess.run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"], capture_output=True,
                      text=True).stdout.split()[0].replace(".", "")
gpus = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"], capture_output=True,
                      text=True).stdout.strip().splitlines()
nvcc = shutil.which("nvcc")
if nvcc and (wanted("nvcc runtime program") or wanted("driver-API program")):
    subprocess.run([nvcc, "-ptx", f"-arch=sm_{arch}", "-o", f"{WORK}/kernels.ptx", f"{SRC}/kernels.cu"], check=True)
    subprocess.run([nvcc, "-O2", f"-arch=sm_{arch}", "-o", f"{WORK}/drvapi", f"{SRC}/drvapi.cpp", "-lcuda"], check=True)
    subprocess.run([nvcc, "-O2", f"-arch=sm_{arch}", "-o", f"{WORK}/rtapi", f"{SRC}/rtapi.cu"], check=True)

torch_ok = (have("torch"), "PyTorch not installed")
check("PyTorch training (allocate, matmul, backward)", [PY, f"{SRC}/torch_check.py"], torch_ok)
check("PyTorch inference (conv net, eval)", [PY, f"{SRC}/torch_infer.py"], torch_ok)
check("PyTorch training loop (examples/train.py)", [PY, f"{REPO}/examples/train.py", "--steps", "20", "--batch", "4", "--width", "4096"],
      torch_ok, compare=False)
# The README's main command, exactly as a newcomer types it (from the
# repository root, with the command built next to the library): it must
# run to its end under its 4 GiB quota and see a 4 GiB device.
if wanted("README main command"):
    if not have("torch"):
        rows.append(("README main command", "SKIP", "PyTorch not installed"))
    elif not os.path.exists(args.cli):
        rows.append(("README main command", "FAIL", f"{args.cli}: no cuslice command next to the library"))
    else:
        e = dict(os.environ)
        e.pop("LD_PRELOAD", None)
        cmd = [args.cli, "run", "--lib", LIB, "--memory", "4GiB", "--", "python3", "examples/train.py"]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, env=e, cwd=REPO, timeout=600)
            out = r.stdout
            why = []
            if r.returncode != 0:
                why.append(f"exit {r.returncode}: {(r.stderr.strip().splitlines() or [''])[-1][:160]}")
            if "4.00 GiB visible" not in out:
                why.append("the device does not look like the 4 GiB quota")
            if "trained " not in out:
                why.append("no 'trained' line")
            rows.append(("README main command (`cuslice run --memory 4GiB -- python3 examples/train.py`)",
                         "FAIL" if why else "PASS",
                         "; ".join(why) if why else " / ".join(out.strip().splitlines())[:300]))
        except subprocess.TimeoutExpired:
            rows.append(("README main command", "FAIL", "timed out after 600 s"))
check("torch.compile (Triton kernels)", [PY, f"{SRC}/compile_check.py"], (have("torch") and have("triton"), "torch or triton missing"))
check("CUDA graphs (torch.cuda.CUDAGraph)", [PY, f"{SRC}/graph_check.py"], torch_ok)
check("PyTorch expandable segments", [PY, f"{SRC}/torch_check.py"], torch_ok,
      {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})
check("PyTorch cudaMallocAsync backend", [PY, f"{SRC}/torch_check.py"], torch_ok,
      {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"})
check("JAX", [PY, f"{SRC}/jax_check.py"], (have("jax"), "JAX not installed"))
check("CuPy", [PY, f"{SRC}/cupy_check.py"], (have("cupy"), "CuPy not installed"))
check("Numba CUDA", [PY, f"{SRC}/numba_check.py"], (have("numba"), "Numba not installed"))
check("nvcc runtime program (static cudart)", [f"{WORK}/rtapi"], (nvcc is not None, "nvcc not found"))
check("driver-API program", [f"{WORK}/drvapi", f"{WORK}/kernels.ptx"], (nvcc is not None, "nvcc not found"))
check("NCCL all-reduce across GPUs", [PY, f"{SRC}/nccl_check.py"], torch_ok, compare=True)

# Two processes of one container share its quota and its share.
if not wanted("two processes in one container"):
    pass
elif have("torch"):
    # Its own segment: a quota of 4 GiB, shared by the two processes.
    e = env(True, {"CUSLICE_MEMORY": "4GiB", "CUSLICE_SEGMENT_DIR": os.path.join(WORK, "seg-two")})
    ready, stop = os.path.join(WORK, "ready"), os.path.join(WORK, "stop")
    for f in (ready, stop):
        if os.path.exists(f):
            os.remove(f)
    hold = subprocess.Popen([PY, f"{SRC}/mem_two.py", "hold", "2", ready, stop], env=e, cwd=WORK,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    import time
    for _ in range(600):
        if os.path.exists(ready):
            break
        time.sleep(0.1)
    big = subprocess.run([PY, f"{SRC}/mem_two.py", "try", "2.5"], env=e, cwd=WORK, capture_output=True, text=True).stdout
    small = subprocess.run([PY, f"{SRC}/mem_two.py", "try", "0.75"], env=e, cwd=WORK, capture_output=True, text=True).stdout
    open(stop, "w").close()
    hold.communicate(timeout=60)
    ok = "OutOfMemoryError" in big and "allocated" in small
    rows.append(("two processes in one container (4 GiB shared)", "PASS" if ok else "FAIL",
                 f"with 2 GiB held by one: 2.5 GiB -> {big.strip().split()[-1] if big.strip() else '?'}, "
                 f"0.75 GiB -> {small.strip().split()[-1] if small.strip() else '?'}"))
elif wanted("two processes in one container"):
    rows.append(("two processes in one container", "SKIP", "PyTorch not installed"))

print(f"# Compatibility on {gpus[0] if gpus else 'unknown GPU'} ({len(gpus)} GPU{'s' if len(gpus) != 1 else ''})\n")
commit = subprocess.run(["git", "-C", REPO, "describe", "--always", "--dirty"], capture_output=True, text=True).stdout.strip()
print(f"cuslice commit: {commit or 'unknown'}.\n")
print(f"Command: `python3 scripts/gpu/validate.py --lib target/release/libcuslice.so` (under the shim: "
      f"CUSLICE_MEMORY={args.memory}, CUSLICE_COMPUTE={args.compute}).\n")
print("| check | verdict | detail |")
print("|---|---|---|")
for r in rows:
    print(f"| {r[0]} | {r[1] if r[1] != 'FAIL' else '**FAIL**'} | {r[2]} |")
fails = sum(1 for r in rows if r[1] == "FAIL")
skips = sum(1 for r in rows if r[1] == "SKIP")
print(f"\n{len(rows) - fails - skips} passed, {fails} failed, {skips} skipped")
sys.exit(1 if fails else 0)
