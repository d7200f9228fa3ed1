"""`trainprobe preflight`: is this node fit to run a training job, and if not, why?

Reads come from the preflight probes (host, gpuhealth, gpubench) and are stored raw; checks are pure
functions of those reads and of a profile (the node type's expectations, as data). Every check
gives a status (ok, warn, critical, unknown), what it observed against what it expected, a
remediation line and how long it took. The node's status is the worst status of its checks.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

STATUSES = ("ok", "unknown", "warn", "critical")          # in order of severity
SEVERITY = {s: i for i, s in enumerate(STATUSES)}
# Nagios plugin codes, which GCM and NHC-style tooling share.
EXIT_CODES = {"ok": 0, "warn": 1, "critical": 2, "unknown": 3}


def worst(statuses: list[str]) -> str:
    return max(statuses, key=lambda s: SEVERITY[s]) if statuses else "ok"


@dataclass
class Result:
    """What one check concluded about one target (the node, a GPU, a path)."""

    status: str
    observed: str
    expected: str
    message: str
    remediation: str | None = None
    target: str | None = None
    value: float | int | None = None      # the main observed number, for metrics
    unit: str | None = None
    source: str | None = None             # the file, API or command the observation came from
    details: dict[str, Any] = field(default_factory=dict)
    duration_s: float | None = None       # set by a check that knows its own read time

    def __post_init__(self) -> None:
        if self.status not in SEVERITY:
            raise ValueError(f"bad status {self.status!r}")


@dataclass
class Record:
    """One line of the preflight report: a Result with its check id, category and timing."""

    check: str
    category: str
    result: Result
    duration_s: float
    timed_out: bool = False
    informational: bool = False

    def to_dict(self) -> dict[str, Any]:
        r = self.result
        return {
            "check": self.check, "category": self.category, "target": r.target, "status": r.status,
            "observed": r.observed, "expected": r.expected, "message": r.message,
            "remediation": r.remediation if r.status != "ok" else None,
            "value": r.value, "unit": r.unit, "source": r.source,
            "duration_s": round(self.duration_s, 6), "timed_out": self.timed_out,
            "informational": self.informational, "details": r.details,
        }


GIB = float(1 << 30)


def gib(nbytes: float | int | None) -> str:
    if nbytes is None:
        return "?"
    g = nbytes / GIB
    if g >= 10:
        return f"{g:.0f} GiB"
    if g >= 1:
        return f"{g:.1f} GiB"
    if nbytes >= 1 << 20:
        return f"{nbytes / (1 << 20):.0f} MiB"
    return f"{nbytes / 1024:.0f} KiB"
