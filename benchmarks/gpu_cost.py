"""The agent's cost on a GPU node, against a real training script (benchmarks/gpu_cost_job.py:
torchvision resnet18 on FakeData through real DataLoader workers, or resnet50 compute-bound), one
command, JSON results under a directory. See docs/cost.md.

    PYTHONPATH=$REPO python3 benchmarks/gpu_cost.py --out $OUT/cost \\
        [--cases data:14,compute:14,data:0] [--pairs 5] [--window 10] [--full-runs 2]

Each case: start the job, wait for its steps/s to settle, then `--pairs` alternating pairs
(untouched window, `trainprobe diagnose` window with default planned sampling), then `--full-runs`
windows at full sampling (`--rate 25`: one py-spy over every process). Prints one summary line per
case; gpu_cost.json has every window. py-spy must be installed (a wheel carried to the node).
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path

from _cost_bench import REPO, run_case, summary_line

JOB = Path(__file__).resolve().parent / "gpu_cost_job.py"


class Job:
    def __init__(self, variant: str, workers: int, cmd: str | None = None):
        env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONWARNINGS="ignore")
        argv = ([sys.executable, str(JOB), "--variant", variant, "--workers", str(workers)] if not cmd
                else shlex.split(cmd.format(variant=variant, workers=workers, python=sys.executable)))
        self.proc = subprocess.Popen(argv,
                                     cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        self.points: list[tuple[float, int]] = []
        self.tail: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for line in self.proc.stdout:
            if line.startswith("PROGRESS"):
                kv = dict(x.split("=", 1) for x in line.split()[1:])
                self.points.append((float(kv["t"]), int(kv["steps"])))
            else:
                self.tail = (self.tail + [line.rstrip()])[-20:]

    @property
    def pid(self) -> int:
        return self.proc.pid

    def rate(self, t0: float, t1: float) -> float:
        pts = [p for p in self.points if t0 <= p[0] <= t1]
        if len(pts) < 2:
            return float("nan")
        (a, na), (b, nb) = pts[0], pts[-1]
        return (nb - na) / (b - a)

    def settle(self, warm_s: float, timeout: float = 180.0) -> None:
        t = time.monotonic()
        while len(self.points) < 2:
            if self.proc.poll() is not None or time.monotonic() - t > timeout:
                raise RuntimeError("job failed to start: " + " | ".join(self.tail[-5:]))
            time.sleep(0.2)
        time.sleep(warm_s)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "out") + "/cost", help="directory for gpu_cost.json")
    ap.add_argument("--cases", default="data:14,compute:14,data:0",
                    help="VARIANT:WORKERS, comma-separated (variants: data, compute)")
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--window", type=float, default=10.0)
    ap.add_argument("--full-runs", type=int, default=2)
    ap.add_argument("--warmup", type=float, default=12.0, help="seconds after the first progress line")
    ap.add_argument("--time-budget", type=float, default=520.0, help="start no new case after this many seconds")
    ap.add_argument("--agent-args", default="",
                    help="extra `trainprobe diagnose` arguments for the attached windows (e.g. '--skip pyspy')")
    ap.add_argument("--job-cmd", default=None,
                    help="another job printing `PROGRESS t= steps=` lines ({python}, {variant}, {workers} filled in): "
                         "to try the harness without a GPU")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.monotonic()
    results = []
    for case in [c.strip() for c in a.cases.split(",") if c.strip()]:
        if time.monotonic() - t_start > a.time_budget:
            print(f"time budget spent: case {case} not run", file=sys.stderr)
            continue
        variant, workers = case.split(":")
        job = Job(variant, int(workers), a.job_cmd)
        try:
            job.settle(a.warmup)
            r = run_case(f"{variant}-w{workers}" + (f" [{a.agent_args}]" if a.agent_args else ""), job.pid, job.rate,
                         a.window, a.pairs, a.full_runs, shlex.split(a.agent_args),
                         lambda m: print(m, file=sys.stderr, flush=True))
        except RuntimeError as exc:
            r = {"case": case, "error": str(exc)}
            print(f"{case}: {exc}", file=sys.stderr)
        finally:
            job.stop()
        results.append(r)
        (out / "gpu_cost.json").write_text(json.dumps({"machine": "gpu", "args": vars(a), "cases": results}, indent=1))
    print(f"\n{a.pairs} alternating pairs of {a.window:g} s windows per case ({time.monotonic() - t_start:.0f} s); "
          f"results in {out / 'gpu_cost.json'}")
    for r in results:
        print(summary_line(r) if "error" not in r else f"{r['case']}: {r['error']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
