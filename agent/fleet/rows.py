"""Per-rank rows of the job table, from one node's Evidence and Report (pure; used live on the node
and again by `trainprobe report` on a job bundle).

Shares are of the rank's training thread over the window:
    data_share        waiting for or loading batches (py-spy)
    host_sync_share   in host-device synchronisations (py-spy)
    collective_share  off-CPU and not runnable, outside data waits (process probe: 1 - CPU share -
                      run-queue delay share - data wait). Ranks step in lockstep, so this is the time
                      a rank waits in collectives for a slower rank.
    gpu_busy          NVML busy share of the rank's GPU (None without GPU evidence)
"""
from __future__ import annotations

from typing import Any

from trainprobe.agent.evidence import Evidence
from trainprobe.agent.combiners.training_ranks import data_share, gpu_busy_of, trainers


def _thread(ev: Evidence, pid: int) -> dict[str, Any] | None:
    proc = ev.get("process") or {}
    me = next((x for x in proc.get("processes", []) if x["pid"] == pid), None)
    if me is None:
        return None
    return next((t for t in me.get("threads", []) if t["tid"] == pid), None)


def collective_share(ev: Evidence, pid: int, breakdown: dict[str, float], window_s: float) -> float | None:
    th = _thread(ev, pid)
    if th is None or th.get("cpu_fraction") is None:
        return None
    delay = (th.get("run_delay_seconds") or 0.0) / window_s if window_s > 0 else 0.0
    return round(max(0.0, 1.0 - th["cpu_fraction"] - delay - breakdown.get("data_wait", 0.0)), 4)


def _top_for(report: dict[str, Any], pid: int, n_ranks: int) -> dict[str, Any] | None:
    fs = report.get("findings") or []
    for f in fs:
        if (f.get("details") or {}).get("rank_pid") == pid:
            return f
    if n_ranks == 1 and fs:
        return fs[0]
    return None


def rank_rows(ev: Evidence, report: dict[str, Any], ranks: list[dict[str, Any]], node: str) -> list[dict[str, Any]]:
    """One row per rank the node found (ranks: {"pid", "rank", "local_rank", "procid"})."""
    spy = ev.get("pyspy") or {}
    views = {t["pid"]: t for t in trainers(spy)}
    window_s = float((report.get("window") or {}).get("seconds") or 0.0)
    rows = []
    for r in ranks:
        pid = r["pid"]
        view = views.get(pid)
        if view is None and len(views) == 1 and len(ranks) == 1:
            view = next(iter(views.values()))
        bd = (view or {}).get("training_thread", {}).get("breakdown") if view else None
        th = _thread(ev, pid)
        busy = gpu_busy_of(ev, pid)
        if busy is None and len(ranks) == 1 and (report.get("gpu") or {}).get("busy_fraction") is not None:
            busy = (None, report["gpu"]["busy_fraction"])
        top = _top_for(report, pid, len(ranks))
        rows.append({
            "node": node, "pid": pid, "rank": r.get("rank"), "local_rank": r.get("local_rank"),
            "procid": r.get("procid"),
            "data_share": round(data_share(view["training_thread"]), 4) if bd is not None else None,
            "host_sync_share": round(bd.get("host_sync", 0.0), 4) if bd is not None else None,
            "collective_share": collective_share(ev, pid, bd or {}, window_s) if th is not None else None,
            "cpu_share": th.get("cpu_fraction") if th else None,
            "gpu_busy": round(busy[1], 4) if busy else None,
            "top_finding": top.get("id") if top else None,
            "top_title": top.get("title") if top else None,
            "expected_speedup": top.get("expected_speedup") if top else None,
        })
    return rows
