"""Overhead of `trainprobe diagnose` on a running job, as a ratio measured in one run.

One workload runs throughout. Windows alternate: W seconds with nothing attached, then W seconds
with `trainprobe diagnose --duration W` attached (default settings). The job's steps/s in each
attached window is divided by the mean of the detached windows on either side of it, so slow drift
of the machine cancels. Prints each pair and the mean slowdown.

    .venv/bin/python benchmarks/bench_overhead.py [--pairs 6] [--window 10] [-- workload args]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time

from _common import Workload, trainprobe


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("--window", type=float, default=10.0)
    ap.add_argument("--rate", type=int, default=None, help="py-spy rate for diagnose (default: its default)")
    ap.add_argument("--diagnose-args", default="", help="extra arguments for diagnose, e.g. '--skip sched'")
    ap.add_argument("workload", nargs="*", default=["--num-workers", "0"])
    a = ap.parse_args()
    w = Workload(*a.workload)
    w.wait_ready()
    time.sleep(2)
    detached: list[float] = []
    attached: list[float] = []
    try:
        t0 = time.time()
        time.sleep(a.window)
        detached.append(w.rate(t0, time.time()))
        for i in range(a.pairs):
            extra = (["--rate", str(a.rate)] if a.rate else []) + a.diagnose_args.split()
            box = {}
            th = threading.Thread(target=lambda: box.update(r=trainprobe("diagnose", "--pid", str(w.pid), "--duration",
                                                                         str(a.window), "--json", *extra)))
            t0 = time.time()
            th.start()
            th.join()
            t1 = time.time()
            # The window proper: from py-spy's start to its end (the CLI's own start-up excluded).
            attached.append(w.rate(t0 + 0.5, t1))
            t0 = time.time()
            time.sleep(a.window)
            detached.append(w.rate(t0, time.time()))
            ratio = attached[-1] / statistics.mean(detached[-2:])
            print(f"pair {i + 1}: detached {statistics.mean(detached[-2:]):7.2f} steps/s, "
                  f"attached {attached[-1]:7.2f} steps/s, ratio {ratio:.4f}", flush=True)
    finally:
        w.stop()
    ratios = [attached[i] / statistics.mean(detached[i:i + 2]) for i in range(len(attached))]
    print(f"\nworkload: {' '.join(a.workload)}; diagnose {a.diagnose_args or '(defaults)'}; "
          f"{a.pairs} interleaved pairs of {a.window:g} s windows")
    print(f"steps/s with diagnose attached / without: mean {statistics.mean(ratios):.4f}, "
          f"median {statistics.median(ratios):.4f}, min {min(ratios):.4f}, max {max(ratios):.4f}")
    print(f"slowdown: {100 * (1 - statistics.mean(ratios)):.2f}% (mean), {100 * (1 - statistics.median(ratios)):.2f}% (median)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
