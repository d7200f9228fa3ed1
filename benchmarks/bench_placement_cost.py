"""What the topology and placement probes cost, as figures measured in one run.

1. CPU seconds the two probes spend per window on a running job (the bundled CPU workload with
   DataLoader workers), and how many /proc files placement reads.
2. How long one read of /proc/PID/numa_maps takes as the target's resident memory grows (the kernel
   walks the page tables: this is placement's only cost that grows with the job).
3. The job's steps/s with placement sampling it, over the steps/s without, in interleaved windows
   (so slow drift of a shared machine cancels).

    python benchmarks/bench_placement_cost.py [--window 4] [--pairs 4] [--sizes-mb 256,1024,2048]
"""
from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from trainprobe.probes.base import Capture, Recorder, WatchSpec  # noqa: E402
from trainprobe.probes.placement import PlacementProbe  # noqa: E402
from trainprobe.probes.topology import TopologyProbe  # noqa: E402
from _common import Workload  # noqa: E402

PY = sys.executable


def cpu_self() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def run_probe(probe, pid: int, window_s: float) -> tuple[Capture, float, float]:
    cap = Capture(probe.name)
    c0, t0 = cpu_self(), time.monotonic()
    probe.capture(WatchSpec(pid=pid, window_s=window_s), Recorder(cap, threading.Event()), time.monotonic() + window_s)
    probe.parse(cap)
    return cap, cpu_self() - c0, time.monotonic() - t0


def numa_maps_read_s(size_mb: int, repeats: int = 5) -> tuple[float, int]:
    holder = subprocess.Popen([PY, "-c", f"import sys,time; b=bytearray({size_mb}<<20); b[::4096]=b'x'*len(b[::4096]); "
                                         "print('ready', flush=True); time.sleep(600)"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            with open(f"/proc/{holder.pid}/numa_maps") as fh:
                n = len(fh.read())
            times.append(time.perf_counter() - t0)
        return statistics.median(times), n
    finally:
        holder.kill()
        holder.wait()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--window", type=float, default=4.0)
    ap.add_argument("--pairs", type=int, default=4)
    ap.add_argument("--sizes-mb", default="256,1024,2048")
    a = ap.parse_args()

    job = Workload("--num-workers", "2", "--persistent-workers")
    try:
        while len(job.points) < 4:
            if job.proc.poll() is not None:
                raise SystemExit("the workload did not start")
            time.sleep(0.1)
        time.sleep(1.0)
        print(f"1. probe cost per {a.window:g} s window on the workload (PID {job.proc.pid}, 2 DataLoader workers)")
        for probe in (TopologyProbe(), PlacementProbe()):
            cap, cpu_s, wall_s = run_probe(probe, job.proc.pid, a.window)
            reads = cap.meta.get("overhead", {}).get("proc_reads")
            print(f"   {probe.name:<9} {cpu_s:.3f} CPU-s over {wall_s:.2f} s wall = {100 * cpu_s / wall_s:.2f}% of one core"
                  + (f"; {reads} /proc reads in {cap.meta['overhead']['samples']} samples" if reads else ""))

        print("3. the job's steps/s with placement sampling it / without (interleaved windows)")
        ratios = []
        t0 = time.time()
        time.sleep(a.window)
        before = job.rate(t0, time.time())
        for i in range(a.pairs):
            t0 = time.time()
            run_probe(PlacementProbe(), job.proc.pid, a.window)
            with_probe = job.rate(t0, time.time())
            t0 = time.time()
            time.sleep(a.window)
            after = job.rate(t0, time.time())
            ratios.append(with_probe / statistics.mean([before, after]))
            print(f"   pair {i + 1}: without {statistics.mean([before, after]):7.2f} steps/s, with {with_probe:7.2f}, "
                  f"ratio {ratios[-1]:.4f}")
            before = after
        print(f"   mean ratio {statistics.mean(ratios):.4f}, median {statistics.median(ratios):.4f}")
    finally:
        job.stop()

    print("2. one read of /proc/PID/numa_maps against the target's resident memory")
    for size in (int(x) for x in a.sizes_mb.split(",")):
        secs, chars = numa_maps_read_s(size)
        print(f"   {size:6d} MB resident: {1000 * secs:7.2f} ms ({chars} chars), {1000 * secs / (size / 1024):.2f} ms per GB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
