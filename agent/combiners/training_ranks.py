"""The training processes of a job and per-rank facts joined from py-spy, NVML and /proc.

py-spy names the training processes (each rank of a multi-rank job, else the target) and each one's
share waiting for or loading data; NVML's process list gives the GPU a rank uses and that GPU's busy
share; the process probe's per-thread CPU time gives a rank's time off-CPU outside data waits (in
lockstep, waiting in collectives for a slower rank). Read by dataloader.starved and the fleet view.
"""
from __future__ import annotations

from typing import Any

from trainprobe.agent.evidence import Evidence


def trainers(spy: dict[str, Any]) -> list[dict[str, Any]]:
    """The training processes py-spy saw: each rank of a multi-rank job, else the target itself."""
    # A child py-spy caught only briefly (a DataLoader worker re-created each epoch, sampled before it
    # entered its worker loop) is not a rank: a rank's training thread is seen doing training work.
    ranks = [r for r in spy.get("ranks") or [] if r.get("training_thread")
             and sum(v for k, v in r["training_thread"]["breakdown"].items() if k != "other") >= 0.1]
    if ranks and (spy.get("launcher") or len(ranks) > 1):
        return ranks
    if spy.get("training_thread"):
        return [{"pid": spy["training_thread"].get("pid") or spy.get("pid"), "training_thread": spy["training_thread"],
                 "workers": spy.get("workers") or {}}]
    return []


def data_share(tt: dict[str, Any]) -> float:
    return tt["breakdown"].get("data_wait", 0.0) + tt["breakdown"].get("data_load", 0.0)


def gpu_busy_of(ev: Evidence, pid: int) -> tuple[int, float] | None:
    """(GPU index, NVML busy share over the window) of the GPU a process used, from the gpu evidence."""
    gpu = ev.get("gpu") or {}
    idx = [p["gpu_index"] for p in gpu.get("processes") or [] if p.get("pid") == pid]
    per = gpu.get("per_gpu") or {}
    if len(set(idx)) != 1:
        return None
    g = per.get(idx[0])
    if not g or g.get("busy_fraction") is None:
        return None
    return idx[0], float(g["busy_fraction"])


def collective_wait_share(ev: Evidence, rank: dict[str, Any]) -> float | None:
    """Share of a rank's training thread spent off-CPU outside data waits: with ranks in lockstep,
    time spent waiting in collectives for a slower rank. Needs the process probe's thread CPU."""
    proc = ev.get("process")
    if not proc:
        return None
    me = next((x for x in proc["processes"] if x["pid"] == rank["pid"]), None)
    if me is None:
        return None
    th = next((t for t in me["threads"] if t["tid"] == rank["pid"]), None)
    if th is None or th.get("cpu_fraction") is None:
        return None
    bd = rank["training_thread"]["breakdown"]
    return max(0.0, 1.0 - th["cpu_fraction"] - bd.get("data_wait", 0.0))
