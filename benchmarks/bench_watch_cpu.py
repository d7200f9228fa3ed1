"""Steady-state CPU of `trainprobe watch` following a live training job, scraped like Prometheus.

Starts the bundled workload (a loop that waits on one DataLoader worker), starts `watch` on it
(default 5 s interval, endpoint on localhost, scraped every 15 s, textfile written each sample, no
triggered diagnosis), lets it warm up, then reads the watch process's CPU time (/proc/PID/stat)
over the measured window (schedstat, and utime+stime for comparison). Prints CPU-seconds per hour
and the share of one core.

    .venv/bin/python benchmarks/bench_watch_cpu.py [--seconds 180] [--interval 5] [--all] [--json OUT]
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from _common import PY, REPO, Workload

TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    text = Path(f"/proc/{pid}/stat").read_text()
    rest = text[text.rindex(")") + 2:].split()
    return (int(rest[11]) + int(rest[12])) / TICK


def run_s(pid: int) -> float:
    """CPU time from the scheduler's own clock (nanoseconds, summed over threads): tick-sampled
    utime/stime charge a whole tick to whoever runs when it fires, which misstates a process that
    only wakes briefly."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            total += int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return total / 1e9


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=180.0)
    ap.add_argument("--warmup", type=float, default=20.0)
    ap.add_argument("--interval", type=float, default=5.0)
    ap.add_argument("--all", action="store_true", help="follow every training process on the host, not only ours")
    ap.add_argument("--json", dest="out", default=None)
    a = ap.parse_args()
    w = Workload("--num-workers", "1", "--sample-work", "3000", "--width", "256", "--depth", "1")
    w.wait_ready()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    tmp = tempfile.mkdtemp(prefix="trainprobe-watch-bench-")
    argv = [PY, "-m", "trainprobe.agent", "-q", "watch", "--listen", f"127.0.0.1:{port}", "--interval", str(a.interval),
            "--textfile", os.path.join(tmp, "watch.prom"), "--no-diagnose"]
    if not a.all:
        argv += ["--pid", str(w.pid)]
    wp = subprocess.Popen(argv, cwd=REPO)
    try:
        time.sleep(a.warmup)
        c0, r0, t0 = cpu_s(wp.pid), run_s(wp.pid), time.monotonic()
        scrapes = 0
        while time.monotonic() - t0 < a.seconds:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
            scrapes += 1
            time.sleep(15)
        c1, r1, t1 = cpu_s(wp.pid), run_s(wp.pid), time.monotonic()
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        jobs = next((ln.split()[-1] for ln in text.splitlines() if ln.startswith("trainprobe_watch_training_jobs ")), "?")
    finally:
        wp.terminate()
        wp.wait(timeout=20)
        w.stop()
    share = (r1 - r0) / (t1 - t0)
    res = {"interval_s": a.interval, "measured_s": round(t1 - t0, 1), "scrapes": scrapes, "jobs_followed": jobs,
           "cpu_seconds_schedstat": round(r1 - r0, 3), "cpu_seconds_ticks": round(c1 - c0, 3),
           "cpu_seconds_per_hour": round(share * 3600, 1), "share_of_one_core_pct": round(100 * share, 3)}
    print(json.dumps(res))
    if a.out:
        Path(a.out).write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
