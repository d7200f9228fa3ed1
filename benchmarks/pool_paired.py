#!/usr/bin/env python3
"""The agent's effect on one job pooled over several paired runs (`gpu_cost.py --design paired`).

One paired run of 15-30 pairs cannot resolve 1% on a job whose pace swings 10-15% between windows
(docs/cost.md). Runs of the same job on record can be pooled: each run's mean log ratio
(attached/detached) with its standard error sd_log / sqrt(n), combined with inverse-variance
weights (a fixed-effect mean; the between-run spread is reported beside it, and where it exceeds
what the runs' own errors allow, a random-effects interval is given too, DerSimonian-Laird).

    python benchmarks/pool_paired.py benchmarks/results/h*-gpu-paired-data-w0*.json.gz
    python benchmarks/pool_paired.py --as-is FILES...   # only runs of the job as it is (no --job-env, --job-cmd)

Prints one line per run and the pooled figures for steps/s, the loop's duty and its work rate.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from scripts.paired_pool import as_is, factor, load, pool  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--as-is", action="store_true", help="only runs of the job as it is (no --job-env, --job-cmd)")
    ap.add_argument("--arm", default="default",
                    help="the arm pooled; several, comma-separated, each a run of its own (e.g. default,auto: "
                         "the agent as it shipped before and after auto became the default)")
    a = ap.parse_args()
    per: dict[str, list[tuple[int, float, float]]] = {"steps/s": [], "duty": [], "work_rate": []}
    arm_names = [x.strip() for x in a.arm.split(",") if x.strip()]
    for p in a.files:
        d = load(p)
        if a.as_is and not as_is(d):
            continue
        for case in d.get("cases") or []:
            for arm_name in arm_names:
                arm = (case.get("arms") or {}).get(arm_name)
                if not arm:
                    continue
                line = [f"{p.name} [{case.get('case')}, {arm_name}]"]
                for name in per:
                    f = factor(arm, name)
                    if f is not None:
                        per[name].append(f)
                        line.append(f"{name} {f[1]:.4f} (n {f[0]}, sd of log {f[2]:.3f})")
                print("  ".join(line))
    for name, runs in per.items():
        if not runs:
            continue
        r = pool(runs)
        lo, hi = r["ci95"]
        s = (f"{name}: {r['ratio']:.4f} ({lo:.4f}-{hi:.4f}) over {r['pairs']} pairs of {r['runs']} runs; "
             f"Q {r['q']:.1f} on {r['df']} df")
        if "random" in r:
            rl, rh = r["random"]["ci95"]
            s += f"; random effects {r['random']['ratio']:.4f} ({rl:.4f}-{rh:.4f}), tau {r['random']['tau']:.3f}"
        s += f"; about {r['pairs_for_1pct']} pairs would resolve 1%"
        print(s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
