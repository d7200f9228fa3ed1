"""Wall time of `trainprobe diagnose --duration 10` from start to printed report.

    .venv/bin/python benchmarks/bench_time_to_verdict.py [--runs 3] [--duration 10]
"""
from __future__ import annotations

import argparse
import sys
import time

from _common import Workload, summarize, trainprobe


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--duration", type=float, default=10.0)
    a = ap.parse_args()
    w = Workload("--num-workers", "1", "--persistent-workers")
    w.wait_ready()
    walls = []
    try:
        for i in range(a.runs):
            t = time.monotonic()
            r = trainprobe("diagnose", "--pid", str(w.pid), "--duration", str(a.duration))
            walls.append(time.monotonic() - t)
            assert r.returncode == 0, r.stderr
            print(f"run {i + 1}: {walls[-1]:.2f} s (window {a.duration:g} s; overhead {walls[-1] - a.duration:.2f} s)")
    finally:
        w.stop()
    print(f"time to verdict for a {a.duration:g} s window: {summarize(walls)} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
