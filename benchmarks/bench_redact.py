"""What redaction costs on real py-spy traces (the GPU node's chrometraces in tests/data/h200).

    python benchmarks/bench_redact.py [--repeat 3] [--baseline PATH]

Times `redact.json_text` (what the py-spy probe applies to every trace it records) on each trace
in three forms: as captured (nothing to redact), with a frame named like a credential word
(`Thread._token_bootstrap`: the prefilter lets it through, nothing changes) and with a secret
planted in the first process name (`--api-key=PLANTED`). Best of --repeat. `json.loads` of the
same text, measured in the same run, is the yardstick. `--baseline PATH` times another copy of
redact.py beside this one, alternating runs, and prints the ratio (copy the old one somewhere
and pass it to compare two versions on one machine).
"""
from __future__ import annotations

import argparse
import gzip
import importlib.util
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def _load(path: str, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.text("warm up --api-key=x")          # compile the rules outside the timing
    return mod


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--baseline", help="another redact.py to time beside this one")
    a = ap.parse_args()
    mods = {"this": _load(str(REPO / "probes" / "parsers" / "redact.py"), "redact_this")}
    if a.baseline:
        mods["baseline"] = _load(a.baseline, "redact_baseline")
    head = f"{'trace':<9} {'MB':>6} {'form':<11} {'json.loads ms':>13} {'this ms':>9}"
    print(head + (f" {'baseline ms':>11} {'this/base':>9}" if a.baseline else ""))
    for p in sorted((REPO / "tests" / "data" / "h200").glob("*/pyspy.chrometrace.json.gz")):
        with gzip.open(p, "rt") as fh:
            s = fh.read()
        forms = {"captured": s, "frame-hint": s.replace("Thread._bootstrap", "Thread._token_bootstrap"),
                 "planted": s.replace('"name":"process ', '"name":"--api-key=PLANTED process ', 1)}
        load = float("inf")
        for _ in range(a.repeat):
            t0 = time.perf_counter()
            json.loads(s)
            load = min(load, time.perf_counter() - t0)
        for form, doc in forms.items():
            best = {k: float("inf") for k in mods}
            for _ in range(a.repeat):
                for k, m in mods.items():
                    t0 = time.perf_counter()
                    out = m.json_text(doc)
                    best[k] = min(best[k], time.perf_counter() - t0)
                    assert "PLANTED" not in out, k
            line = f"{p.parent.name:<9} {len(s) / 1e6:6.2f} {form:<11} {load * 1e3:13.1f} {best['this'] * 1e3:9.1f}"
            if a.baseline:
                line += f" {best['baseline'] * 1e3:11.1f} {best['this'] / best['baseline']:9.2f}"
            print(line, flush=True)


if __name__ == "__main__":
    main()
