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

A run on a job whose report printed no fix worth acting on is a check of that abstention, and joins
the public ledger as a re-run of the job (`-rN`, its diagnosed bundle beside it):

    python benchmarks/public_knobs.py --to-tests DIR/JOB-knobs.json [...]

Where the report listed a finding with a fix, the arm that applies that fix as worded is its measured
fix: variant `top` where it is the top finding worth acting on, else `abstained` (both ledger rows
the held-out fit reads).
Where it listed none (compute.bound alone), every arm is kept as `audited`: generic fixes chosen by
hand for the job's shape, each beside the step model's figure; they are no prediction the report
made, so the accuracy figures leave them out, and the summary lists any that measured >= 1.05x.
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import public_ledger as pl  # noqa: E402
from public_ledger import WORTH_ACTING_X  # noqa: E402

from scripts.arms import parse_arms, predicted  # noqa: E402
from scripts.ledger import rerun_name  # noqa: E402


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


def ledger_row(res: dict[str, Any], name: str, bundle: str) -> dict[str, Any]:
    """A public-ledger row for one run of this harness (module docstring: `top`, `abstained` or `audited`)."""
    fs = res["findings"]
    listed = next((f for f in fs if f["id"] != "compute.bound" and f.get("knobs")), None)
    # The report's top finding with a fix worth acting on: the arm that applies it as printed is a
    # measured top fix, like public_ledger.py's own rows.
    top = listed is not None and fs[0] is listed and listed["expected_speedup"] >= WORTH_ACTING_X
    entries = []
    for arm in res["arms"]:
        if "measured" not in arm:
            continue
        e = {"knobs": arm["knobs"], "injected": arm["injected"], "argv_added": arm["argv_added"], "not_applied": {},
             "thread": None, "ratios": arm["ratios"], "measured": arm["measured"],
             "measured_interval": arm["measured_interval"], "reps": len(arm["ratios"]),
             "injected_log": arm.get("injected_log", []), "status": "measured", "arm": arm["arm"]}
        if listed is not None:
            if arm["knobs"] != listed["knobs"]:
                continue
            predicted, interval = pl.printed_figure(listed)
            e.update(variant="top" if top else "abstained", finding=listed["id"], predicted=predicted,
                     interval=interval)
        else:
            m = arm["model"]
            if not m.get("speedup"):
                continue
            e.update(variant="audited", model=m, predicted=m["speedup"], interval=m["interval"])
        e["pred_over_meas"] = round(e["predicted"] / e["measured"], 3)
        e["in_interval"] = e["interval"][0] <= e["measured"] <= e["interval"][1]
        entries.append(e)
    return {**res["job"], "job": name, "bundle": bundle, "headline": res["headline"], "findings": fs,
            "top": fs[0]["id"] if fs else None, "plan": res["plan"],
            "gil_claimed": any(x["id"] == "gil.contention" for x in fs),
            "max_speedup": max((x["expected_speedup"] for x in fs if x["id"] != "compute.bound"), default=1.0),
            "applied": entries, "before": res["base_rates"], "injected_log_before": [],
            "status": ("measured" if entries else "no fix printed" if listed is None
                       else "its printed fix was not among the arms"), "seconds": res.get("wall_s"),
            "gpu": res["machine"].get("gpu"),
            "when": res["when"], "machine": res["machine"],
            "measured_by": re.sub(r"--out \S+", "--out DIR", res["command"]),
            "replay_top": fs[0]["id"] if fs else None, "replay_findings": fs}


def to_tests(paths: list[Path]) -> None:
    """Append runs of this harness to tests/data/ledger/public/public-ledger-KIND.json as re-runs."""
    for path in paths:
        res = json.loads(path.read_text())
        dst = pl.TESTS / f"public-ledger-{res['job']['kind']}.json"
        led = json.loads(dst.read_text())
        base = res["job"]["job"]
        name = rerun_name(base, {r["job"] for r in led["rows"]} | {base})     # always a re-run: JOB-rN
        bundle = f"bundles/{name}.tar.gz"
        shutil.copy(path.with_name(path.name.removesuffix(".json") + ".tar.gz"), pl.TESTS / bundle)
        row = ledger_row(res, name, bundle)
        row["bundle_bytes"] = (pl.TESTS / bundle).stat().st_size
        led["rows"].append(row)
        print(name, row["top"], [(e["variant"], e["knobs"], e["predicted"], e["measured"]) for e in row["applied"]])
        led["summary"] = pl.summary(led["rows"])
        dst.write_text(json.dumps(led, indent=1))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--job", help="a job name of benchmarks/public_ledger.py")
    ap.add_argument("--arms", help="NAME:KEY=VALUE[,KEY=VALUE][;NAME:...]")
    ap.add_argument("--out")
    ap.add_argument("--to-tests", nargs="+", type=Path, metavar="KNOBS_JSON",
                    help="append these runs to the public ledger under tests/data (module docstring)")
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
    if a.to_tests:
        to_tests(a.to_tests)
        return 0
    if not (a.job and a.arms and a.out):
        ap.error("--job, --arms and --out are required (or --to-tests)")
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
