"""The node side of `diagnose --slurm-job`: run by srun as one task of the job on each node.

It finds the job's training processes on its own node by the job (probes.support.slurmjob), diagnoses
each over the common window, and prints one JSON line: the node's report(s), the per-rank rows
and, when the coordinator saves a bundle, the raw captures.
"""
from __future__ import annotations

import os
import socket
import threading
from typing import Any

from trainprobe.agent import __version__
from trainprobe.agent.session import Progress
from trainprobe.agent.target import UserError
from trainprobe.probes.support import slurmjob

SCHEMA = "trainprobe.node/1"


def this_node() -> str:
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def _own_tree() -> set[int]:
    from trainprobe.probes.parsers import procfs
    me = os.getpid()
    return {me, os.getppid()} | {p for p, _ in procfs.descendants_of(me)}


def run(job_id: str, duration_s: float, rate_hz: int = 25, only: tuple[str, ...] = (), skip: tuple[str, ...] = (),
        deep: bool = False, with_captures: bool = False, root: str = "/",
        progress: Progress | None = None) -> dict[str, Any]:
    from trainprobe.agent import diagnosis
    from trainprobe.agent.fleet.rows import rank_rows

    node = this_node()
    say = progress or (lambda _m: None)
    out: dict[str, Any] = {"schema": SCHEMA, "tool": {"name": "trainprobe", "version": __version__},
                           "job": str(job_id), "node": node, "hostname": socket.gethostname(),
                           "status": "ok", "reason": None, "exit_code": 0, "targets": []}
    procs = slurmjob.job_processes(job_id, node, root, exclude=_own_tree())
    targets = slurmjob.training_targets(procs)
    out["job_processes"] = len(procs)
    if not targets:
        out.update(status="no_target", exit_code=2,
                   reason=f"no process of job {job_id} on node {node} has loaded torch "
                          f"({len(procs)} process(es) of the job seen here)")
        return _finish(out, node, root)
    # A straggler's cause may be its step's CPU quota: the throttle probe (four cgroup reads) runs on
    # every node beside the default probes, within the same budget.
    probes, budget = only, None
    if not only and not deep:
        from trainprobe.probes.registry import probe_names
        probes, budget = tuple(probe_names("diagnose", default_only=True)) + ("throttle",), True
    say(f"{node}: diagnosing {len(targets)} training process tree(s) of job {job_id}: "
        + ", ".join(str(t.pid) for t in targets))
    results: list[dict[str, Any] | None] = [None] * len(targets)

    def one(i: int) -> None:
        t = targets[i]
        entry: dict[str, Any] = {"target": t.to_dict()}
        try:
            d = diagnosis.run(t.pid, duration_s=duration_s, rate_hz=rate_hz, only=probes, skip=skip, root=root,
                              deep=deep, progress=lambda m: say(f"{node}: {m}"), budget=budget)
        except UserError as exc:
            entry.update(status="failed", reason=str(exc), exit_code=exc.exit_code)
            results[i] = entry
            return
        entry.update(status="ok", exit_code=d.exit_code, report=d.report,
                     rows=rank_rows(d.evidence, d.report, t.ranks, node))
        if with_captures:
            entry["bundle"] = {"context": d.context, "captures": [c.to_dict() for c in d.captures]}
        results[i] = entry

    # Every target over the same window: one thread each (a node has a few ranks at most).
    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(len(targets))]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    out["targets"] = [r for r in results if r is not None]
    ok = [r for r in out["targets"] if r.get("status") == "ok"]
    if not ok:
        first = out["targets"][0] if out["targets"] else {}
        out.update(status="failed", reason=first.get("reason") or "no target could be diagnosed",
                   exit_code=first.get("exit_code") or 2)
    elif all(r.get("exit_code") for r in ok):
        out.update(status="target_gone", exit_code=ok[0]["exit_code"],
                   reason="the job's processes exited before enough evidence was gathered")
    return _finish(out, node, root)


def _finish(out: dict[str, Any], node: str, root: str) -> dict[str, Any]:
    alive = slurmjob.slurmd_alive(node, root)
    out["slurmd_alive"] = alive
    if alive is False:
        out["slurmd_note"] = (f"slurmd of node {node} was not running at the end of the window (it stopped "
                              "while the agent watched): Slurm cannot manage this node until it is back")
    return out
