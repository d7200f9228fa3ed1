"""What the process probe's CPU-clock sampler costs the job it samples, per sample.

Each sample of `probes/support/oncpu.py` is a timer interrupt in the sampled thread: the job pays it,
not the agent, and an intra-op team pays it at its next barrier, whichever member was interrupted.
This benchmark starts a job shaped like a loop that loads its own batches (small parallel tensor ops
on `--threads` intra-op threads between stretches of Python), then interleaves untouched windows with
windows where the sampler is open on every thread of the job at each `--periods` entry (ms; the
process probe samples at 10), D A1 D A2 ... until `--time-budget` is spent. Each attached window's steps/s is divided by the mean of its two untouched
neighbours. Per arm: the mean ratio with its 95% interval, the samples a second, and the job's wall
time lost per sample (us): (1 - ratio) / samples a second.

    python benchmarks/bench_oncpu_cost.py --threads 2 --periods 1,10 --window 2 --time-budget 240

On the GPU node, `--threads 16`. Prints one line per arm; `--out FILE` keeps every window as JSON.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from trainprobe.probes.parsers import procfs  # noqa: E402
from trainprobe.probes.support import oncpu  # noqa: E402

JOB = r"""
import sys, time, torch
torch.set_num_threads(int(sys.argv[1]))
x = torch.rand(3, 224, 224)
m = torch.tensor([0.5, 0.5, 0.5]).view(3, 1, 1)
out = open(sys.argv[2], "w", buffering=1)
n = 0
while True:
    for _ in range(8):
        y = (x * 255).to(torch.uint8).float().div(255).sub(m).div(m)   # parallel regions
        s = sum(i * i for i in range(400))                              # the loop's own Python
    n += 1
    out.write(f"{time.time():.6f} {n}\n")
"""


class Job:
    def __init__(self, threads: int):
        self.log = Path(tempfile.mkdtemp(prefix="trainprobe-oncpu-")) / "steps.log"
        self.proc = subprocess.Popen([sys.executable, "-c", JOB, str(threads), str(self.log)])

    def steps_at(self, t: float) -> tuple[float, int] | None:
        last = None
        if not self.log.exists():
            return None
        with open(self.log) as f:
            for line in f:
                parts = line.split()
                if len(parts) == 2 and float(parts[0]) <= t:
                    last = (float(parts[0]), int(parts[1]))
        return last

    def rate(self, t0: float, t1: float) -> float:
        a, b = self.steps_at(t0), self.steps_at(t1)
        return (b[1] - a[1]) / (b[0] - a[0]) if a and b and b[0] > a[0] else float("nan")

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


def attached(job: Job, window: float, period_ns: int) -> dict:
    pid = job.proc.pid
    maps = procfs.try_read_text("/", f"proc/{pid}/maps") or ""
    tids = [int(t) for t in procfs.thread_ids("/", pid)]
    s = oncpu.start(tids, maps, window, period_ns)
    t0 = time.time()
    time.sleep(window)
    t1 = time.time()
    got = oncpu.read(s) if not s.reason else {"threads": {}, "lost": 0}
    n = sum(v[0] for v in got["threads"].values())
    return {"t0": t0, "t1": t1, "rate": job.rate(t0, t1), "samples": n, "samples_per_s": n / (t1 - t0),
            "lost": got["lost"], "period_ms": period_ns / 1e6, "reason": s.reason}


def detached(job: Job, window: float) -> dict:
    t0 = time.time()
    time.sleep(window)
    t1 = time.time()
    return {"t0": t0, "t1": t1, "rate": job.rate(t0, t1)}


def summary(ws: list[dict]) -> dict:
    logs = [math.log(w["ratio"]) for w in ws if w.get("ratio")]
    if len(logs) < 2:
        return {"pairs": len(logs)}
    m, sd = statistics.fmean(logs), statistics.stdev(logs)
    h = 2.0 * sd / math.sqrt(len(logs))
    rate = statistics.fmean(w["samples_per_s"] for w in ws)
    loss = 1.0 - math.exp(m)
    return {"pairs": len(logs), "ratio": round(math.exp(m), 4),
            "ci95": [round(math.exp(m - h), 4), round(math.exp(m + h), 4)], "sd_log": round(sd, 4),
            "samples_per_s": round(rate, 1), "period_ms": ws[0]["period_ms"],
            "us_per_sample": round(1e6 * loss / rate, 1) if rate > 0 else None,
            "us_per_sample_ci95": [round(1e6 * (1.0 - math.exp(m + h)) / rate, 1),
                                   round(1e6 * (1.0 - math.exp(m - h)) / rate, 1)] if rate > 0 else None}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--periods", default="1,10", help="ms, comma-separated")
    ap.add_argument("--window", type=float, default=2.0)
    ap.add_argument("--time-budget", type=float, default=240.0)
    ap.add_argument("--warmup", type=float, default=4.0)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    job = Job(a.threads)
    try:
        t_end = time.monotonic() + 120
        while job.steps_at(time.time()) is None and time.monotonic() < t_end:   # torch imported, stepping
            time.sleep(0.2)
        time.sleep(a.warmup)
        arms = [(p.strip(), int(float(p) * 1e6)) for p in a.periods.split(",") if p.strip()]
        print(f"job: {a.threads} intra-op threads; periods " + ", ".join(f"{ns / 1e6:g} ms" for _n, ns in arms),
              flush=True)
        seq = [dict(detached(job, a.window), arm="detached")]
        deadline = time.monotonic() + a.time_budget
        i = 0
        while time.monotonic() + 2 * a.window + 1 < deadline:
            name, ns = arms[i % len(arms)]
            i += 1
            att = dict(attached(job, a.window, ns), arm=name)
            seq += [att, dict(detached(job, a.window), arm="detached")]
            base = statistics.fmean([seq[-3]["rate"], seq[-1]["rate"]])
            att["ratio"] = att["rate"] / base if base > 0 and math.isfinite(att["rate"]) else None
        res = {name: summary([w for w in seq if w["arm"] == name]) for name, _ in arms}
        for name, r in res.items():
            print(f"{name:>5}: {json.dumps(r)}", flush=True)
        if a.out:
            Path(a.out).write_text(json.dumps({"args": vars(a), "arms": res,
                                               "windows": seq}, indent=1))
    finally:
        job.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
