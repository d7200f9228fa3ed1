"""Overhead of the perf stat probe on a running job, as a ratio measured in one run.

One workload (the bundled CPU job with DataLoader workers) runs throughout. Windows alternate:
W seconds with nothing attached, then W seconds with the perfstat probe attached to the job and its
workers (exactly as `diagnose` runs it). Each attached window's steps/s is divided by the mean of
the detached windows on either side, so slow drift of the machine cancels. Also prints perf's own
CPU time per window and how many counter readings it took.

    .venv/bin/python benchmarks/bench_perfstat.py [--pairs 5] [--window 6] [-- workload args]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from trainprobe.agent.session import run_session  # noqa: E402
from trainprobe.probes.base import WatchSpec  # noqa: E402
from trainprobe.probes.perfstat import PerfStatProbe  # noqa: E402
from _common import Workload  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--window", type=float, default=6.0)
    ap.add_argument("workload", nargs="*", default=["--num-workers", "1", "--persistent-workers",
                                                    "--sample-work", "3000"])
    a = ap.parse_args()
    job = Workload(*a.workload)
    job.wait_ready()
    time.sleep(2)
    detached: list[float] = []
    attached: list[float] = []
    perf_cpu: list[float] = []
    try:
        t0 = time.time()
        time.sleep(a.window)
        detached.append(job.rate(t0, time.time()))
        for i in range(a.pairs):
            t0 = time.time()
            res = run_session(WatchSpec(pid=job.proc.pid, window_s=a.window), [PerfStatProbe()],
                              progress=lambda m: None)
            t1 = time.time()
            cap = res.captures[0]
            if cap.status != "ok":
                print(f"perfstat did not run: {cap.status} {cap.reason}")
                return 1
            ev = PerfStatProbe.parse(cap)
            rows = sum(s.get("rows", 0) for s in ev["sessions"].values())
            perf_cpu.append(cap.meta["overhead"]["perf_cpu_seconds"])
            attached.append(job.rate(t0, t1))
            t0 = time.time()
            time.sleep(a.window)
            detached.append(job.rate(t0, time.time()))
            ratio = attached[-1] / statistics.mean(detached[-2:])
            print(f"pair {i + 1}: detached {statistics.mean(detached[-2:]):7.2f} steps/s, attached "
                  f"{attached[-1]:7.2f} steps/s, ratio {ratio:.4f}; perf CPU {perf_cpu[-1]:.2f} s, "
                  f"{rows} counter readings", flush=True)
    finally:
        job.stop()
    ratios = [attached[i] / statistics.mean(detached[i:i + 2]) for i in range(len(attached))]
    print(f"\nworkload: {' '.join(a.workload)}; {a.pairs} interleaved pairs of {a.window:g} s windows; "
          f"hardware counters: {ev['hardware']['available']}")
    print(f"steps/s with perfstat attached / without: mean {statistics.mean(ratios):.4f}, "
          f"median {statistics.median(ratios):.4f}, min {min(ratios):.4f}, max {max(ratios):.4f}")
    print(f"perf's own CPU per {a.window:g} s window: mean {statistics.mean(perf_cpu):.3f} s "
          f"({100 * statistics.mean(perf_cpu) / a.window:.2f}% of one core)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
