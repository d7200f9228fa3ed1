"""Merging N synthetic node reports into one job report: time and peak memory (default N=1000).

Each synthetic node is shaped like a real node agent's payload: one report with the full report
document of the live two-node Slurm test's straggler node (its findings, evidence, probes), two
ranks' rows. One node in 50 is a straggler; one in 100 timed out.

    .venv/bin/python benchmarks/bench_fleet_merge.py [--nodes 1000] [--runs 3] [--json OUT]
"""
from __future__ import annotations

import argparse
import copy
import json
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from trainprobe.agent.fleet.merge import merge  # noqa: E402
from trainprobe.reports import job_text  # noqa: E402

REPORT = Path(__file__).resolve().parent.parent / "tests" / "data" / "h200x2" / "starved-rank1-launcher.json"


def payloads(n: int) -> list[dict]:
    rep = json.loads(REPORT.read_text())
    out = []
    for i in range(n):
        node = f"node{i:05d}"
        if i % 100 == 99:
            out.append({"node": node, "status": "timeout", "reason": "timed out", "exit_code": 3, "targets": []})
            continue
        strag = i % 50 == 7
        rows = [{"node": node, "pid": 1000 + k, "rank": 2 * i + k, "local_rank": k, "procid": 2 * i + k,
                 "data_share": (0.8 if strag and k == 1 else 0.01), "collective_share": (0.0 if strag and k == 1 else 0.5),
                 "host_sync_share": 0.0, "cpu_share": 0.9, "gpu_busy": 0.9,
                 "top_finding": "dataloader.starved" if strag and k == 1 else None,
                 "top_title": "starved" if strag and k == 1 else None,
                 "expected_speedup": 3.9 if strag and k == 1 else None} for k in range(2)]
        out.append({"node": node, "status": "ok", "reason": None, "exit_code": 0,
                    "targets": [{"target": {"pid": 999, "ranks": []}, "status": "ok", "rows": rows,
                                 "report": copy.deepcopy(rep)}]})
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json", dest="out", default=None)
    a = ap.parse_args()
    ps = payloads(a.nodes)
    size = sum(len(json.dumps(p)) for p in ps)
    walls, peaks, render = [], [], []
    for _ in range(a.runs):
        t = time.perf_counter()
        rep = merge("1", ps, 10.0, nodes=[p["node"] for p in ps])
        walls.append(time.perf_counter() - t)
        # Memory in a separate run: tracemalloc slows allocation down several-fold.
        tracemalloc.start()
        merge("1", ps, 10.0, nodes=[p["node"] for p in ps])
        peaks.append(tracemalloc.get_traced_memory()[1] / 2 ** 20)
        tracemalloc.stop()
        t = time.perf_counter()
        job_text.render(rep, open("/dev/null", "w"), color=False)
        render.append(time.perf_counter() - t)
    res = {"nodes": a.nodes, "input_json_mb": round(size / 2 ** 20, 1), "merge_s_median": round(sorted(walls)[len(walls) // 2], 4),
           "merge_peak_mb_beyond_input": round(max(peaks), 1), "text_render_s_median": round(sorted(render)[len(render) // 2], 4),
           "ranks": len(rep["ranks"]), "stragglers": len(rep["stragglers"]), "job_expected_speedup": rep["job_expected_speedup"]}
    print(json.dumps(res))
    if a.out:
        Path(a.out).write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
