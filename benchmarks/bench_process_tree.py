"""What one listing of a job's process tree costs: the kernel's child lists (what
probes.parsers.procfs.descendants_of reads) against psutil's children(recursive=True), which reads the stat
file of every process on the host. The process probe lists the tree every 0.5 s and the eBPF
probes every 0.25 s, so the listing's cost is paid 2-4 times a second.

Interleaved repetitions in one run, so drift of a shared machine cancels:

    python benchmarks/bench_process_tree.py [--workers 4] [--reps 50]
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

import psutil

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from trainprobe.probes.parsers import procfs  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--reps", type=int, default=50)
    a = ap.parse_args()
    job = subprocess.Popen([sys.executable, "-c",
                            f"import subprocess, sys, time\n"
                            f"k = [subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])"
                            f" for _ in range({a.workers})]\nprint('ready', flush=True)\ntime.sleep(600)"],
                           stdout=subprocess.PIPE, text=True)
    try:
        assert job.stdout is not None and job.stdout.readline().strip() == "ready"
        kernel, scan = [], []
        for _ in range(a.reps):
            t = time.perf_counter()
            tree = procfs.descendants_of(job.pid)
            kernel.append(time.perf_counter() - t)
            t = time.perf_counter()
            kids = psutil.Process(job.pid).children(recursive=True)
            scan.append(time.perf_counter() - t)
        assert {p for p, _ in tree} == {k.pid for k in kids}
        k, s = statistics.median(kernel), statistics.median(scan)
        print(f"processes on the host: {len(psutil.pids())}; the job: 1 + {len(tree)}")
        print(f"kernel child lists (descendants_of): median {k * 1e3:.3f} ms per listing")
        print(f"psutil children(recursive=True):     median {s * 1e3:.3f} ms per listing")
        print(f"ratio psutil / kernel lists: {s / k:.1f}x")
    finally:
        for c in psutil.Process(job.pid).children(recursive=True):
            c.kill()
        job.kill()
        job.wait()


if __name__ == "__main__":
    main()
