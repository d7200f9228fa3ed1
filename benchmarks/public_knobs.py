"""One public job, several settings: what each knob of a fix gives alone and together, beside what the
step model predicts for each.

The public-code ledger (public_ledger.py) measures the fix trainprobe printed, as printed. Where a fix
is several knobs at once (one worker and one intra-op thread on a 2-CPU machine), that leaves open
which term of the step model is off when the prediction is: the worker's hand-off, the thread cap's
cost, or the CPUs they share. This runs the untouched job and one copy per arm (a set of knobs applied
by the same generic mechanism, benchmarks/inject), diagnoses the untouched one once, and measures
every arm against it in interleaved windows (each paused while another runs). Each arm's prediction
is the step model's (agent/combiners/step_model.py) for that change on the diagnosed window, at the
calibration as it ships.

    python benchmarks/public_knobs.py --job vae-cpu --out DIR \
        --arms 'cap:intra_op_threads=1;worker:num_workers=1,persistent_workers=true;both:num_workers=1,persistent_workers=true,intra_op_threads=1'

Sources come from .public/src (public_ledger.py --fetch). Writes DIR/JOB-knobs.json and prints a table.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import public_ledger as pl  # noqa: E402

from scripts.arms import parse_arms, predicted  # noqa: E402


def run(job: pl.PublicJob, arms: list[tuple[str, dict[str, Any]]], out: Path, a: argparse.Namespace) -> dict[str, Any]:
    pl.prepare(job)
    base = pl.PublicProc(job, thread=job.thread, tag="base")
    procs, rows = [base], []
    t0 = time.time()
    try:
        base.warm(job.warmup * a.warmup_scale, a.start_timeout)
        bundle = out / f"{job.name}-knobs.tar.gz"
        rep = pl.diagnose(base.proc.pid, bundle, a.duration, [])
        fs = rep.get("findings") or []
        base.pause()
        for name, knobs in arms:
            inj, argv, left = pl.split_knobs(job, knobs)
            if left:
                raise SystemExit(f"arm {name}: no generic mechanism applies {sorted(left)}")
            p = pl.PublicProc(job, inj, argv, job.thread, tag=name)
            procs.append(p)
            p.warm(job.warmup * a.warmup_scale, a.start_timeout)
            p.pause()
            rows.append({"arm": name, "knobs": knobs, "injected": inj, "argv_added": argv,
                         "model": predicted(bundle, knobs)})
        rates = pl.interleaved(procs, a.seconds, a.settle, a.min_reps, a.max_reps, a.target,
                               time.time() + a.job_seconds)
        for row, p, r in zip(rows, procs[1:], rates[1:]):
            ratios = [x / y for x, y in zip(r, rates[0])]
            lo, hi = pl.mean_log_interval(ratios)
            med = statistics.median(ratios)
            row.update(ratios=[round(x, 3) for x in ratios], measured=round(med, 3),
                       measured_interval=[round(lo, 3), round(hi, 3)], injected_log=p.injected())
            if row["model"].get("speedup"):
                row["pred_over_meas"] = round(row["model"]["speedup"] / med, 3)
        return {"job": pl.describe(job), "machine": pl.machine_note(), "seconds": a.seconds, "duration": a.duration,
                "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                "command": "python benchmarks/public_knobs.py " + " ".join(sys.argv[1:]),
                "headline": rep.get("headline"), "findings": pl.brief(fs), "plan": rep.get("plan"),
                "base_rates": [round(x, 3) for x in rates[0]], "arms": rows, "wall_s": round(time.time() - t0, 1)}
    finally:
        for p in procs:
            p.stop()


def render(res: dict[str, Any]) -> str:
    out = [f"{res['job']['job']}: {res['headline']}", "",
           "| arm | knobs | model | binding | measured (95% interval, pairs) | pred/meas |", "|---|---|---|---|---|---|"]
    for r in res["arms"]:
        m = r["model"]
        knobs = ", ".join(f"{k}={v}" for k, v in r["knobs"].items())
        pred = f"{m['speedup']:.2f}x ({m['interval'][0]:.2f}-{m['interval'][1]:.2f})" if m.get("speedup") else m.get("why")
        meas = (f"{r['measured']:.2f}x ({r['measured_interval'][0]:.2f}-{r['measured_interval'][1]:.2f}), "
                f"{len(r['ratios'])}" if "measured" in r else "-")
        out.append(f"| {r['arm']} | {knobs} | {pred} | {m.get('binding', '-')} | {meas} | {r.get('pred_over_meas', '-')} |")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--job", required=True, help="a job name of benchmarks/public_ledger.py")
    ap.add_argument("--arms", required=True, help="NAME:KEY=VALUE[,KEY=VALUE][;NAME:...]")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seconds", type=float, default=6.0, help="timed seconds per window")
    ap.add_argument("--settle", type=float, default=1.0)
    ap.add_argument("--duration", type=float, default=5.0, help="the diagnosis window")
    ap.add_argument("--min-reps", type=int, default=4)
    ap.add_argument("--max-reps", type=int, default=8)
    ap.add_argument("--target", type=float, default=0.05)
    ap.add_argument("--warmup-scale", type=float, default=3.0)
    ap.add_argument("--start-timeout", type=float, default=300.0)
    ap.add_argument("--job-seconds", type=float, default=400.0, help="the interleaved windows stop after this")
    a = ap.parse_args()
    jobs = {j.name: j for j in pl.all_jobs()}
    if a.job not in jobs:
        ap.error(f"no job {a.job!r}; one of: {', '.join(sorted(jobs))}")
    try:
        arms = parse_arms(a.arms)
    except ValueError as exc:
        ap.error(str(exc))
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    res = run(jobs[a.job], arms, out, a)
    (out / f"{a.job}-knobs.json").write_text(json.dumps(res, indent=1))
    print(render(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
