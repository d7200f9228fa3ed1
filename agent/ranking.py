"""Ranking findings: a pure function of each finding's expected speedup, confidence and risk.

A finding's rank score is its expected gain discounted by how sure we are of it: the gain above
1.0x scaled by CONFIDENCE_WEIGHT (a 2.0x finding at medium confidence scores 1.8x, as much as a
1.8x finding at high confidence). Ties (within 0.05x) go to the finding we are surer of, then to
the fix that is safer to apply. compute.bound (1.0x by definition) sorts after any finding with a
gain. The headline says in one line what the top finding is worth, and says plainly when no
finding is expected to give even 1.1x.
"""
from __future__ import annotations

from typing import Any

from trainprobe.agent.findings import Finding
from trainprobe.reports.values import slowdown_text

CONFIDENCE_ORDER = {"high": 0, "medium": 1, "low": 2}
CONFIDENCE_WEIGHT = {"high": 1.0, "medium": 0.8, "low": 0.6}
RISK_ORDER = {"low": 0, "medium": 1, "high": 2}
SMALL_GAIN = 1.10            # below this the headline says no fix is worth much


def score(f: Finding) -> float:
    return 1.0 + (f.expected_speedup - 1.0) * CONFIDENCE_WEIGHT[f.confidence]


def rank(findings: list[Finding]) -> list[Finding]:
    return sorted(findings, key=lambda f: (-round(score(f) * 20) / 20, CONFIDENCE_ORDER[f.confidence],
                                           RISK_ORDER[f.risk], -f.expected_speedup, f.id))


def headline(findings: list[dict[str, Any]], plan: dict[str, Any] | None = None) -> str:
    """One line for the top of every view of the report (findings ranked, as dicts). With a plan (fixes
    that interact, applied together: agent/report.py) the line leads with the plan."""
    if plan and plan.get("expected_speedup", 1.0) >= SMALL_GAIN:
        iv = plan.get("interval") or [plan["expected_speedup"]] * 2
        knobs = ", ".join(f"{k}={v}" for k, v in (plan.get("knobs") or {}).items())
        return (f"Plan: apply {knobs} together ({' + '.join(plan['findings'])}), expected "
                f"{plan['expected_speedup']:.2f}x (likely {iv[0]:.2f}-{iv[1]:.2f}x); the step is then set by "
                f"{plan.get('binding_words') or plan.get('binding')}")
    gains = [f for f in findings if f["id"] != "compute.bound"]
    if not findings:
        return "No finding: the evidence gathered does not point at a host-side cause."
    if not gains:
        if (findings[0].get("details") or {}).get("limit") == "loop":
            return "No fix found for what holds this job back: " + findings[0]["title"]
        return "Nothing on the host holds this job back: " + findings[0]["title"]
    top = gains[0]
    iv = top.get("expected_speedup_interval") or [top["expected_speedup"]] * 2
    if top["expected_speedup"] < SMALL_GAIN:
        if top.get("expected_change") is not None:
            return (f"No fix here is expected to speed the job up: {top['id']}'s fix "
                    f"{slowdown_text(top)}.")
        return (f"No fix here is expected to speed the job up by even {SMALL_GAIN:.1f}x: the best, {top['id']}, "
                f"is worth about {top['expected_speedup']:.2f}x ({iv[0]:.2f}-{iv[1]:.2f}x).")
    return (f"Top fix: {top['id']}, expected {top['expected_speedup']:.2f}x (likely {iv[0]:.2f}-{iv[1]:.2f}x, "
            f"confidence {top['confidence']}): {top['title']}")
