"""Whether one window's evidence can be trusted as a picture of the job's steady state.

A diagnosis is a share of one window. It misleads when the job was not the same job throughout the
window (its pace moved: an epoch boundary, an evaluation pass, a checkpoint), when something beside
it changed (a competing burst began or ended), or when too few samples were taken to pin the shares.
Each test reads evidence the default probes already gathered:

    samples   py-spy samples of the training thread: under MIN_SAMPLES, a share carries more than
              +-1/sqrt(n) ~ 0.1 of sampling error;
    pace      the window split in halves at its midpoint: the training thread's share waiting for
              data (data_wait + data_load) in each half, and the batches it took in each half
              (entries into the data categories of py-spy's timeline). A shift of PACE_SHARE in the
              wait share, or a batch rate that differs by PACE_RATE between halves, means the job's
              pace moved inside the window;
    pressure  the host's CPU pressure (PSI `some`): the 10 s average against the 60 s one. A gap of
              PRESSURE_GAP points means CPU pressure changed about the time of the window (a
              competing burst began or ended).
`--windows N` runs N windows and reports how their verdicts agree (agent/commands/diagnose.py).
"""
from __future__ import annotations

import math
from typing import Any

from trainprobe.agent.evidence import Evidence

MIN_SAMPLES = 100          # +-0.1 at 95% on a share in the worst case (p = 0.5)
PACE_SHARE = 0.25          # wait share that moved between the window's halves
PACE_RATE = 0.5            # batch rate of one half over the other's, off by this share
MIN_BATCHES = 6            # batches in each half before their rates are compared
PRESSURE_GAP = 20.0        # PSI cpu some: avg10 and avg60 this many points apart
DATA = ("data_wait", "data_load")


def _halves(timeline: list[list[Any]], t0: float, t1: float) -> tuple[dict[str, float], dict[str, float]] | None:
    """(first, second): for each half, {'wait': share of the half in DATA, 'batches': entries into DATA}."""
    if t1 - t0 <= 0 or not timeline:
        return None
    mid = (t0 + t1) / 2
    halves = [{"wait": 0.0, "batches": 0.0, "span": 0.0}, {"wait": 0.0, "batches": 0.0, "span": 0.0}]
    prev = None
    for a, b, cat in timeline:
        for i, (lo, hi) in enumerate(((t0, mid), (mid, t1))):
            overlap = max(0.0, min(b, hi) - max(a, lo))
            halves[i]["span"] += overlap
            if cat in DATA:
                halves[i]["wait"] += overlap
        if cat in DATA and prev not in DATA:
            halves[0 if a < mid else 1]["batches"] += 1
        prev = cat
    out = []
    for h in halves:
        if h["span"] <= 0:
            return None
        out.append({"wait": h["wait"] / h["span"], "batches": h["batches"], "seconds": h["span"]})
    return out[0], out[1]


def window_trust(ev: Evidence) -> dict[str, Any]:
    """{'trusted': bool, 'reasons': [one line each], 'checks': {name: measured values}}."""
    reasons: list[str] = []
    checks: dict[str, Any] = {}
    spy = ev.get("pyspy") or {}
    tt = spy.get("training_thread") or {}
    rate = spy.get("rate_hz")
    if tt and rate:
        n = int(round(float(tt.get("seconds") or 0.0) * float(rate)))
        checks["samples"] = {"training_thread": n, "min": MIN_SAMPLES}
        if n < MIN_SAMPLES:
            half = 1 / math.sqrt(n) if n else 1.0
            reasons.append(f"few samples: {n} py-spy samples of the training thread, so each share is "
                           f"+-{half:.2f} at best; watch longer (--duration)")
    halves = _halves(spy.get("timeline") or [], float(tt.get("observed_from") or 0.0),
                     float(tt.get("observed_to") or 0.0)) if tt else None
    if halves:
        a, b = halves
        checks["pace"] = {"wait_share": [round(a["wait"], 3), round(b["wait"], 3)],
                          "batches": [int(a["batches"]), int(b["batches"])]}
        if abs(a["wait"] - b["wait"]) >= PACE_SHARE:
            reasons.append(f"the job's pace moved: it waited for data {a['wait']:.0%} of the window's first half "
                           f"and {b['wait']:.0%} of its second")
        elif min(a["batches"], b["batches"]) >= MIN_BATCHES:
            ra, rb = a["batches"] / a["seconds"], b["batches"] / b["seconds"]
            if abs(ra - rb) / max(ra, rb) >= PACE_RATE:
                reasons.append(f"the job's pace moved: {ra:.1f} batches/s in the window's first half, "
                               f"{rb:.1f} in its second")
    cpu_some = (((ev.get("pressure") or {}).get("host") or {}).get("cpu") or {}).get("some") or {}
    if cpu_some.get("avg10") is not None and cpu_some.get("avg60") is not None:
        a10, a60 = float(cpu_some["avg10"]), float(cpu_some["avg60"])
        checks["cpu_pressure"] = {"avg10": a10, "avg60": a60}
        if abs(a10 - a60) >= PRESSURE_GAP:
            reasons.append(f"CPU pressure changed about the window: PSI cpu some {a10:.0f}% over the last 10 s, "
                           f"{a60:.0f}% over the last 60 s (a competing load began or ended)")
    return {"trusted": not reasons, "reasons": reasons, "checks": checks}
