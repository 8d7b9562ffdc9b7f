"""Why a 30 % ceiling gives a matmul loop more than 30 % of its solo
TFLOP/s, and what the ceiling bucket's burst does about it: the PyTorch bf16
matmul loop (src/mm_loop.py) solo, then capped at 30 % with several burst
lengths (CUSLICE_COMPUTE_BURST_MS), then solo again; for each, the TFLOP/s
ratio and one matmul's own GPU time (CUDA events) vs solo. Prints a table.

    python3 scripts/gpu/experiments/burst_sweep.py --lib target/release/libcuslice.so [--bursts 20,100,400] [--seconds 12]
"""
import argparse
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
p = argparse.ArgumentParser()
p.add_argument("--lib", required=True)
p.add_argument("--bursts", default="20,100,200,400,1000", help="compute_burst_ms values")
p.add_argument("--cap", type=int, default=30)
p.add_argument("--seconds", type=float, default=12)
args = p.parse_args()
work = tempfile.mkdtemp(prefix="cuslice-burst-")


def mm(seconds, burst=None):
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    if burst is not None:
        env.update({"LD_PRELOAD": os.path.abspath(args.lib), "CUSLICE_COMPUTE_MAX": str(args.cap),
                    "CUSLICE_SEGMENT_DIR": os.path.join(work, f"s{burst}"),
                    "CUSLICE_GPU_SEGMENT_DIR": os.path.join(work, f"g{burst}"),
                    "CUSLICE_COMPUTE_BURST_MS": str(burst)})
    out = subprocess.run([sys.executable, os.path.join(HERE, "..", "src", "mm_loop.py"), str(seconds)], env=env,
                         capture_output=True, text=True, check=True).stdout
    v = {w[0]: float(w[1]) for w in (l.split() for l in out.splitlines()) if len(w) == 2 and w[0] in ("TFLOPS", "KERNELMS")}
    return v["TFLOPS"], v["KERNELMS"]


s1 = mm(args.seconds / 2)
rows = [(b, mm(args.seconds, b)) for b in map(int, args.bursts.split(","))]
s2 = mm(args.seconds / 2)
tf = (s1[0] + s2[0]) / 2
km = (s1[1] + s2[1]) / 2
gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"], capture_output=True,
                     text=True).stdout.strip().splitlines()[0]
print(f"bf16 8192² matmul loop on {gpu}: solo {s1[0]:.0f} / {s2[0]:.0f} TFLOP/s (before / after), "
      f"one matmul {s1[1]:.3f} / {s2[1]:.3f} ms\n")
print(f"| {args.cap} % ceiling, burst | TFLOP/s | of solo | one matmul, ms | faster than solo | GPU-time share |")
print("|---|---|---|---|---|---|")
for b, (t, k) in rows:
    speed = km / k
    print(f"| {b} ms | {t:.0f} | {100 * t / tf:.1f} % | {k:.3f} | {speed:.3f}x | {100 * t / tf / speed:.1f} % |")
