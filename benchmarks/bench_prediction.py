"""The demo's predicted speedup against the measured one, over several runs of `trainprobe demo`.

    .venv/bin/python benchmarks/bench_prediction.py [--runs 3]
"""
from __future__ import annotations

import argparse
import json
import sys

from _common import summarize, trainprobe


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--measure", type=float, default=8.0)
    a = ap.parse_args()
    pred, meas = [], []
    for i in range(a.runs):
        r = trainprobe("demo", "--json", "--no-rediagnose", "--measure", str(a.measure))
        s = json.loads(r.stdout)
        pred.append(s["predicted_speedup"])
        meas.append(s["measured_speedup"])
        print(f"run {i + 1}: before {s['before']['steps_per_s']:.1f} steps/s, after {s['after']['steps_per_s']:.1f} "
              f"steps/s ({' '.join(s['after']['args'])}); predicted {pred[-1]:.2f}x, measured {meas[-1]:.2f}x",
              flush=True)
    errs = [p / m - 1 for p, m in zip(pred, meas)]
    print(f"predicted: {summarize(pred)}\nmeasured:  {summarize(meas)}\nprediction error (predicted/measured - 1): {summarize(errs)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
