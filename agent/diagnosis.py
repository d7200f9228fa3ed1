"""One diagnosis, end to end: target -> session -> evidence -> rules -> ranked findings -> report.

Used by the `diagnose` and `demo` commands and by tests; rendering is the caller's business.
"""
from __future__ import annotations

import math
import platform
import socket
from dataclasses import dataclass
from typing import Any, Callable

from trainprobe.agent import evidence as evidence_mod
from trainprobe.agent import report as report_mod
from trainprobe.agent import schedclass
from trainprobe.agent.evidence import Evidence
from trainprobe.agent.session import Progress, SessionResult, run_session, select_probes, stderr_progress
from trainprobe.agent.target import EXIT_INTERRUPTED, EXIT_NOT_PERMITTED, EXIT_OK, EXIT_TARGET_GONE, Resolved, resolve, validate
from trainprobe.probes.parsers import procfs
from trainprobe.probes.base import Capture, WatchSpec
from trainprobe.probes.support.target import is_alive, launcher_of, trainer_of_worker

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
    from trainprobe.agent.combiners.window_trust import window_trust
    rep["window"] = {**rep["window"], "trust": window_trust(ev)}
    return rep, ev


def run_overhead(result: SessionResult, plan: Any) -> dict[str, Any]:
    from trainprobe.agent.session import measured_overhead
    return measured_overhead(result.recorders, result.thread_cpu, plan, result.tree_rss_peak_mb)


def sampling_section(captures: list[Capture], plan: Any, observed_s: float, job: Any) -> dict[str, Any]:
    """What was sampled, at what rate, and what that means for the precision of a share.

    A share p estimated from n samples has a 95% half-width of at most 1/sqrt(n) (p = 0.5, binomial);
    samples taken at a fixed rate are correlated, so this is the best case, not a bound."""
    out: dict[str, Any] = {"budget": plan.to_dict() if plan is not None else None}
    spy = next((c for c in captures if c.probe == "pyspy" and c.status == "ok"), None)
    if spy is not None:
        sm = dict(spy.meta.get("sampling") or {})
        rate = float(sm.get("main_rate_hz") or spy.meta.get("rate_hz") or 0)
        n_main = int(rate * (sm.get("window_s") or observed_s))
        out["training_process"] = {"pid": spy.meta.get("pid"), "rate_hz": rate, "samples": n_main,
                                   "share_half_width_95": round(1 / math.sqrt(n_main), 3) if n_main else None}
        workers = [p for p in job.processes[1:]]
        sampled = sm.get("workers_sampled") or {}
        if sm.get("mode") == "per_pid":
            wr = float(sm.get("worker_rate_hz") or 0)
            n_w = int(sum(wr * s for s in sampled.values()))
            out["workers"] = {
                "known": len(sm.get("workers_known") or []), "sampled": len(sampled), "rate_hz": wr,
                "seconds_each": round(sum(sampled.values()) / len(sampled), 2) if sampled else 0.0,
                "samples": n_w, "share_half_width_95": round(1 / math.sqrt(n_w), 3) if n_w else None,
                "rotation": "a few workers at a time, each for one slot of the window",
                "aggregate": "every worker's CPU time and state from /proc every 0.5 s (process probe)"}
        elif workers:
            out["workers"] = {"known": len(workers), "sampled": len(workers), "rate_hz": rate,
                              "samples": n_main * len(workers), "rotation": "all, under one sampler",
                              "share_half_width_95": round(1 / math.sqrt(n_main * len(workers)), 3) if n_main else None,
                              "aggregate": "every worker's CPU time and state from /proc every 0.5 s (process probe)"}
    gpu = next((c for c in captures if c.probe == "gpu"), None)
    if gpu is not None and gpu.meta.get("overhead"):
        out["gpu"] = gpu.meta["overhead"]
    return out


def run(pid: int | None, duration_s: float = 10.0, rate_hz: int | None = None, only: tuple[str, ...] = (),
        skip: tuple[str, ...] = (), native: bool = False, root: str = "/", deep: bool = False,
        progress: Progress = stderr_progress, options: dict[str, Any] | None = None,
        budget: bool | None = None, settle: Callable[[], dict] | None = None) -> Diagnosis:
    """`rate_hz` None: py-spy's rate is planned within the agent's CPU budget (agent/cost.py), up to
    default_rate(duration_s) (DEFAULT_RATE_HZ, more on a short window). An explicit rate, or `budget=False`, keeps the settings as given (one sampler
    over the whole tree at that rate) and the plan only states their expected cost."""
    from trainprobe.agent import cost as cost_mod
    from trainprobe.probes.pyspy import default_rate
    # --deep, --probes and --rate ask for their cost: the plan then states it instead of cutting.
    enforce = (rate_hz is None and not only and not deep) if budget is None else budget
    rate_hz = rate_hz or default_rate(duration_s)
    resolved: Resolved = resolve(pid, root)
    info = resolved.info
    requested = info.pid
    trainer = trainer_of_worker(info.pid, root)
    if trainer is not None:
        # A DataLoader worker: its training process is what the diagnosis watches, the worker with it.
        progress(f"PID {info.pid} is a DataLoader worker; diagnosing its training process PID {trainer}")
        info = validate(trainer, root)
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
    job = cost_mod.job_shape(info.pid, root)
    # The agent's scheduling class, settled before the session starts a thread or a probe child.
    sched = settle() if settle is not None else None
    guard = schedclass.Guard(sched) if sched is not None else None
    result: SessionResult = run_session(spec, probes, progress, target_alive=lambda: is_alive(info.pid, root),
                                        planner=lambda ok: cost_mod.plan(spec, ok, job, enforce=enforce),
                                        tick=guard.tick if guard is not None else None)
    plan = result.plan
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
    # Probes that measure their own cost (e.g. tracepoint tax) put it in Capture.meta["overhead"].
    per_probe = {c.probe: c.meta["overhead"] for c in result.captures if c.meta.get("overhead")}
    if per_probe:
        overhead["probes"] = per_probe
    context["session_notes"] = list(notes)      # what the session saw; rules add their own notes again
    rep, ev = report_from(result.captures, context, overhead, notes)
    # The overhead is taken again now, so it covers the evidence and the rules too; only rendering
    # and exit come after it.
    final = run_overhead(result, plan)
    for name, secs in ev.parse_cpu_s.items():
        final["by_probe"].setdefault(name, {})["parse_cpu_seconds"] = secs
    final.update({k: v for k, v in overhead.items() if k == "probes"})
    final["target_slowdown_estimate"] = round(
        final["agent_cpu_seconds"] / max(result.observed_s * job.cpu_capacity, 1e-6), 4)
    final["estimate_basis"] = ("agent tree CPU-seconds over the job's CPU capacity in the window "
                               "(an upper bound when the job saturates its CPUs)")
    overhead.clear()
    overhead.update(final)
    if sched is not None:
        overhead["scheduling_class"] = dict(sched)
    rep["sampling"] = sampling_section(result.captures, plan, result.observed_s, job)
    exit_code = EXIT_OK
    if gone and result.observed_s < max(MIN_EVIDENCE_S, 0.5 * duration_s):
        exit_code = EXIT_TARGET_GONE
    elif any(c.probe == "pyspy" and c.status == "failed" and c.meta.get("error_kind") == "permission_denied"
             for c in result.captures):
        exit_code = EXIT_NOT_PERMITTED      # the stacks are the core of a diagnosis: say it was refused
    if result.interrupted:
        exit_code = EXIT_INTERRUPTED
    return Diagnosis(rep, ev, result.captures, exit_code, context)

