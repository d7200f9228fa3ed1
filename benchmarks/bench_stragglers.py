"""Stragglers of every cause on the real two-node Slurm cluster of this host: for each cause the
straggler `diagnose --slurm-job` names and the job speedup it predicts, then the speedup measured
with the cause removed, and a balanced job that should name no straggler.

One job (tests/jobs/straggler_ddp.py under torchrun, one rank per node, each pinned to its own CPU;
scripts/straggler_cluster.py) serves every cause: rank 1 (node n2) carries one at a time:
    data     its batches made in its own loop (16 samples x DATA_WORK Python iterations)
    compute  EXTRA_WORK iterations of pure-Python arithmetic in its own loop each step
    hog      another process spinning on rank 1's CPU
    quota    a cgroup CPU quota of QUOTA_CPUS on rank 1's process tree
    none     nothing: the balanced job
For each: the cause is put on, `diagnose --slurm-job JOB --duration D --json` runs, then the job's
steps/s are measured in alternating blocks with the cause on and removed (ABAB..., `--blocks`
pairs of `--block-s` seconds each, so a change in the host's load falls on both sides); measured
speedup = the median over the blocks with the cause on of (the mean rate of the blocks without it on
either side) / (its rate): a drift of the host's pace cancels (neighbour_ratio). Needs root, slurm-wlm and munge.

    .venv/bin/python benchmarks/bench_stragglers.py [--duration 8] [--blocks 3] [--block-s 3] [--json OUT]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO.parent))
sys.path.insert(0, str(REPO))
from scripts.slurm_cluster import SlurmCluster, missing_commands  # noqa: E402
from scripts.straggler_cluster import CAUSES, StragglerJob  # noqa: E402

PY = sys.executable


def measure(job: StragglerJob, cause: str, blocks: int, block_s: float) -> tuple[float, float, list, list]:
    on, off = [], []
    for _ in range(blocks):
        job.apply(cause)
        on.append(job.steps_per_s(block_s))
        job.remove()
        off.append(job.steps_per_s(block_s))
    med_on, med_off = statistics.median(on), statistics.median(off)
    return med_on, med_off, on, off


def neighbour_ratio(on: list[float], off: list[float]) -> float:
    """The measured speedup from alternating blocks (on_0, off_0, on_1, off_1, ...): each block with the
    cause on against the mean of the blocks without it on either side (off_{i-1}, off_i), so a drift of
    the host's pace cancels to first order; the median over the blocks. (The ratio of the two medians
    mixes blocks minutes apart: kept in the row as `ratio_of_medians`.)"""
    rs = []
    for i, x in enumerate(on):
        nb = [off[j] for j in (i - 1, i) if 0 <= j < len(off)]
        if x > 0 and nb:
            rs.append(statistics.fmean(nb) / x)
    return statistics.median(rs) if rs else float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=8.0)
    ap.add_argument("--blocks", type=int, default=3)
    ap.add_argument("--block-s", type=float, default=3.0)
    ap.add_argument("--causes", default=",".join(c for c in ("data", "compute", "hog", "quota", "none")))
    ap.add_argument("--json", default=None)
    ap.add_argument("--save", default=None, help="keep each cause's job bundle under this directory "
                                                 "(re-diagnose offline with `trainprobe report DIR/CAUSE-N`)")
    a = ap.parse_args()
    if missing_commands() or os.geteuid() != 0:
        print(f"needs root and slurm-wlm/munge (missing: {', '.join(missing_commands())})", file=sys.stderr)
        return 2
    causes = [c for c in a.causes.split(",") if c]
    bad = [c for c in causes if c not in CAUSES]
    if bad:
        print(f"unknown cause(s) {bad}: choose from {', '.join(CAUSES)}", file=sys.stderr)
        return 2
    if a.save:
        Path(a.save).mkdir(parents=True, exist_ok=True)   # diagnose saves into it, it does not make it
    base = Path(tempfile.mkdtemp(prefix="trainprobe-stragglers-"))
    cluster = SlurmCluster(base / "slurm").start()
    results = []
    try:
        job = StragglerJob(cluster.env, base / "job").start()
        try:
            for i, cause in enumerate(causes):
                job.apply(cause)
                time.sleep(2.0)
                t0 = time.monotonic()
                r = subprocess.run([PY, "-m", "trainprobe.agent", "-q", "diagnose", "--slurm-job", job.jid,
                                    "--duration", f"{a.duration:g}", "--json",
                                    *(["--save", str(Path(a.save) / f"{cause}-{i}")] if a.save else [])],
                                   cwd=REPO, env=cluster.env,
                                   capture_output=True, text=True, timeout=a.duration + 180)
                wall = time.monotonic() - t0
                try:
                    rep = json.loads(r.stdout)
                except ValueError:
                    print(f"{cause}: diagnose exited {r.returncode}: {r.stderr.strip()[-500:]}", file=sys.stderr)
                    continue
                s = rep.get("stragglers") or []
                pred = rep.get("job_expected_speedup")
                with_, without, on, off = measure(job, cause, a.blocks, a.block_s)
                meas = neighbour_ratio(on, off)
                by = {(x["node"], x["rank"]): x for x in rep["ranks"]}
                row = {"cause_put_on": cause,
                       "straggler": [f"{x['node']} rank {x['rank']} PID {x['pid']}" for x in s],
                       "cause_found": s[0]["cause"] if s else None,
                       "causes_found": [c["cause"] for c in s[0]["causes"]] if s else [],
                       "fix": s[0]["fix"] if s else None,
                       "collective_share": {f"{k[0]} rank {k[1]}": v.get("collective_share") for k, v in by.items()},
                       "excess_share": s[0]["excess_share"] if s else None,
                       "error_share": s[0]["error_share"] if s else None,
                       "no_straggler_reason": rep.get("no_straggler_reason"),
                       "predicted_speedup": pred,
                       "upper_speedup": s[0].get("job_speedup_upper") if s else None,
                       "steps_per_s_with": round(with_, 2),
                       "steps_per_s_removed": round(without, 2), "measured_speedup": round(meas, 3),
                       "ratio_of_medians": round(without / with_, 3) if with_ > 0 else None,
                       "blocks_with": on, "blocks_removed": off,
                       # each adjacent pair's ratio: the spread of the measurement
                       "pair_ratio_range": [round(min(b / x for x, b in zip(on, off) if x > 0), 3),
                                            round(max(b / x for x, b in zip(on, off) if x > 0), 3)] if on else None,
                       "pred_over_meas": round(pred / meas, 3) if pred and meas == meas else None,
                       "diagnose_wall_s": round(wall, 1)}
                results.append(row)
                print(json.dumps(row), flush=True)
        finally:
            job.stop()
    finally:
        cluster.stop()
    print()
    print(f"{'cause put on':<13} {'straggler named':<24} {'cause found':<14} {'excess':>7} {'err':>5} "
          f"{'pred':>6} {'meas':>6} {'pred/meas':>9}")
    for row in results:
        print(f"{row['cause_put_on']:<13} {', '.join(row['straggler']) or 'none':<24} {row['cause_found'] or '-':<14} "
              f"{row['excess_share'] if row['excess_share'] is not None else '-':>7} "
              f"{row['error_share'] if row['error_share'] is not None else '-':>5} "
              f"{row['predicted_speedup'] or '-':>6} {row['measured_speedup']:>6} "
              f"{row['pred_over_meas'] if row['pred_over_meas'] is not None else '-':>9}")
    if a.json:
        Path(a.json).write_text(json.dumps({"duration_s": a.duration, "blocks": a.blocks, "block_s": a.block_s,
                                            "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
