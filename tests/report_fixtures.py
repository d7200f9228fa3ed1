"""Reports built from the real H200 captures, for the renderer tests.

The py-spy capture and NVML's utilization samples of one mode were recorded together; the
py-spy trace is anchored at the NVML recorder's start. `gpu_evidence` puts NVML's samples in the
shape of the `gpu` evidence (the common brief): utilization {index: [[t_unix, pct], ...]} where a
sample closes a 200 ms period, and idle_intervals as runs of 0% periods.
"""
from __future__ import annotations

import json
from typing import Any

from trainprobe.agent import evidence as evidence_mod
from trainprobe.agent import report as report_mod
from trainprobe.agent import visuals
from tests.helpers import H200, h200_pid, h200_pyspy_capture

PERIOD_S = 0.2


def nvml(mode: str) -> dict[str, Any]:
    return json.loads((H200 / mode / "nvml.json").read_text())


def gpu_evidence(mode: str, lo: float, hi: float) -> dict[str, Any]:
    d = nvml(mode)
    pers = [(t / 1e6 - PERIOD_S, t / 1e6, p) for t, p in d["gpu_util"] if lo <= t / 1e6 - PERIOD_S and t / 1e6 <= hi]
    runs: list[list[float]] = []
    for a, b, v in pers:
        if v > 0:
            continue
        if runs and a - runs[-1][1] <= PERIOD_S / 2:
            runs[-1][1] = b
        else:
            runs.append([a, b])
    total = sum(b - a for a, b, _ in pers)
    busy = sum((b - a) * v / 100.0 for a, b, v in pers) / total
    return {"driver": d["device"]["driver"], "gpus": [{"index": 0, "name": d["device"]["name"], "bus_id": d["device"]["busid"]}],
            "processes": [{"pid": d["pid"], "gpu_index": 0}], "target_gpus": [0], "sample_period_s": PERIOD_S,
            "busy_fraction": round(busy, 4), "idle_fraction": round(1 - busy, 4), "idle_intervals": runs,
            "utilization": {0: [[b, v] for _a, b, v in pers]}}


def h200_capture_and_context(mode: str, before_s: float = 4.0, after_s: float = 4.3):
    """The py-spy capture of one mode and a diagnosis context for it: the window starts `before_s`
    before the py-spy recording (so NVML's idle periods before the loop started are in it)."""
    start = nvml(mode)["started_unix_us"] / 1e6
    cap = h200_pyspy_capture(mode)
    cap.meta["launch_unix"] = start
    window = {"start_unix": start - before_s, "seconds": before_s + after_s}
    ctx = {"host": {"hostname": "h200-node", "cpus": 16, "numa_nodes": 1, "kernel": "6.8.0"},
           "target": {"pid": h200_pid(mode), "cmdline": f"python3 workloads.py {mode} 16"},
           "window": window, "uses_cuda": True}
    return cap, ctx


def h200_report(mode: str, with_gpu: bool = True, before_s: float = 4.0, after_s: float = 4.3):
    """(report, visuals, evidence, captures) for one mode."""
    cap, ctx = h200_capture_and_context(mode, before_s, after_s)
    window = ctx["window"]
    ev = evidence_mod.build([cap], ctx)
    ev.context["cpus_available"] = 16
    if with_gpu:
        ev.parsed["gpu"] = gpu_evidence(mode, window["start_unix"], window["start_unix"] + window["seconds"])
    findings, runs = report_mod.diagnose(ev)
    rep = report_mod.build(ev, "diagnose", window, {"agent_cpu_seconds": 0.4, "agent_max_rss_mb": 60.0}, findings,
                           runs, [])
    return rep, visuals.build(ev, [cap]), ev, [cap]
