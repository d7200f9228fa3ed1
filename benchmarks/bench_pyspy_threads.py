#!/usr/bin/env python3
"""What one py-spy sample costs, by the kind of thread the target has (the cost model's basis).

py-spy's per-sample CPU is the term of the cost model that moves most between jobs (docs/cost.md).
This measures it on targets whose threads are known: a 1-thread Python loop (22 frames deep), the
same beside N idle native threads (an OpenMP pool left idle by torch), the same beside N idle
Python threads (16 frames deep, blocked on an Event), and any real job given with --job (a
command line; timed once it prints its first line). For each target: its OS threads, their names,
its Python threads (`py-spy dump`), and py-spy's CPU for `record --nonblocking --idle --threads`
at --rate and at 1 Hz over the same --seconds (rusage of the py-spy process); the difference over
the extra samples is the CPU of one sample. Then a least-squares fit of
    per sample = a + b * (OS threads) + c * (Python threads beyond the first).

    .venv/bin/python benchmarks/bench_pyspy_threads.py [--rate 50] [--seconds 4] [--job 'python x.py'] [--json OUT]
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET = r'''
import sys, threading, time
mode, n = sys.argv[1], int(sys.argv[2])
if mode == "native":
    import torch
    torch.set_num_threads(n + 1)
    a = torch.randn(512, 512)
    for _ in range(5):
        a @ a
    torch.set_num_threads(1)      # the pool's threads stay, idle
elif mode == "python":
    ev = threading.Event()
    def deep(k):
        ev.wait() if k == 0 else deep(k - 1)
    for _ in range(n):
        threading.Thread(target=deep, args=(15,), daemon=True).start()
def f(k):
    if k == 0:
        t = time.time()
        while time.time() - t < 0.01:
            pass
    else:
        f(k - 1)
print("ready", flush=True)
while True:
    f(20)
'''


def pyspy() -> str:
    here = Path(sys.executable).parent / "py-spy"
    return str(here) if here.exists() else (shutil.which("py-spy") or "py-spy")


def record_cpu(pid: int, rate: int, seconds: float, out: str) -> float:
    q = subprocess.Popen([pyspy(), "record", "--pid", str(pid), "--rate", str(rate), "--duration",
                          str(int(seconds)), "--nonblocking", "--idle", "--threads", "-f", "chrometrace", "-o", out],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, _, ru = os.wait4(q.pid, 0)
    return ru.ru_utime + ru.ru_stime


def python_threads(pid: int) -> int:
    r = subprocess.run([pyspy(), "dump", "--pid", str(pid), "--nonblocking"], capture_output=True, text=True, timeout=30)
    return sum(1 for ln in r.stdout.splitlines() if ln.startswith("Thread "))


def names(pid: int) -> dict[str, int]:
    out: dict[str, int] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            n = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
        except OSError:
            continue
        out[n] = out.get(n, 0) + 1
    return out


def measure(label: str, argv: list[str], rate: int, seconds: float, settle: float, tmp: str) -> dict:
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        p.stdout.readline()
        time.sleep(settle)
        th = len(os.listdir(f"/proc/{p.pid}/task"))
        py = python_threads(p.pid)
        hi = [record_cpu(p.pid, rate, seconds, os.path.join(tmp, "hi.json")) for _ in range(2)]
        lo = record_cpu(p.pid, 1, seconds, os.path.join(tmp, "lo.json"))
        extra = (rate - 1) * int(seconds)
        per = (min(hi) - lo) / extra
        row = {"target": label, "os_threads": th, "python_threads": py, "names": names(p.pid),
               "cpu_at_rate": [round(x, 4) for x in hi], "cpu_at_1hz": round(lo, 4), "rate_hz": rate,
               "seconds": seconds, "sample_ms": round(per * 1000, 3)}
        print(f"{label:28s} OS threads {th:4d}  Python threads {py:3d}  per sample {per * 1000:6.3f} ms  "
              f"(at {rate} Hz {min(hi):.3f} CPU-s, at 1 Hz {lo:.3f})", flush=True)
        return row
    finally:
        p.kill()
        p.wait()


def fit(rows: list[dict]) -> dict:
    """Least squares of sample_ms on (1, OS threads, Python threads - 1)."""
    xs = [(1.0, float(r["os_threads"]), float(max(r["python_threads"] - 1, 0))) for r in rows]
    ys = [r["sample_ms"] for r in rows]
    n = 3
    a = [[sum(x[i] * x[j] for x in xs) for j in range(n)] for i in range(n)]
    b = [sum(x[i] * y for x, y in zip(xs, ys)) for i in range(n)]
    for i in range(n):                      # Gauss-Jordan, 3x3
        piv = a[i][i] or 1e-12
        for j in range(n):
            a[i][j] /= piv
        b[i] /= piv
        for k in range(n):
            if k != i:
                f = a[k][i]
                for j in range(n):
                    a[k][j] -= f * a[i][j]
                b[k] -= f * b[i]
    return {"base_ms": round(b[0], 4), "per_os_thread_ms": round(b[1], 4), "per_python_thread_ms": round(b[2], 4)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=int, default=50)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--settle", type=float, default=1.0)
    ap.add_argument("--native", default="16,48")
    ap.add_argument("--python", default="4,16")
    ap.add_argument("--job", action="append", default=[], help="a real job's command line (repeatable)")
    ap.add_argument("--job-settle", type=float, default=20.0, help="seconds after its first line")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="bench-pyspy-")
    script = os.path.join(tmp, "target.py")
    Path(script).write_text(TARGET)
    rows = [measure("1 thread", [sys.executable, script, "base", "0"], args.rate, args.seconds, args.settle, tmp)]
    for n in [int(x) for x in args.native.split(",") if x]:
        rows.append(measure(f"+{n} idle native", [sys.executable, script, "native", str(n)], args.rate,
                            args.seconds, args.settle, tmp))
    for n in [int(x) for x in args.python.split(",") if x]:
        rows.append(measure(f"+{n} idle Python", [sys.executable, script, "python", str(n)], args.rate,
                            args.seconds, args.settle, tmp))
    synthetic = fit(rows)
    print("fit on the synthetic targets:", synthetic)
    for j in args.job:
        rows.append(measure(j[:28], shlex.split(j), args.rate, args.seconds, args.job_settle, tmp))
    out = {"rows": rows, "fit_synthetic": synthetic, "fit_all": fit(rows) if args.job else synthetic}
    if args.job:
        print("fit on every target:", out["fit_all"])
    shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
