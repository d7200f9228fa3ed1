"""Ranking findings: a pure function of each finding's expected speedup, confidence and risk.

The contract ranks by expected speedup, largest first. Ties (within 0.05x) go to the finding we
are surer of, then to the fix that is safer to apply. compute.bound (1.0x by definition) sorts
after any finding with a gain.
"""
from __future__ import annotations

from agent.findings import Finding

CONFIDENCE_ORDER = {"high": 0, "medium": 1, "low": 2}
RISK_ORDER = {"low": 0, "medium": 1, "high": 2}


def rank(findings: list[Finding]) -> list[Finding]:
    return sorted(findings, key=lambda f: (-round(f.expected_speedup * 20) / 20, CONFIDENCE_ORDER[f.confidence],
                                           RISK_ORDER[f.risk], -f.expected_speedup, f.id))
