"""Building the Report document (../shared/REPORT-CONTRACT.md). JSON is its canonical form;
the renderers in reports/ are views of the same dict."""
from __future__ import annotations

import os
import platform
import socket
from typing import Any

from trainprobe.agent import __version__
from trainprobe.agent.evidence import Evidence
from trainprobe.agent.findings import Finding
from trainprobe.agent.ranking import headline, rank
from trainprobe.agent.rules import RuleRun, run_rules

SCHEMA = "trainprobe.report/1"


def host_facts(ev: Evidence) -> dict[str, Any]:
    ctx = ev.context.get("host", {})
    gpu = ev.get("gpu") or {}
    topo = ev.get("topology") or {}
    return {
        "hostname": ctx.get("hostname") or socket.gethostname(),
        "cpus": ctx.get("cpus") or os.cpu_count(),
        "numa_nodes": topo.get("numa_node_count") or ctx.get("numa_nodes") or 1,
        "kernel": ctx.get("kernel") or platform.release(),
        "gpus": gpu.get("gpus", []),
    }


def target_facts(ev: Evidence) -> dict[str, Any]:
    proc = ev.get("process") or {}
    spy = ev.get("pyspy") or {}
    ctx = ev.context.get("target", {})
    workers: list[dict[str, Any]] = []
    confirmed = {w["pid"] for w in (spy.get("workers") or {}).get("per_worker", [])}
    for p in proc.get("processes", []):
        if p["role"] == "main":
            continue
        role = p["role"]
        if role == "dataloader_worker" and confirmed and p["pid"] not in confirmed and spy:
            role = "child"
        workers.append({"pid": p["pid"], "role": role, "parent": p.get("ppid"), "cpu_cores": p.get("cpu_cores"),
                        "alive_at_end": p.get("alive_at_end")})
    if not proc:
        workers = [{"pid": pid, "role": "dataloader_worker"} for pid in sorted(confirmed)]
    main = proc.get("main", {})
    return {
        "pid": ctx.get("pid") or proc.get("pid") or spy.get("pid"),
        "cmdline": main.get("cmdline") or ctx.get("cmdline"),
        "python": proc.get("python") or ctx.get("python"),
        "threads": main.get("num_threads") or ctx.get("threads"),
        "workers": workers,
        "requested_pid": ctx.get("requested_pid", ctx.get("pid")),
        "ranks": [{"pid": w["pid"]} for w in workers if w["role"] == "rank"],
    }


def gpu_facts(ev: Evidence) -> dict[str, Any] | None:
    """The target's GPUs over the window and what the training thread did while they idled."""
    gpu = ev.get("gpu")
    if not gpu:
        return None
    from trainprobe.agent.analysis import gpu_idle
    return {
        "target_gpus": gpu.get("target_gpus"), "sample_period_s": gpu.get("sample_period_s"),
        "busy_fraction": gpu.get("busy_fraction"), "idle_fraction": gpu.get("idle_fraction"),
        "idle_intervals": (gpu.get("idle_intervals") or [])[:50],
        "idle_attribution": gpu_idle.for_evidence(ev).to_dict(),
    }


def diagnose(ev: Evidence) -> tuple[list[Finding], list[RuleRun]]:
    findings, runs = run_rules(ev)
    return rank(findings), runs


def build(ev: Evidence, command: str, window: dict[str, Any], overhead: dict[str, Any],
          findings: list[Finding], rule_runs: list[RuleRun], notes: list[str] | None = None) -> dict[str, Any]:
    ranked = [f.to_dict() for f in findings]
    return {
        "schema": SCHEMA,
        "tool": {"name": "trainprobe", "version": __version__},
        "command": command,
        "host": host_facts(ev),
        "target": target_facts(ev),
        "window": window,
        "probes": [rec.to_dict() for rec in ev.records.values()],
        "gpu": gpu_facts(ev),
        "headline": headline(ranked),
        "findings": ranked,
        "overhead": overhead,
        "rules": [r.to_dict() for r in rule_runs],
        "notes": _dedupe(list(notes or []) + list((ev.get("gpu") or {}).get("notes", [])) + list(ev.notes)),
    }


def _dedupe(lines: list[str]) -> list[str]:
    seen: set[str] = set()
    return [x for x in lines if not (x in seen or seen.add(x))]
