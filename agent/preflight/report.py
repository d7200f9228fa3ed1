"""The preflight report document, the node's status, and the exit-code policies."""
from __future__ import annotations

import os
from typing import Any

from trainprobe.agent import __version__
from trainprobe.agent.preflight import EXIT_CODES, STATUSES, Record, worst

SCHEMA = "trainprobe.preflight/1"
DRAIN_PREFIX = "trainprobe:"
DRAIN_REASON_MAX = 120


def node_status(records: list[Record]) -> str:
    return worst([r.result.status for r in records if not r.informational])


def exit_code(status: str, slurm: bool) -> int:
    """Nagios codes (0 ok, 1 warn, 2 critical, 3 unknown). For Slurm, which drains a node on any
    non-zero prolog or health-check exit, only critical is non-zero: warn and unknown pass."""
    if slurm:
        return EXIT_CODES["critical"] if status == "critical" else 0
    return EXIT_CODES[status]


def _label(rec: dict[str, Any]) -> str:
    return rec["check"] + (f"[{rec['target']}]" if rec.get("target") else "")


def drain_reason(checks: list[dict[str, Any]], prefix: str = DRAIN_PREFIX, limit: int = DRAIN_REASON_MAX) -> str | None:
    """One line for `scontrol update State=DRAIN Reason=...`: the first critical check, and how many more."""
    crit = [c for c in checks if c["status"] == "critical" and not c.get("informational")]
    if not crit:
        return None
    more = f" (+{len(crit) - 1} more)" if len(crit) > 1 else ""
    text = f"{prefix} {_label(crit[0])}: {crit[0]['message']}"
    text = " ".join(text.split())  # one line, whatever the message held
    room = limit - len(more)
    if len(text) > room:
        text = text[:room - 3].rstrip() + "..."
    return text + more


def build(raw: dict[str, Any], records: list[Record], profile: dict[str, Any], slurm: bool,
          duration_s: float, replayed_from: str | None = None) -> dict[str, Any]:
    checks = [r.to_dict() for r in records]
    status = node_status(records)
    counts = {s: 0 for s in STATUSES}
    for c in checks:
        if not c["informational"]:
            counts[c["status"]] += 1
    host = dict(raw.get("host") or {})
    return {
        "schema": SCHEMA,
        "tool": {"name": "trainprobe", "version": __version__},
        "command": "preflight",
        "host": {"hostname": host.get("hostname"), "kernel": host.get("kernel")},
        "profile": {"name": profile.get("name"), "source": os.path.relpath(profile["source"])
                    if profile.get("source", "").startswith(os.getcwd()) else profile.get("source"),
                    "description": profile.get("description")},
        "tiers": (raw.get("context") or {}).get("tiers", []),
        "started_unix": raw.get("created_unix"),
        "duration_s": round(duration_s, 3),
        "replayed_from": replayed_from,
        "status": status,
        "exit_code": exit_code(status, slurm),
        "exit_policy": "slurm" if slurm else "nagios",
        "counts": counts,
        "drain_reason": drain_reason(checks),
        "checks": checks,
    }
