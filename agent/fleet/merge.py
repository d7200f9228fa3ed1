"""One job report from the node reports of `diagnose --slurm-job` (pure: node payloads in, a dict out).

The job model. Ranks step in lockstep (every step ends in a collective), so the job's step time T
is the slowest rank's. A straggler is a rank whose own step is stalled (waiting for or loading data,
host syncs) while the others wait for it in collectives. When the stragglers are fixed:
  - a straggler's step becomes T / S, S the expected speedup of its top finding;
  - a non-straggler rank's step cannot fall below its own work, T * (1 - c), c its collective
    wait share: that wait is the straggler's cost to it, and all it can gain.
So the job's step after the fixes is max(T / S_i over stragglers, T * (1 - c_j) over the others),
and the job's expected speedup is the inverse of that share of T.
"""
from __future__ import annotations

import time
from typing import Any

from trainprobe.agent import __version__

SCHEMA = "trainprobe.job-report/1"
STRAGGLER_OWN_STALL = 0.10      # a straggler's own stall (data + host sync) share, at least
STRAGGLER_LEAD = 0.5            # and at least this share of the worst rank's stall
WAITS_FOR_SHARE = 0.2          # a non-straggler waiting this much in collectives waits for the stragglers


def _own_stall(row: dict[str, Any]) -> float:
    return (row.get("data_share") or 0.0) + (row.get("host_sync_share") or 0.0)


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


def find_stragglers(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    known = [r for r in rows if r.get("data_share") is not None]
    if len(known) < 1:
        return []
    worst = max(_own_stall(r) for r in known)
    if worst < STRAGGLER_OWN_STALL:
        return []
    # A straggler is named by its stall alone: how much its fix is worth on this host is the job
    # speedup's business (a rank short of CPUs still holds the others back).
    out = [r for r in known if _own_stall(r) >= max(STRAGGLER_OWN_STALL, STRAGGLER_LEAD * worst)]
    return sorted(out, key=lambda r: -_own_stall(r))


def job_speedup(rows: list[dict[str, Any]], stragglers: list[dict[str, Any]]) -> tuple[float | None, str]:
    if not stragglers:
        return None, "no straggler: no rank's own stall stands out, so the lockstep model predicts nothing"
    key = {(r["node"], r["pid"]) for r in stragglers}
    parts, bound = [], []
    for s in stragglers:
        share = 1.0 / max(float(s["expected_speedup"]), 1.0)
        parts.append(share)
        bound.append(f"straggler {s['node']} rank {s.get('rank')}: step / {s['expected_speedup']:g} ({s['top_finding']})")
    others = [r for r in rows if (r["node"], r["pid"]) not in key]
    for r in others:
        c = r.get("collective_share")
        if c is None:
            bound.append(f"{r['node']} rank {r.get('rank')}: collective wait unknown, not bounded by it")
            continue
        parts.append(1.0 - c)
        bound.append(f"{r['node']} rank {r.get('rank')}: waits {c:.2f} of its step in collectives, so its own "
                     f"work is {1 - c:.2f} of the step")
    new_share = max(parts)
    return round(1.0 / max(new_share, 1e-3), 2), ("job step after the fixes = max(" + "; ".join(bound)
                                                  + f") = {new_share:.2f} of today's step (ranks step in lockstep)")


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
    stragglers = find_stragglers(rows)
    speedup, bound = job_speedup(rows, stragglers)
    key = {(x["node"], x["pid"]) for x in stragglers}
    for r in rows:
        # A rank's own node sees no cause for its wait (its rules may even call it compute bound):
        # the job view names whom it waits for.
        if stragglers and (r["node"], r["pid"]) not in key and (r.get("collective_share") or 0.0) >= WAITS_FOR_SHARE:
            r["waits_for"] = [f"{x['node']} rank {x.get('rank')}" for x in stragglers]
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
        "ranks": rows,
        "stragglers": [{"node": s["node"], "rank": s.get("rank"), "pid": s["pid"], "cause": s.get("top_finding"),
                        "title": s.get("top_title"), "expected_speedup": s.get("expected_speedup"),
                        "data_share": s.get("data_share"), "host_sync_share": s.get("host_sync_share")}
                       for s in stragglers],
        "job_expected_speedup": speedup,
        "job_speedup_bound": bound,
        "exit_code": exit_code,
        "notes": out_notes,
        "node_reports": reports,
    }
