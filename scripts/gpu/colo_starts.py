"""Co-location cells that cannot hide a bimodal result (issue #19): each cell
is run in several starts, the service started at varied offsets after the
trainer (so that its start-up and warm-up overlap the trainer's work, which
is how the collapse happened), natively and under cuslice, in this one
invocation on this GPU; the table gives the median and the worst start.

    python3 scripts/gpu/colo_starts.py --lib target/release/libcuslice.so [--starts 8] [--cells small,decode]

Cells: `small` (a small bf16 MLP service, one request every 10 ms, and a
bf16 8192² matmul trainer), `decode` (a transformers Llama-architecture
decode loop, 16 new tokens every 200 ms, and the same trainer), `pair` (two
small services side by side, no trainer; its row gives the worse of the
two in each start). Each is measured natively (the reference), with both at
`compute = 50` (standard class), and with the service in the latency class;
`nometer` the standard class without the meter
(`CUSLICE_CUPTI=off`: wall time in flight charged), `attached` the standard
class with CUPTI left attached between probes (`CUSLICE_METER_DETACH=0`,
the default before 58b1a82), `detach` and `latency-detach` the standard and
latency classes with `CUSLICE_METER_DETACH=1` set explicitly (the default
since 58b1a82: the same as `standard` and `latency`).
"""
import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(HERE, "src")

p = argparse.ArgumentParser()
p.add_argument("--lib", required=True)
p.add_argument("--work", default=None)
p.add_argument("--starts", type=int, default=8)
p.add_argument("--cells", default="small,decode")
p.add_argument("--window", type=float, default=4.0, help="the service's measured window, s")
p.add_argument("--decode-period-ms", type=float, default=0.0,
               help="the decode server's request period; 0 (default): twice its solo request time, measured "
                    "first (a server that cannot keep up alone measures a backlog)")
p.add_argument("--modes", default="solo,native,standard,latency",
               help="solo: the service alone under cuslice; native: the pair without cuslice (the reference; "
                    "needed by standard and latency); standard, latency, nometer, attached, detach, latency-detach: the pair under "
                    "cuslice")
p.add_argument("--lib-b", default=None,
               help="a second build of libcuslice.so: modes with the suffix -b (standard-b, latency-b, ...) run both "
                    "tenants with it, side by side with the same modes on --lib (an A/B of two builds in one run)")
p.add_argument("--pin", action="store_true",
               help="pin the service to CPUs 2-3 and the trainer to CPUs 4-5 (in every mode alike): less noise "
                    "from the host's scheduler")
p.add_argument("--first-start", type=int, default=0,
               help="the first start's index (its offset is OFFSETS[index %% 8]): an invocation that goes on where "
                    "another on this machine stopped (a device call is limited to 10 min)")
p.add_argument("--dump", default=None, help="FILE: write every start's results as JSON, for --merge")
p.add_argument("--merge", default=None,
               help="FILE,FILE...: run nothing; the table of the starts these --dump files hold together (the "
                    "reference is their native starts together, the solo figures their median)")
p.add_argument("--native-ref", default=None,
               help="P99_MS,SERVED_FRACTION,TFLOPS[,SOLO_P99_MS]: the native pair's medians from an earlier "
                    "invocation on this machine, instead of running the native mode again")
args = p.parse_args()
LIB = os.path.abspath(args.lib)
LIB_B = os.path.abspath(args.lib_b) if args.lib_b else None
CUR_LIB = LIB  # the build the current mode runs (--lib, or --lib-b for a -b mode)
WORK = args.work or tempfile.mkdtemp(prefix="cuslice-colo-")
os.makedirs(WORK, exist_ok=True)
GPUSEG = os.path.join(WORK, "gpu")
OFFSETS = [0.0, 0.5, 1.0, 2.0, 4.0, 0.25, 1.5, 3.0]
_n = 0
# COLO_LOGS=DIR: each start's service output and cuslice's messages go there
# (at info level; COLO_LOG_LEVEL=debug for the meter's probe times, to line
# up with the services' SLOW requests).
LOGS = os.environ.get("COLO_LOGS")
LOG_LEVEL = os.environ.get("COLO_LOG_LEVEL", "info")
_log_n = 0
if LOGS:
    os.makedirs(LOGS, exist_ok=True)


def quota(limits, top=""):
    global _n
    _n += 1
    name = f"t{_n}"
    path = os.path.join(WORK, f"{name}.toml")
    with open(path, "w") as f:
        f.write(f'tenant = "{name}"\nsegment_dir = "{WORK}/mem-{name}"\ngpu_segment_dir = "{GPUSEG}"\n{top}\n[all]\n{limits}\n')
    return path


def start(cmd, q=None, extra=None, cpus=None):
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    env.update(extra or {})
    if q is not None:
        env["LD_PRELOAD"] = CUR_LIB
        env["CUSLICE_CONFIG"] = q
    pin = (lambda: os.sched_setaffinity(0, cpus)) if cpus and args.pin else None
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=WORK,
                            preexec_fn=pin)


def parse(out):
    v = {"P": []}
    for line in out.splitlines():
        w = line.split()
        if not w:
            continue
        if w[0] == "P":
            v["P"].append((float(w[1]), float(w[2])))
        elif w[0] in ("LAT", "SERVED"):
            v[w[0]] = [float(x) for x in w[1:]]
        elif w[0] in ("START", "TFLOPS", "KERNELMS", "TRAINER_KERNEL_MS"):
            v[w[0]] = float(w[1])
        elif w[0] == "SKIP":
            v["SKIP"] = line
    return v


def service_cmd(cell):
    if cell in ("small", "pair"):
        return [sys.executable, os.path.join(SRC, "infer_probe.py"), "--seconds", str(args.window)]
    return [sys.executable, os.path.join(SRC, "decode_probe.py"), "--seconds", str(args.window),
            "--period-ms", str(args.decode_period_ms)]


def one(cell, offset, sq, tq, with_trainer=True, service_env=None, label=""):
    """One start: the trainer first, the service `offset` s after the
    trainer's work began. Returns (service results, trainer TFLOP/s over
    the service's window or None). Cell `pair`: the second service (quota
    `tq`, CPUs 4-5) instead of the trainer, both started together; the
    results are the one with the worse p99."""
    tr = None
    logged = {"CUSLICE_LOG": LOG_LEVEL} if LOGS else {}
    if with_trainer and cell != "pair":
        t_at = time.monotonic() + 6
        tr = start([sys.executable, os.path.join(SRC, "mm_loop.py"), "60"], tq,
                   {"START_AT": str(t_at), "MM_PROGRESS": "1", **logged, **(service_env or {})},
                   cpus={4, 5})
        while time.monotonic() < t_at + offset:
            time.sleep(0.01)
    at = ["--start-at", str(time.monotonic() + 8)] if cell == "pair" else []
    sv = start(service_cmd(cell) + at, sq, {**logged, **(service_env or {})}, cpus={2, 3})
    if cell == "pair" and with_trainer:
        sv2 = start(service_cmd(cell) + at, tq, {**logged, **(service_env or {})}, cpus={4, 5})
        out2, err2 = sv2.communicate(timeout=300)
        if sv2.returncode != 0:
            raise RuntimeError(f"second service failed ({sv2.returncode}):\n{out2}\n{err2[-2000:]}")
    out, err = sv.communicate(timeout=300)
    if cell == "pair" and with_trainer:
        if parse(out2)["LAT"][1] > parse(out)["LAT"][1]:
            out, err, out2, err2 = out2, err2, out, err
        err += "\n--- the other service ---\n" + err2
    if LOGS:
        global _log_n
        _log_n += 1
        with open(os.path.join(LOGS, f"{_log_n:03d}-{cell}-{label or 'solo'}-service.log"), "w") as f:
            f.write(f"offset {offset} quota {sq}\n{out}\n{err}")
    tflops = None
    if tr is not None:
        tr.send_signal(signal.SIGTERM)
        tout, terr = tr.communicate(timeout=60)
        if LOGS:
            with open(os.path.join(LOGS, f"{_log_n:03d}-{cell}-{label}-trainer.log"), "w") as f:
                f.write(f"offset {offset} quota {tq}\n{tout[-3000:]}\n{terr[-5000:]}")
        t = parse(tout)
        s = parse(out)
        if "KERNELMS" in t:
            # The trainer's matmul, timed on the GPU (median of its steps).
            out += f"\nTRAINER_KERNEL_MS {t['KERNELMS']}"
        if "START" in s and t["P"]:
            a, b = s["START"] / 1e3, s["START"] / 1e3 + args.window
            pts = [x for x in t["P"] if a <= x[0] <= b]
            if len(pts) >= 2:
                n = 8192
                tflops = 2 * n ** 3 * (pts[-1][1] - pts[0][1]) / (pts[-1][0] - pts[0][0]) / 1e12
    if sv.returncode != 0:
        raise RuntimeError(f"service failed ({sv.returncode}):\n{out}\n{err[-2000:]}")
    return parse(out), tflops


rows = []


def row(*r):
    rows.append(r)
    print(" | ".join(str(x) for x in r), file=sys.stderr, flush=True)


def summary(results):
    p99 = [r["LAT"][1] for r, _ in results]
    served = [r["SERVED"][0] / r["SERVED"][1] for r, _ in results]
    tf = [t for _, t in results if t is not None]
    return p99, served, tf


def verdicts(cell, by_mode, solo_p99, starts):
    """The table's rows for the pair modes of CELL: BY_MODE maps a mode to
    its starts' (service results, trainer TFLOP/s); STARTS is the starts'
    offsets, or a dict of them per mode (merged dumps)."""
    ref = {}
    if args.native_ref:
        v = [float(x) for x in args.native_ref.split(",")]
        ref = {"p99": v[0], "served": v[1], "tf": v[2]}
    for mode in sorted(by_mode, key=lambda m: m != "native"):
        res = by_mode[mode]
        p99, served, tf = summary(res)
        med = statistics.median(p99)
        worst = max(p99)
        tf_med = statistics.median(tf) if tf else float("nan")
        tf_worst = min(tf) if tf else float("nan")
        if mode == "native":
            ref = {"p99": med, "served": statistics.median(served), "tf": tf_med}
            verdict = "reference"
        elif mode == "trainer-only":
            verdict = "diagnostic"
        elif not ref:
            # No native pair in these starts (an A/B of two builds): judged
            # against the other build (the A/B rows below), not the targets.
            verdict = "A/B only"
        else:
            ok_tail = worst <= (1.1 if cell == "decode" else 1.2) * ref["p99"]
            kernel = [r["TRAINER_KERNEL_MS"] for r, _ in res if "TRAINER_KERNEL_MS" in r]
            kernel_ms = statistics.median(kernel) if kernel else float("nan")
            lat = mode.startswith("latency")
            if lat and cell == "decode":
                ok_tail = worst <= max(0.8 * ref["p99"], 1.1 * solo_p99)
            elif lat:
                # Its solo tail plus the trainer's kernel that is running
                # when a request arrives (issue #19's bound).
                ok_tail = worst <= solo_p99 + kernel_ms
            ok_served = min(served) >= min(1.0, ref["served"]) - 1e-9
            ok_tf = cell == "pair" or tf_worst >= (0.90 if lat else 0.95) * ref["tf"]
            verdict = "PASS" if ok_tail and ok_served and ok_tf else "**FAIL**"
        offs = starts.get(mode, []) if isinstance(starts, dict) else starts
        row(cell, f"{mode}: {len(res)} starts, offsets {offs} s",
            f"p99 median {med:.2f} / worst {worst:.2f} ms"
            + (f" ({med / ref['p99']:.2f}x / {worst / ref['p99']:.2f}x native pair)" if mode != "native" and ref else ""),
            f"served worst {100 * min(served):.0f} %",
            f"trainer median {tf_med:.0f} / worst {tf_worst:.0f} TFLOP/s"
            + (f" ({100 * tf_med / ref['tf']:.0f} % / {100 * tf_worst / ref['tf']:.0f} % of native pair)"
               if mode != "native" and ref else ""),
            "per p99: " + ", ".join(f"{x:.1f}" for x in p99)
            + (f"; bound: solo p99 {solo_p99:.2f} + trainer kernel {kernel_ms:.2f} ms"
               if mode.startswith("latency") and cell == "small" and ref else ""), verdict)
    # Two builds side by side (`--lib-b`): each mode against its "-b" twin,
    # over the same starts.
    for mode in by_mode:
        twin = by_mode.get(mode + "-b")
        if mode.endswith("-b") or not twin:
            continue
        (a_p99, _, a_tf), (b_p99, _, b_tf) = summary(by_mode[mode]), summary(twin)
        row(cell, f"{mode} against {mode}-b ({len(a_p99)} / {len(b_p99)} starts)",
            f"p99 median {statistics.median(a_p99) / statistics.median(b_p99):.2f}x / worst "
            f"{max(a_p99) / max(b_p99):.2f}x",
            "", (f"trainer median {statistics.median(a_tf) / statistics.median(b_tf):.3f}x" if a_tf and b_tf else ""),
            "", "A/B")


def solo_rows(cell, solo, alone):
    """Item 3 of issue #19, a launch-bound tenant pays nothing alone: the
    service alone under each limit against `cuslice run` with no limits
    (the issue's reference) and against native, median p50 within 5 % and
    every request served. SOLO: the native starts' results; ALONE maps a
    label to its starts' results."""
    solo_p50 = statistics.median(r["LAT"][0] for r in solo)
    free = alone.get("no limits")
    free_p50 = statistics.median(r["LAT"][0] for r in free) if free else float("nan")
    for label, res in alone.items():
        p50 = statistics.median(r["LAT"][0] for r in res)
        served = min(r["SERVED"][0] / r["SERVED"][1] for r in res)
        ok = label == "no limits" or (p50 <= 1.05 * free_p50 and served >= 1.0 - 1e-9)
        row(cell, f"service alone, {label} ({len(res)} starts)",
            f"p50 {p50:.2f} ms ({p50 / solo_p50:.2f}x native"
            + (f", {p50 / free_p50:.2f}x no limits)" if label != "no limits" else ")"),
            f"served worst {100 * served:.0f} %", "",
            "p50: " + ", ".join(f"{r['LAT'][0]:.2f}" for r in res),
            "reference" if label == "no limits" else "PASS" if ok else "**FAIL**")


STARTS = [OFFSETS[i % len(OFFSETS)] for i in range(args.first_start, args.first_start + args.starts)]
if args.merge:
    # The starts of earlier invocations (--dump), together.
    dumps = []
    for f in args.merge.split(","):
        with open(f) as fh:
            dumps.append(json.load(fh))
    gpus = sorted({d["gpu"] for d in dumps})
    gpu = " / ".join(gpus)
    STARTS = [o for d in dumps for o in d["starts"]]
    args.window = "/".join(sorted({str(d.get("window")) for d in dumps}))
    cells = []
    for d in dumps:
        cells += [c for c in d["cells"] if c not in cells]
    for cell in cells:
        parts = [d["cells"][cell] for d in dumps if cell in d["cells"]]
        for setup in dict.fromkeys(d["setup"] for d in parts if d.get("setup")):
            row(cell, setup, "", "", "", "", "setup")
        solo = [r for d in parts for r in d["solo"]]
        solo_p99 = statistics.median(r["LAT"][1] for r in solo)
        if solo:
            row(cell, f"service alone, native ({len(solo)} starts)",
                f"p50 {statistics.median(r['LAT'][0] for r in solo):.2f} / p99 {solo_p99:.2f} ms", "", "",
                "p50: " + ", ".join(f"{r['LAT'][0]:.2f}" for r in solo), "reference")
        alone = {}
        for d in parts:
            for label, res in d.get("alone", {}).items():
                alone.setdefault(label, []).extend(res)
        if alone:
            solo_rows(cell, solo, alone)
        # Each mode's starts and their offsets (a mode missing from a dump
        # has none of its offsets).
        by_mode, offsets = {}, {}
        for dd in dumps:
            for mode, res in dd["cells"].get(cell, {}).get("modes", {}).items():
                by_mode.setdefault(mode, []).extend([tuple(x) for x in res])
                offsets.setdefault(mode, []).extend(dd["starts"][:len(res)])
        verdicts(cell, by_mode, solo_p99, offsets)
else:
    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip().splitlines()[0]
    dump = {"gpu": gpu, "window": args.window, "starts": STARTS, "cells": {}}
    for cell in args.cells.split(","):
        probe = parse(subprocess.run(service_cmd(cell) + ["--seconds", "0.5"], capture_output=True,
                                     text=True).stdout)
        if "SKIP" in probe:
            row(cell, "all", probe["SKIP"], "", "", "", "SKIP")
            continue
        d = dump["cells"][cell] = {"setup": "", "solo": [], "alone": {}, "modes": {}}
        CUR_LIB = LIB
        if cell == "decode" and args.decode_period_ms <= 0:
            # One request at a time, far apart: how long a request takes alone.
            r = parse(subprocess.run([sys.executable, os.path.join(SRC, "decode_probe.py"), "--seconds", "3",
                                      "--period-ms", "1000"], capture_output=True, text=True).stdout)
            args.decode_period_ms = max(50.0, 10.0 * round(2 * r["LAT"][0] / 10.0))
            d["setup"] = (f"request period {args.decode_period_ms:.0f} ms (twice the solo request time, "
                          f"{r['LAT'][0]:.1f} ms)")
            row(cell, d["setup"], "", "", "", "", "setup")
        if args.native_ref:
            v = [float(x) for x in args.native_ref.split(",")]
            solo_p99 = v[3] if len(v) > 3 else float("nan")
            row(cell, "native pair and solo: from an earlier invocation on this machine", f"p99 median {v[0]:.2f} ms",
                f"served {100 * v[1]:.0f} %", f"trainer median {v[2]:.0f} TFLOP/s", f"solo p99 {solo_p99:.2f}",
                "reference")
        else:
            solo = d["solo"] = [one(cell, 0, None, None, with_trainer=False)[0] for _ in range(3)]
            solo_p99 = statistics.median(r["LAT"][1] for r in solo)
            solo_p50 = statistics.median(r["LAT"][0] for r in solo)
            row(cell, "service alone, native (3 starts)", f"p50 {solo_p50:.2f} / p99 {solo_p99:.2f} ms", "", "",
                "p50: " + ", ".join(f"{r['LAT'][0]:.2f}" for r in solo), "reference")
            if "solo" in args.modes:
                # Alone under cuslice, each limit in turn within each round
                # (a drift of the host falls on all alike).
                kinds = (("no limits", "", "", None), ("compute 50", "compute = 50", "", None),
                         ("compute 50, latency", "compute = 50", "latency = true", None))
                for _ in range(3):
                    for label, limits, top, env in kinds:
                        d["alone"].setdefault(label, []).append(
                            one(cell, 0, quota(limits, top), None, with_trainer=False, service_env=env,
                                label="alone")[0])
                solo_rows(cell, solo, d["alone"])
        pair_modes = [m for m in args.modes.split(",") if m != "solo"]
        # Start-major: each start's offset is run in every mode in turn (the
        # order rotating), so that a drift of the host over the invocation
        # falls on every mode alike.
        by_mode = {m: [] for m in pair_modes}
        for i, off in enumerate(STARTS, start=args.first_start):
            k = i % len(pair_modes) if pair_modes else 0
            for mode in pair_modes[k:] + pair_modes[:k]:
                base = mode
                if mode.endswith("-b"):
                    if LIB_B is None:
                        sys.exit(f"mode {mode!r} needs --lib-b")
                    base = mode[:-2]
                CUR_LIB = LIB_B if base != mode else LIB
                if base == "native":
                    sq = tq = None
                elif base == "standard":
                    sq, tq = quota("compute = 50"), quota("compute = 50")
                elif base == "trainer-only":
                    # The trainer under cuslice, the service native: what the
                    # trainer's own limiter does to the service.
                    sq, tq = None, quota("compute = 50")
                elif base in ("latency", "latency-detach"):
                    sq, tq = quota("compute = 50", "latency = true"), quota("compute = 50")
                elif base in ("nometer", "detach", "attached"):
                    sq, tq = quota("compute = 50"), quota("compute = 50")
                else:
                    sys.exit(f"unknown mode {mode!r}")
                env = {"nometer": {"CUSLICE_CUPTI": "off"},
                       "detach": {"CUSLICE_METER_DETACH": "1"}, "attached": {"CUSLICE_METER_DETACH": "0"},
                       "latency-detach": {"CUSLICE_METER_DETACH": "1"}}.get(base)
                by_mode[mode].append(one(cell, off, sq, tq, service_env=env, label=mode))
                r, tf = by_mode[mode][-1]
                print(f"start {i} {mode} offset {off}: p50 {r['LAT'][0]:.2f} p99 {r['LAT'][1]:.2f} ms, served "
                      f"{r['SERVED'][0]:.0f}/{r['SERVED'][1]:.0f}, trainer {tf} TFLOP/s", file=sys.stderr,
                      flush=True)
                d["modes"] = by_mode
                dump["decode_period_ms"] = args.decode_period_ms
                if args.dump:
                    # After every start: a call cut off at its time limit
                    # keeps what it measured.
                    with open(args.dump, "w") as fh:
                        json.dump(dump, fh)
        if pair_modes:
            verdicts(cell, by_mode, solo_p99, STARTS)
    if args.dump:
        with open(args.dump, "w") as fh:
            json.dump(dump, fh)

print(f"# Co-location in several starts on {gpu}\n")
print(f"Command: `python3 scripts/gpu/colo_starts.py {' '.join(sys.argv[1:])}`; the service starts {STARTS} s "
      f"after the trainer's work begins (one start per offset and mode); each service window {args.window} s.\n")
print("Targets (issue #19): standard class, small service: every start p99 <= 1.2x the native pair's median, all served, "
      "trainer >= 95 %; decode: p99 <= 1.1x, served >= native, trainer >= 95 %; latency class: decode p99 <= "
      "max(0.8x native pair, 1.1x solo), small p99 <= solo p99 + the trainer's kernel, trainer >= 90 %; pair (two small "
      "services, no trainer): every start p99 <= 1.2x the native pair's median.\n")
print("| cell | run | service p99 | served | trainer | each start's p99 (ms) | verdict |")
print("|---|---|---|---|---|---|---|")
for r in rows:
    print("| " + " | ".join(str(x) for x in r) + " |")
