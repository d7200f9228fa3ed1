"""node_exporter textfile-collector view of a preflight report (the `.prom` text format).

The exposition is made by prometheus_client (one CollectorRegistry holding a collector of this
report, rendered by generate_latest), so its escaping and format are the client library's.
Written by reports.output (form ("preflight", "prometheus")): atomically, because node_exporter
may read the directory at any moment and must never see half a file.
"""
from __future__ import annotations

from typing import Any, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily

STATUS_VALUE = {"ok": 0, "warn": 1, "critical": 2, "unknown": 3}
PREFIX = "trainprobe_preflight"
CHECK_LABELS = ("check", "category", "target", "informational")
NODE_LABELS = ("hostname", "profile")


class PreflightCollector:
    """The gauges of one preflight report, for a CollectorRegistry."""

    def __init__(self, report: dict[str, Any]):
        self.report = report

    def collect(self) -> Iterator[GaugeMetricFamily]:
        rep = self.report
        checks = rep.get("checks", [])

        def family(name: str, help_: str, labels: tuple[str, ...],
                   samples: list[tuple[list[str], float | int]]) -> GaugeMetricFamily:
            g = GaugeMetricFamily(f"{PREFIX}_{name}", help_, labels=list(labels))
            for values, v in samples:
                g.add_metric(values, v)
            return g

        def lab(c: dict[str, Any]) -> list[str]:
            return [str(c["check"]), str(c["category"]), str(c.get("target") or ""),
                    "true" if c.get("informational") else "false"]

        yield family("check_status", "Status of one check: 0 ok, 1 warn, 2 critical, 3 unknown.", CHECK_LABELS,
                     [(lab(c), STATUS_VALUE[c["status"]]) for c in checks])
        yield family("check_value", "The main number a check observed, in the unit labelled.",
                     CHECK_LABELS + ("unit",),
                     [(lab(c) + [str(c.get("unit") or "")], c["value"]) for c in checks
                      if isinstance(c.get("value"), (int, float)) and not isinstance(c.get("value"), bool)])
        yield family("check_duration_seconds", "How long the check took, its reads included.", CHECK_LABELS,
                     [(lab(c), float(c["duration_s"])) for c in checks])
        yield family("check_timed_out", "1 when a read the check needed did not answer within its timeout.",
                     CHECK_LABELS, [(lab(c), int(bool(c.get("timed_out")))) for c in checks])
        node = [str(rep.get("host", {}).get("hostname") or ""), str(rep.get("profile", {}).get("name") or "")]
        yield family("status", "The node's status, the worst of its checks: 0 ok, 1 warn, 2 critical, 3 unknown.",
                     NODE_LABELS, [(node, STATUS_VALUE[rep["status"]])])
        yield family("exit_code", "The exit code preflight returned under its exit policy.", NODE_LABELS,
                     [(node, rep["exit_code"])])
        yield family("duration_seconds", "How long the whole preflight run took.", NODE_LABELS,
                     [(node, float(rep["duration_s"]))])
        yield family("last_run_timestamp_seconds", "When preflight ran (Unix time).", NODE_LABELS,
                     [(node, float(rep.get("started_unix") or 0.0))])


def registry(report: dict[str, Any]) -> CollectorRegistry:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(PreflightCollector(report))
    return reg


def render(report: dict[str, Any]) -> str:
    return generate_latest(registry(report)).decode("utf-8")
