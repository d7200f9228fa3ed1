"""One diagnosis, end to end: target -> session -> evidence -> rules -> ranked findings -> report.

Used by the `diagnose` and `demo` commands and by tests; rendering is the caller's business.
"""
from __future__ import annotations

import platform
import socket
from dataclasses import dataclass
from typing import Any

from agent import evidence as evidence_mod
from agent import report as report_mod
from agent.evidence import Evidence
from agent.session import Progress, SessionResult, run_session, select_probes, stderr_progress
from agent.target import EXIT_INTERRUPTED, EXIT_NOT_PERMITTED, EXIT_OK, EXIT_TARGET_GONE, Resolved, resolve, validate
from probes import procfs
from probes.base import Capture, WatchSpec
from probes.target import is_alive, launcher_of

MIN_EVIDENCE_S = 1.0        # a target that lived less than this in the window gives exit code 3


@dataclass
class Diagnosis:
    report: dict[str, Any]
    evidence: Evidence
    captures: list[Capture]
    exit_code: int
    context: dict[str, Any]


def host_context(root: str = "/") -> dict[str, Any]:
    return {"hostname": socket.gethostname(), "cpus": len(procfs.cpus_online(root)),
            "numa_nodes": procfs.numa_node_count(root), "kernel": platform.release()}


def evidence_from(captures: list[Capture], context: dict[str, Any]) -> Evidence:
    ev = evidence_mod.build(captures, context)
    ev.context.setdefault("cpus_available", context.get("host", {}).get("cpus"))
    return ev


def report_from(captures: list[Capture], context: dict[str, Any], overhead: dict[str, Any],
                notes: list[str]) -> tuple[dict[str, Any], Evidence]:
    """Pure given the captures: what `report BUNDLE` re-runs offline."""
    ev = evidence_from(captures, context)
    findings, runs = report_mod.diagnose(ev)
    rep = report_mod.build(ev, "diagnose", context["window"], overhead, findings, runs, notes)
    return rep, ev


def run(pid: int | None, duration_s: float = 10.0, rate_hz: int = 25, only: tuple[str, ...] = (),
        skip: tuple[str, ...] = (), native: bool = False, root: str = "/", deep: bool = False,
        progress: Progress = stderr_progress, options: dict[str, Any] | None = None) -> Diagnosis:
    resolved: Resolved = resolve(pid, root)
    info = resolved.info
    requested = info.pid
    launcher = launcher_of(info.pid, root)
    if launcher is not None:
        # One rank of a multi-rank job: watch the whole job, so the ranks can be compared.
        progress(f"PID {info.pid} is one rank of a multi-rank job; watching all ranks from launcher PID {launcher}")
        info = validate(launcher, root)
    if resolved.how == "discovered":
        progress(f"diagnosing PID {info.pid}: {info.cmdline[:80]}")
    spec = WatchSpec(pid=info.pid, window_s=duration_s, rate_hz=rate_hz, child_pids=tuple(info.children),
                     native=native, root=root, options=dict(options or {}))
    probes = select_probes(only, skip, deep)
    result: SessionResult = run_session(spec, probes, progress, target_alive=lambda: is_alive(info.pid, root))
    host = host_context(root)
    context = {
        "host": host,
        "target": {"pid": info.pid, "cmdline": info.cmdline, "uses_cuda": info.uses_cuda,
                   "requested_pid": requested},
        "window": {"start_unix": round(result.started_unix, 3), "seconds": round(result.observed_s, 3),
                   "requested_seconds": duration_s},
        "uses_cuda": info.uses_cuda,
    }
    notes: list[str] = []
    gone = not is_alive(info.pid, root)
    if gone:
        notes.append(f"the target exited during the window ({result.observed_s:.1f} of {duration_s:g} s observed)")
    if result.interrupted:
        notes.append(f"interrupted after {result.observed_s:.1f} of {duration_s:g} s")
    overhead = dict(result.overhead)
    cpus = float(host["cpus"] or 1)
    overhead["target_slowdown_estimate"] = round(
        overhead["agent_cpu_seconds"] / max(result.observed_s * cpus, 1e-6), 4)
    overhead["estimate_basis"] = "agent CPU-seconds over the window's CPU capacity (an upper bound when the job saturates its CPUs)"
    # Probes that measure their own cost (e.g. tracepoint tax) put it in Capture.meta["overhead"].
    per_probe = {c.probe: c.meta["overhead"] for c in result.captures if c.meta.get("overhead")}
    if per_probe:
        overhead["probes"] = per_probe
    context["session_notes"] = list(notes)      # what the session saw; rules add their own notes again
    rep, ev = report_from(result.captures, context, overhead, notes)
    exit_code = EXIT_OK
    if gone and result.observed_s < max(MIN_EVIDENCE_S, 0.5 * duration_s):
        exit_code = EXIT_TARGET_GONE
    elif any(c.probe == "pyspy" and c.status == "failed" and c.meta.get("error_kind") == "permission_denied"
             for c in result.captures):
        exit_code = EXIT_NOT_PERMITTED      # the stacks are the core of a diagnosis: say it was refused
    if result.interrupted:
        exit_code = EXIT_INTERRUPTED
    return Diagnosis(rep, ev, result.captures, exit_code, context)

