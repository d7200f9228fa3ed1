"""Findings and fixes: what a rule returns, in the shape of the report contract."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

CONFIDENCES = ("high", "medium", "low")
RISKS = ("low", "medium", "high")

# The finding ids of the report contract (../shared/REPORT-CONTRACT.md). Users script against them.
FINDING_IDS = (
    "dataloader.starved", "h2d.pageable", "host.sync", "host.launch_bound", "cpu.oversubscribed",
    "gil.contention", "io.small_reads", "numa.remote", "pcie.degraded", "cpu.memory_bound",
    "compute.bound",
    "cpu.contended",
    "rank.straggler",
)


@dataclass
class Fact:
    probe: str
    fact: str
    value: Any = None

    def to_dict(self) -> dict[str, Any]:
        return {"probe": self.probe, "fact": self.fact, "value": self.value}


@dataclass
class Fix:
    title: str
    change: str | None = None
    command: str | None = None
    # Machine-readable settings the fix changes, e.g. {"num_workers": 12, "pin_memory": True}: a
    # harness (benchmarks/ledger.py) or a user's script applies exactly what was printed.
    knobs: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        d = {"title": self.title, "change": self.change, "command": self.command}
        if self.knobs:
            d["knobs"] = dict(self.knobs)
        return d


@dataclass
class Finding:
    id: str
    title: str
    expected_speedup: float
    speedup_bound: str
    confidence: str
    evidence: list[Fact] = field(default_factory=list)
    fixes: list[Fix] = field(default_factory=list)
    risk: str = "low"                 # risk of applying the fix: ranks ties
    details: dict[str, Any] = field(default_factory=dict)
    # (low, high): where the measured speedup of the fix is expected to fall (docs/models.md). None:
    # the default band of an uncalibrated estimate around expected_speedup.
    interval: tuple[float, float] | None = None
    # Where the fix is expected to slow the job, with the whole of its interval below 1.0x: the step
    # model's figure and interval (a thread cap on 2 CPUs that a mobilenet's loop needs: 0.70x,
    # 0.62-0.79x). expected_speedup stays at the contract's 1.0x floor; this says by how much the
    # fix would cost. Set from the figures the rule passes; None where a gain is possible.
    expected_change: float | None = None
    expected_change_interval: tuple[float, float] | None = None

    def __post_init__(self) -> None:
        if self.id not in FINDING_IDS:
            raise ValueError(f"unknown finding id {self.id!r}: add it to the contract first")
        if self.confidence not in CONFIDENCES:
            raise ValueError(f"confidence must be one of {CONFIDENCES}")
        if self.risk not in RISKS:
            raise ValueError(f"risk must be one of {RISKS}")
        raw = float(self.expected_speedup)
        if self.expected_change is None and self.interval is not None and raw < 1.0 and float(self.interval[1]) < 1.0:
            self.expected_change = round(raw, 2)
            self.expected_change_interval = (round(max(0.0, float(self.interval[0])), 2),
                                             round(float(self.interval[1]), 2))
        self.expected_speedup = round(max(1.0, raw), 2)
        if self.interval is None:
            lo, hi = default_interval(self.expected_speedup, self.confidence)
        else:
            lo, hi = self.interval
        # The low end may lie under 1.0x: a fix can slow the job (a thread cap on shared CPUs).
        lo, hi = max(0.0, float(lo)), max(1.0, float(hi))
        self.interval = (round(min(lo, self.expected_speedup), 2), round(max(hi, self.expected_speedup), 2))

    def to_dict(self) -> dict[str, Any]:
        d = {
            "id": self.id, "title": self.title, "expected_speedup": self.expected_speedup,
            "speedup_bound": self.speedup_bound, "confidence": self.confidence,
            "evidence": [e.to_dict() for e in self.evidence], "fixes": [f.to_dict() for f in self.fixes],
            "risk": self.risk, "expected_speedup_interval": list(self.interval or ()),
        }
        if self.expected_change is not None:
            d["expected_change"] = self.expected_change
            d["expected_change_interval"] = list(self.expected_change_interval or ())
        if self.details:
            d["details"] = self.details
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Finding":
        return cls(id=d["id"], title=d["title"], expected_speedup=d["expected_speedup"],
                   speedup_bound=d["speedup_bound"], confidence=d["confidence"],
                   evidence=[Fact(**e) for e in d.get("evidence", [])],
                   fixes=[Fix(**f) for f in d.get("fixes", [])], risk=d.get("risk", "low"),
                   details=d.get("details", {}),
                   interval=tuple(d["expected_speedup_interval"]) if d.get("expected_speedup_interval") else None,
                   expected_change=d.get("expected_change"),
                   expected_change_interval=(tuple(d["expected_change_interval"])
                                             if d.get("expected_change_interval") else None))


# Half-width, in log space, of the band given to a number no ledger entry has calibrated yet.
UNCALIBRATED_LOG_BAND = {"high": 0.22, "medium": 0.35, "low": 0.5}


def default_interval(speedup: float, confidence: str) -> tuple[float, float]:
    """The band of an uncalibrated estimate: the gain above 1.0 scaled down and up by the
    confidence's factor (a 1.0x finding stays 1.0x)."""
    import math
    k = math.exp(UNCALIBRATED_LOG_BAND.get(confidence, 0.5))
    gain = max(speedup, 1.0)
    return 1.0 + (gain - 1.0) / k, 1.0 + (gain - 1.0) * k


def interval_text(f: "Finding | dict[str, Any]") -> str:
    iv = f.interval if isinstance(f, Finding) else f.get("expected_speedup_interval")
    if not iv:
        return ""
    return f"{iv[0]:.2f}-{iv[1]:.2f}x"


def pct(x: float) -> str:
    return f"{100.0 * x:.0f}%"
