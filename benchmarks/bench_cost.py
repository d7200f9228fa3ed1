"""The agent's cost on this machine: jobs with 0, 1, 4 and 8 DataLoader workers (the bundled CPU
workload), alternating untouched and attached windows, the agent tree's rusage and RSS, and the top
finding at the planned (reduced) sampling against full sampling. See docs/cost.md.

It fails (exit 1, one line per part) when the plan's estimate of a window (agent/cost.py and each
probe's cost model) and the measured tree differ by more than 30%: the tree, the agent's own part
and each probe, medians over the attached windows. `--full-runs 0 --pairs 5 --cases 0` checks the
model alone (about 2 minutes).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_cost.py --out out/cost [--cases 0,1,4,8]
        [--pairs 5] [--window 10] [--full-runs 2]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from _common import Workload
from _cost_bench import report_model_checks, run_case, summary_line


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="out/cost", help="directory for cpu_cost.json")
    ap.add_argument("--cases", default="0,1,4,8", help="DataLoader worker counts, comma-separated")
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--window", type=float, default=10.0)
    ap.add_argument("--full-runs", type=int, default=2, help="windows at full sampling per case (precision)")
    ap.add_argument("--workload-args", default="--persistent-workers", help="extra train_cpu arguments")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for n in [int(x) for x in a.cases.split(",") if x.strip()]:
        w = Workload("--num-workers", str(n), *(a.workload_args.split() if n else []))
        try:
            w.wait_ready()
            time.sleep(2)
            r = run_case(f"cpu-w{n}", w.pid, w.rate, a.window, a.pairs, a.full_runs, [],
                         lambda m: print(m, file=sys.stderr, flush=True))
        finally:
            w.stop()
        results.append(r)
        (out / "cpu_cost.json").write_text(json.dumps({"machine": "cpu", "args": vars(a), "cases": results}, indent=1))
    print(f"\n{a.pairs} alternating pairs of {a.window:g} s windows per case; results in {out / 'cpu_cost.json'}")
    for r in results:
        print(summary_line(r))
    print()
    return report_model_checks(results)


if __name__ == "__main__":
    sys.exit(main())
