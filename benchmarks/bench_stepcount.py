#!/usr/bin/env python3
"""What the backward-pass counter (probes/support/stepcount.py) costs the job it counts.

A loop of the smallest steps torch makes (a 64x64 linear layer, batch 32, one intra-op thread,
backward as fast as it goes: thousands a second, each one a hit of the uprobe) is timed in
alternating windows with the counter open and closed; the ratio of its rates is the counter's
effect at that hit rate, and (1/rate_on - 1/rate_off) the cost of one hit. A training job makes
tens to hundreds of backward passes a second. Also reports the counter's own start (finding the
function in libtorch_cpu.so's symbol table, opening the events) and its count against the loop's.

    python benchmarks/bench_stepcount.py [--pairs 8] [--window 2] [--out DIR]    (root)
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from trainprobe.probes.support import stepcount  # noqa: E402

LOOP = r"""
import os, sys, time, torch
torch.set_num_threads(1)
m = torch.nn.Linear(64, 64); x = torch.randn(32, 64)
out = sys.argv[1]
n, last = 0, time.time()
while True:
    m(x).sum().backward()
    n += 1
    if n % 200 == 0:
        t = time.time()
        if t - last >= 0.05:
            with open(out + ".tmp", "w") as f:
                f.write(f"{t} {n}")
            os.replace(out + ".tmp", out)
            last = t
"""


def progress(path: str) -> tuple[float, int]:
    while True:
        try:
            t, n = open(path).read().split()
            return float(t), int(n)
        except (OSError, ValueError):
            time.sleep(0.01)


def rate(path: str, seconds: float) -> float:
    t0, n0 = progress(path)
    time.sleep(seconds)
    t1, n1 = progress(path)
    return (n1 - n0) / (t1 - t0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=8)
    ap.add_argument("--window", type=float, default=2.0)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    path = f"/tmp/trainprobe-bench-stepcount-{os.getpid()}"
    p = subprocess.Popen([sys.executable, "-c", LOOP, path])
    try:
        progress(path)
        time.sleep(2.0)
        maps = open(f"/proc/{p.pid}/maps").read()
        tids = [int(t) for t in os.listdir(f"/proc/{p.pid}/task")]
        c0 = time.process_time()
        stepcount.symbol_offset(stepcount.library_path(maps))
        resolve_ms = 1000 * (time.process_time() - c0)
        pairs, counts = [], []
        for i in range(a.pairs):
            order = ("off", "on") if i % 2 == 0 else ("on", "off")
            r = {}
            for mode in order:
                if mode == "on":
                    c0 = time.process_time()
                    c = stepcount.start(tids, maps)
                    open_ms = 1000 * (time.process_time() - c0)
                    if c.reason:
                        print("counter unavailable:", c.reason)
                        return 1
                    t0, n0 = progress(path)
                    r["on"] = rate(path, a.window)
                    t1, n1 = progress(path)
                    got = stepcount.read(c)
                    counts.append((sum(got["calls"].values()), n1 - n0, open_ms))
                else:
                    r["off"] = rate(path, a.window)
            pairs.append(r)
            print(f"pair {i}: off {r['off']:.0f}/s, on {r['on']:.0f}/s, on/off {r['on'] / r['off']:.4f}", flush=True)
    finally:
        p.kill()
        p.wait()
        for f in (path, path + ".tmp"):
            try:
                os.unlink(f)
            except OSError:
                pass
    ratios = [x["on"] / x["off"] for x in pairs]
    logs = [math.log(x) for x in ratios]
    mean = statistics.fmean(logs)
    se = statistics.stdev(logs) / len(logs) ** 0.5 if len(logs) > 1 else 0.0
    off = statistics.median(x["off"] for x in pairs)
    on = statistics.median(x["on"] for x in pairs)
    hit_us = 1e6 * (1.0 / on - 1.0 / off)
    res = {"pairs": pairs, "ratio_geomean": round(math.exp(mean), 4),
           "ratio_95": [round(math.exp(mean - 2 * se), 4), round(math.exp(mean + 2 * se), 4)],
           "rate_off": round(off, 1), "rate_on": round(on, 1), "hit_us": round(hit_us, 2),
           "resolve_cpu_ms": round(resolve_ms, 2), "counted_vs_loop": counts}
    print(f"on/off {res['ratio_geomean']} (95% {res['ratio_95'][0]}-{res['ratio_95'][1]}) at {off:.0f} backward "
          f"passes a second: {hit_us:.2f} us a hit; symbol lookup {resolve_ms:.1f} ms of CPU; counted/loop's own "
          + ", ".join(f"{c}/{n}" for c, n, _ in counts[:4]))
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "stepcount.json"), "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
