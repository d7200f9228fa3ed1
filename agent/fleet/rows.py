"""Per-rank rows of the job table, from one node's Evidence and Report (pure; used live on the node
and again by `trainprobe report` on a job bundle).

Shares are of the rank's training thread over the window:
    data_share        waiting for or loading batches (py-spy)
    host_sync_share   in host-device synchronisations (py-spy)
    collective_share  off-CPU and not runnable, outside data waits (process probe: 1 - CPU share -
                      run-queue delay share - data wait). Ranks step in lockstep, so this is the time
                      a rank waits in collectives for a slower rank; 1 - it is the rank's own work.
    run_delay_share   runnable, waiting for a CPU (schedstat)
    gpu_busy          NVML busy share of the rank's GPU (None without GPU evidence)
and the facts the straggler model (agent/combiners/stragglers.py) reads: py-spy's sample count, the
rank's CPUs, its hottest functions, its GPU's clocks, its node's quota throttling and contention.
"""
from __future__ import annotations

from typing import Any

from trainprobe.agent.evidence import Evidence
from trainprobe.agent.combiners.training_ranks import gpu_busy_of, node_cpu_facts, rank_facts, thread_of, trainers


def collective_share(ev: Evidence, pid: int, breakdown: dict[str, float], window_s: float) -> float | None:
    th = thread_of(ev, pid)
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


def _findings_for(report: dict[str, Any], pid: int, n_ranks: int) -> list[dict[str, Any]]:
    """The node's findings that speak of this rank (all of them when the node runs one rank): the
    fixes the straggler model quotes for a cause."""
    out = []
    for f in report.get("findings") or []:
        rp = (f.get("details") or {}).get("rank_pid")
        if rp == pid or (rp is None and n_ranks == 1):
            out.append({"id": f.get("id"), "title": f.get("title"), "expected_speedup": f.get("expected_speedup"),
                        "fixes": [{k: fx.get(k) for k in ("title", "change", "command")} for fx in f.get("fixes") or []][:2]})
    return out


def rank_rows(ev: Evidence, report: dict[str, Any], ranks: list[dict[str, Any]], node: str) -> list[dict[str, Any]]:
    """One row per rank the node found (ranks: {"pid", "rank", "local_rank", "procid"})."""
    spy = ev.get("pyspy") or {}
    views = {t["pid"]: t for t in trainers(spy)}
    window_s = float((report.get("window") or {}).get("seconds") or 0.0)
    node_facts = node_cpu_facts(ev, window_s)
    rows = []
    for r in ranks:
        pid = r["pid"]
        view = views.get(pid)
        if view is None and len(views) == 1 and len(ranks) == 1:
            view = next(iter(views.values()))
        facts = rank_facts(ev, pid, view, window_s)
        busy = gpu_busy_of(ev, pid)
        if busy is None and len(ranks) == 1 and (report.get("gpu") or {}).get("busy_fraction") is not None:
            busy = (None, report["gpu"]["busy_fraction"])
        top = _top_for(report, pid, len(ranks))
        rows.append({
            "node": node, "pid": pid, "rank": r.get("rank"), "local_rank": r.get("local_rank"),
            "procid": r.get("procid"),
            **facts,
            "gpu_busy": round(busy[1], 4) if busy else None,
            "top_finding": top.get("id") if top else None,
            "top_title": top.get("title") if top else None,
            "expected_speedup": top.get("expected_speedup") if top else None,
            "node_facts": node_facts,
            "findings": _findings_for(report, pid, len(ranks)),
        })
    return rows
