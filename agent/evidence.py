"""Evidence: what the probes saw over one window, parsed, plus how each probe fared.

Rules read only this. It is built from Captures (live or replayed from a bundle) by running each
probe's pure parser; a parser that fails is recorded like a probe that failed. Evidence put in from
elsewhere (a JSON document) gets the key types its probe's schema declares (probes/schema.py): a
GPU index is an int, whichever way the evidence came.
"""
from __future__ import annotations

import time
import traceback
from dataclasses import dataclass, field
from typing import Any

from trainprobe.probes import schema
from trainprobe.probes.base import Capture
from trainprobe.probes.registry import probe_class


@dataclass
class ProbeRecord:
    name: str
    status: str
    reason: str | None
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "status": self.status, "reason": self.reason,
                "seconds": round(self.seconds, 3)}


@dataclass
class Evidence:
    parsed: dict[str, dict[str, Any]] = field(default_factory=dict)
    records: dict[str, ProbeRecord] = field(default_factory=dict)
    context: dict[str, Any] = field(default_factory=dict)   # target pid, window, host facts
    notes: list[str] = field(default_factory=list)          # observations of rules that are not findings
    parse_cpu_s: dict[str, float] = field(default_factory=dict)   # each parser's CPU (the agent's own cost)

    def note(self, text: str) -> None:
        """An informational line for the report's notes (a rule may add one whether or not it fires)."""
        if text not in self.notes:
            self.notes.append(text)

    def put(self, name: str, parsed: dict[str, Any]) -> None:
        """Keep a probe's evidence, with the integer keys JSON made strings (GPU indices) given
        back as ints where the probe's `evidence_schema` declares them."""
        cls = probe_class(name)
        declared = cls.evidence_schema if cls is not None else None
        self.parsed[name] = schema.from_json(parsed, declared) if declared is not None else parsed

    def get(self, name: str) -> dict[str, Any] | None:
        return self.parsed.get(name)

    def has(self, name: str) -> bool:
        return name in self.parsed

    def why_missing(self, name: str) -> str:
        rec = self.records.get(name)
        if rec is None:
            return f"{name}: not run"
        return f"{name}: {rec.status}" + (f" ({rec.reason})" if rec.reason else "")


def build(captures: list[Capture], context: dict[str, Any] | None = None) -> Evidence:
    ev = Evidence(context=dict(context or {}))
    for cap in captures:
        rec = ProbeRecord(cap.probe, cap.status, cap.reason, cap.seconds)
        if cap.status in ("ok", "timeout") and cap.artifacts:
            cls = probe_class(cap.probe)
            if cls is None:
                rec.status, rec.reason = "failed", f"no parser for probe {cap.probe!r}"
            else:
                c0 = time.thread_time()
                try:
                    ev.put(cap.probe, cls.parse(cap))
                except Exception as exc:  # noqa: BLE001 - one broken parser never sinks the report
                    rec.status = "failed"
                    last = traceback.extract_tb(exc.__traceback__)[-1]
                    rec.reason = f"could not parse its output: {type(exc).__name__}: {exc} " \
                                 f"({last.filename.rsplit('/', 1)[-1]}:{last.lineno})"
                ev.parse_cpu_s[cap.probe] = round(time.thread_time() - c0, 4)
        ev.records[cap.probe] = rec
    return ev
