"""Helpers shared by the benchmarks: start the bundled workload, read its progress, time windows."""
from __future__ import annotations

import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PY = sys.executable


class Workload:
    """The bundled CPU workload, running until stopped; progress lines carry (unix time, steps)."""

    def __init__(self, *args: str):
        env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONWARNINGS="ignore")
        self.proc = subprocess.Popen([PY, "-m", "trainprobe.agent.workloads.train_cpu", "--seconds", "0",
                                      "--report-every", "0.5", *args],
                                     cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        self.points: list[tuple[float, int]] = []
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for line in self.proc.stdout:
            if line.startswith("PROGRESS"):
                kv = dict(x.split("=", 1) for x in line.split()[1:])
                self.points.append((float(kv["t"]), int(kv["steps"])))

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_ready(self, n: int = 4, timeout: float = 120) -> None:
        t = time.monotonic()
        while len(self.points) < n:
            if self.proc.poll() is not None or time.monotonic() - t > timeout:
                raise RuntimeError("workload failed to start")
            time.sleep(0.1)

    def rate(self, t0: float, t1: float) -> float:
        pts = [p for p in self.points if t0 <= p[0] <= t1]
        (a, na), (b, nb) = pts[0], pts[-1]
        return (nb - na) / (b - a)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def trainprobe(*args: str, capture: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "trainprobe.agent", *args], cwd=REPO, capture_output=capture, text=True,
                          env=dict(os.environ, NO_COLOR="1"))


def summarize(xs: list[float]) -> str:
    if len(xs) == 1:
        return f"{xs[0]:.4f}"
    return f"mean {statistics.mean(xs):.4f}, median {statistics.median(xs):.4f}, stdev {statistics.stdev(xs):.4f}"
