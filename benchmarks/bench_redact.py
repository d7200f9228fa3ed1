"""What redaction costs on real py-spy traces (the GPU node's chrometraces in tests/data/h200).

    python benchmarks/bench_redact.py [--repeat 5] [--module PATH]

Times `redact.json_text` (what the py-spy probe applies to every trace it records) on each
trace, best of --repeat, and, as a yardstick measured in the same run, `json.loads` of the same
text. `--module PATH` times another copy of redact.py instead (to compare two versions on one
machine: copy the old one somewhere and pass it).
"""
from __future__ import annotations

import argparse
import gzip
import importlib.util
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def _load(path: str | None):
    if not path:
        from trainprobe.probes.parsers import redact
        return redact
    spec = importlib.util.spec_from_file_location("redact_under_test", path)
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(mod)
    return mod


def _best(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--module", help="another redact.py to time")
    a = ap.parse_args()
    redact = _load(a.module)
    redact.text("warm up --api-key=x")          # compile the rules outside the timing
    print(f"{'trace':<10} {'MB':>6} {'json.loads ms':>14} {'json_text ms':>13} {'ratio':>6} {'changed':>8}")
    for p in sorted((REPO / "tests" / "data" / "h200").glob("*/pyspy.chrometrace.json.gz")):
        with gzip.open(p, "rt") as fh:
            s = fh.read()
        load = _best(lambda: json.loads(s), a.repeat)
        red = _best(lambda: redact.json_text(s), a.repeat)
        changed = redact.json_text(s) != s
        print(f"{p.parent.name:<10} {len(s) / 1e6:6.2f} {load * 1e3:14.1f} {red * 1e3:13.1f} {red / load:6.2f} "
              f"{str(changed):>8}")


if __name__ == "__main__":
    main()
