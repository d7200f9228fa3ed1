#!/usr/bin/env python3
"""How far one diagnosis window's prediction moves within one run of a public job.

The public ledger diagnoses each run once and measures the fix over minutes of interleaved
repetitions. Where a job's predictions move between runs more than its measured gains do, the
question is whether a window samples too little (a longer window would narrow it) or the job
itself moves (its phases: loading share, evaluation passes, a slower hour). This starts one job of
benchmarks/public_ledger.py as it runs there (unmodified, under the injected module, no fix), and
diagnoses it REPS times at each window length, alternated, with the agent the ledger uses
(TRAINPROBE_LEDGER_AGENT, else this checkout). Per window: the top finding, the finding's
expected speedup and interval, the step model's step after the fix (details.step_model.after) and
its parts (loading, waits, compute, the step's length). Prints the spread per window length and
writes window-spread-JOB.json (every window) under --out.

    TRAINPROBE_LEDGER_AGENT=$PWD/.public/tp .venv/bin/python benchmarks/window_spread.py \\
        --job lightning-backbone-cpu --windows 5,15 --reps 5 --out DIR
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import public_ledger as P  # noqa: E402
from scripts.window_spread import spread, window_row  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--job", required=True, help="a job of benchmarks/public_ledger.py")
    ap.add_argument("--windows", default="5,15", help="window lengths in seconds, alternated")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--finding", default=None, help="the finding to follow (default: the first with a step model)")
    ap.add_argument("--warmup-scale", type=float, default=1.0)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    job = next((j for j in P.all_jobs() if j.name == a.job), None)
    if job is None:
        ap.error(f"no such job: {a.job}")
    lens = [float(x) for x in a.windows.split(",")]
    a.out.mkdir(parents=True, exist_ok=True)
    P.prepare(job)
    proc = P.PublicProc(job, thread=job.thread, tag="before")
    rows: list[dict[str, Any]] = []
    try:
        proc.warm(job.warmup * a.warmup_scale, 300)
        for i in range(a.reps):
            for sec in lens:
                t = time.time()
                rep = P.diagnose(proc.proc.pid, a.out / f"{a.job}-{i}-{sec:g}s.tar.gz", sec, [])
                row = {"rep": i, "window_s": sec, "start_unix": round(t, 2), **window_row(rep, a.finding)}
                rows.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
    finally:
        proc.proc.kill()
        proc.proc.wait()
    summary = {f"{sec:g}s": {"model_speedup": spread([r["model_speedup"] for r in rows if r["window_s"] == sec]),
                             "f_load": spread([r["f_load"] for r in rows if r["window_s"] == sec]),
                             "C": spread([r["C"] for r in rows if r["window_s"] == sec])}
               for sec in lens}
    (a.out / f"window-spread-{a.job}.json").write_text(json.dumps(
        {"job": a.job, **P.machine_note(), "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
         "command": "python benchmarks/window_spread.py " + " ".join(sys.argv[1:]),
         "summary": summary, "windows": rows}, indent=1))
    for k, v in summary.items():
        print(f"{a.job} {k}: the step model's speedup {v['model_speedup']}; loading share {v['f_load']}; "
              f"compute share {v['C']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
