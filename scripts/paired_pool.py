"""Pooling paired runs of the agent's cost (`benchmarks/gpu_cost.py --design paired`): each run's mean
log ratio (attached/detached) with its standard error, inverse-variance weighted; a random-effects
interval (DerSimonian-Laird) where the runs disagree beyond their own errors. The command is
benchmarks/pool_paired.py (docs/cost.md)."""
from __future__ import annotations

import gzip
import json
import math
from pathlib import Path
from typing import Any

Z95 = 1.96


def load(path: Path) -> dict[str, Any]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return json.load(f)


def as_is(run: dict[str, Any]) -> bool:
    """A run of the job as it is: no --job-env, no --job-cmd (the one-thread, pinned and other variants)."""
    args = run.get("args") or {}
    return not (args.get("job_env") or args.get("job_cmd"))


def factor(arm: dict[str, Any], name: str) -> tuple[int, float, float] | None:
    """(n, ratio, sd_log) of one factor of an arm: the whole steps/s ratio or a split factor."""
    x = arm if name == "steps/s" else arm.get(name)
    if not isinstance(x, dict) or not x.get("n") or x.get("ratio") is None or not x.get("sd_log"):
        return None
    return int(x["n"]), float(x["ratio"]), float(x["sd_log"])


def pool(runs: list[tuple[int, float, float]]) -> dict[str, Any]:
    """Inverse-variance pooling of mean log ratios; random effects where the runs disagree."""
    ys = [math.log(r) for _, r, _ in runs]
    vs = [sd * sd / n for n, _, sd in runs]
    ws = [1.0 / v for v in vs]
    W = sum(ws)
    m = sum(w * y for w, y in zip(ws, ys)) / W
    se = 1.0 / math.sqrt(W)
    q = sum(w * (y - m) ** 2 for w, y in zip(ws, ys))
    k = len(runs)
    out = {"runs": k, "pairs": sum(n for n, _, _ in runs), "ratio": math.exp(m),
           "ci95": (math.exp(m - Z95 * se), math.exp(m + Z95 * se)), "q": q, "df": k - 1}
    tau2 = max(0.0, (q - (k - 1)) / (W - sum(w * w for w in ws) / W)) if k > 1 else 0.0
    if tau2 > 0:
        wr = [1.0 / (v + tau2) for v in vs]
        mr = sum(w * y for w, y in zip(wr, ys)) / sum(wr)
        ser = 1.0 / math.sqrt(sum(wr))
        out["random"] = {"ratio": math.exp(mr), "ci95": (math.exp(mr - Z95 * ser), math.exp(mr + Z95 * ser)),
                         "tau": math.sqrt(tau2)}
    # Pairs that would resolve 1% (half-width of the 95% interval) at the runs' pooled spread.
    sd_pooled = math.sqrt(sum((n - 1) * sd * sd for n, _, sd in runs) / max(1, sum(n - 1 for n, _, _ in runs)))
    out["pairs_for_1pct"] = math.ceil((Z95 * sd_pooled / math.log(1.01)) ** 2)
    return out
