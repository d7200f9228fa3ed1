"""One job report from the node reports of `diagnose --slurm-job` (pure: node payloads in, a dict out).

The job model (agent/combiners/stragglers.py, docs/models.md). Ranks step in lockstep (every step
ends in a collective), so every rank waits there for the slowest: the straggler is the rank that
waits least, its excess is the others' wait minus its own, and made as fast as the others the
job's step shrinks by that excess: a speedup of 1 / (1 - excess). It is named whenever the
asymmetry is outside py-spy's sampling error, whatever its cause; then its cause is read from the
probes of its own node (data, syncs, CPU quota, other processes on its CPUs, fewer CPUs, its own
host code, its GPU's clocks), each with its fix and the job speedup if it alone were removed.
"""
from __future__ import annotations

import time
from typing import Any

from trainprobe.agent import __version__
from trainprobe.agent.combiners import stragglers as straggler_model

SCHEMA = "trainprobe.job-report/1"
ROW_HOT_FUNCTIONS = 5            # hottest functions kept per rank in the job report (the model reads more)


def node_entry(payload: dict[str, Any]) -> dict[str, Any]:
    """The job report's summary of one node (fixes, numactl lines, skipped probes)."""
    fixes, numactl, skipped = [], [], []
    for t in payload.get("targets", []):
        rep = t.get("report") or {}
        for f in rep.get("findings", []):
            for fx in f.get("fixes", []):
                entry = {"finding": f.get("id"), "title": fx.get("title"), "change": fx.get("change"),
                         "command": fx.get("command"), "expected_speedup": f.get("expected_speedup")}
                if entry not in fixes:
                    fixes.append(entry)
                if fx.get("command") and "numactl" in fx["command"] and fx["command"] not in numactl:
                    numactl.append(fx["command"])
        for p in rep.get("probes", []):
            if p.get("status") != "ok":
                line = f"{p.get('name')}: {p.get('status')}" + (f" ({p['reason']})" if p.get("reason") else "")
                if line not in skipped:
                    skipped.append(line)
    return {"node": payload.get("node"), "status": payload.get("status", "failed"), "reason": payload.get("reason"),
            "hostname": payload.get("hostname"), "slurm_state": payload.get("slurm_state"),
            "slurmd_alive": payload.get("slurmd_alive"), "slurmd_note": payload.get("slurmd_note"),
            "exit_code": payload.get("exit_code", 0),
            "targets": [t.get("target", {}).get("pid") for t in payload.get("targets", [])],
            "fixes": fixes, "numactl": numactl, "probes_not_ok": skipped}


def _finding_for(row: dict[str, Any], cause: str) -> str | None:
    """The node finding that speaks of a straggler's cause, where its node has one."""
    want = {"data": "dataloader.starved", "host_sync": "host.sync", "cpu_contended": "cpu.contended",
            "numa": "numa.remote"}.get(cause)
    ids = [f.get("id") for f in row.get("findings") or []]
    return want if want in ids else (row.get("top_finding") if cause == "unexplained" else None)


def _public_row(r: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in r.items() if k not in ("node_facts", "findings")}
    hot = r.get("hot_functions") or {}
    out["hot_functions"] = dict(list(hot.items())[:ROW_HOT_FUNCTIONS])
    return out


def merge(job_id: str, payloads: list[dict[str, Any]], window_s: float | None = None,
          nodes: list[str] | None = None, notes: list[str] | None = None) -> dict[str, Any]:
    """payloads: one per node (the node agent's JSON, or {"node", "status", "reason"} for a node
    that gave none). `nodes` lists every node asked, so a node that gave nothing is still named."""
    by_node = {p.get("node"): p for p in payloads}
    for n in nodes or []:
        if n not in by_node:
            by_node[n] = {"node": n, "status": "no_report", "reason": "no report came back", "exit_code": 3}
    order = list(nodes or []) + sorted(n for n in by_node if n not in (nodes or []))
    node_entries, rows, reports, out_notes = [], [], {}, list(notes or [])
    for n in order:
        p = by_node[n]
        node_entries.append(node_entry(p))
        reports[n] = [t.get("report") for t in p.get("targets", []) if t.get("report")]
        for t in p.get("targets", []):
            rows.extend(dict(r) for r in t.get("rows", []))
        if p.get("slurmd_note"):
            out_notes.append(p["slurmd_note"])
    rows.sort(key=lambda r: (r["rank"] is None, r["rank"] if r["rank"] is not None else 0, r["node"], r["pid"]))
    verdict = straggler_model.analyse(rows)
    strag_out = []
    for s in verdict["stragglers"]:
        row = next((r for r in rows if r["pid"] == s["pid"] and r["node"] == s["node"]), {})
        strag_out.append({**s, "finding": _finding_for(row, s["cause"]),
                          "expected_speedup": s["job_expected_speedup"],
                          "data_share": row.get("data_share"), "host_sync_share": row.get("host_sync_share")})
    for r, per in zip(rows, verdict["per_rank"]):
        r["own_work_share"] = per.get("own_work_share")
        for k in ("straggler", "excess_share", "cause", "fix", "waits_for"):
            if k in per:
                r[k] = per[k]
    ok = [e for e in node_entries if e["status"] == "ok"]
    for e in node_entries:
        if e["status"] != "ok":
            out_notes.append(f"node {e['node']}: {e['status']}: {e['reason']}; the job report stands on the other nodes")
    exit_code = 0
    if not ok:
        codes = [e["exit_code"] for e in node_entries if e.get("exit_code")]
        exit_code = codes[0] if codes else 3
    return {
        "schema": SCHEMA,
        "tool": {"name": "trainprobe", "version": __version__},
        "command": "diagnose",
        "created_unix": round(time.time(), 3),
        "job": {"id": str(job_id), "nodes": order, "nodes_ok": [e["node"] for e in ok]},
        "window": {"seconds": window_s},
        "nodes": node_entries,
        "ranks": [_public_row(r) for r in rows],
        "stragglers": strag_out,
        "job_expected_speedup": verdict["job_expected_speedup"],
        "job_speedup_bound": verdict["job_speedup_bound"],
        "no_straggler_reason": verdict["no_straggler_reason"],
        "exit_code": exit_code,
        "notes": out_notes,
        "node_reports": reports,
    }
