"""node_exporter textfile-collector view of a preflight report (the `.prom` text format).

Written atomically (a temporary file in the same directory, then rename), because node_exporter
may read the directory at any moment and must never see half a file.
"""
from __future__ import annotations

from typing import Any

STATUS_VALUE = {"ok": 0, "warn": 1, "critical": 2, "unknown": 3}
PREFIX = "trainprobe_preflight"


def _esc(v: Any) -> str:
    return str("" if v is None else v).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(**kv: Any) -> str:
    return "{" + ",".join(f'{k}="{_esc(v)}"' for k, v in kv.items()) + "}"


def _num(v: float | int) -> str:
    return repr(float(v)) if isinstance(v, float) else str(int(v))


def render(report: dict[str, Any]) -> str:
    host = report.get("host", {}).get("hostname")
    profile = report.get("profile", {}).get("name")
    lines: list[str] = []

    def metric(name: str, help_: str, samples: list[tuple[str, float | int]]) -> None:
        lines.append(f"# HELP {PREFIX}_{name} {help_}")
        lines.append(f"# TYPE {PREFIX}_{name} gauge")
        lines.extend(f"{PREFIX}_{name}{labels} {_num(v)}" for labels, v in samples)

    checks = report.get("checks", [])

    def lab(c: dict[str, Any], **extra: Any) -> str:
        return _labels(check=c["check"], category=c["category"], target=c.get("target") or "",
                       informational="true" if c.get("informational") else "false", **extra)

    metric("check_status", "Status of one check: 0 ok, 1 warn, 2 critical, 3 unknown.",
           [(lab(c), STATUS_VALUE[c["status"]]) for c in checks])
    metric("check_value", "The main number a check observed, in the unit labelled.",
           [(lab(c, unit=c.get("unit") or ""), c["value"]) for c in checks
            if isinstance(c.get("value"), (int, float)) and not isinstance(c.get("value"), bool)])
    metric("check_duration_seconds", "How long the check took, its reads included.",
           [(lab(c), float(c["duration_s"])) for c in checks])
    metric("check_timed_out", "1 when a read the check needed did not answer within its timeout.",
           [(lab(c), int(bool(c.get("timed_out")))) for c in checks])
    node = _labels(hostname=host or "", profile=profile or "")
    metric("status", "The node's status, the worst of its checks: 0 ok, 1 warn, 2 critical, 3 unknown.",
           [(node, STATUS_VALUE[report["status"]])])
    metric("exit_code", "The exit code preflight returned under its exit policy.", [(node, report["exit_code"])])
    metric("duration_seconds", "How long the whole preflight run took.", [(node, float(report["duration_s"]))])
    metric("last_run_timestamp_seconds", "When preflight ran (Unix time).",
           [(node, float(report.get("started_unix") or 0.0))])
    return "\n".join(lines) + "\n"


def write(report: dict[str, Any], path: str) -> None:
    from reports import output
    output.write(path, render(report), private=False)   # node_exporter's textfile collector reads it
