"""One diagnosis window's figures for a fix, and their spread over windows (`benchmarks/window_spread.py`:
how far one window's prediction moves within one run of a job; docs/ledger.md, sixteenth round)."""
from __future__ import annotations

import math
import statistics
from typing import Any


def window_row(rep: dict[str, Any], finding: str | None) -> dict[str, Any]:
    """One diagnosis: the finding's number and the step model's parts (the first finding with a step model
    when FINDING is None)."""
    fs = rep.get("findings") or []
    f = next((x for x in fs if (finding is None and (x.get("details") or {}).get("step_model"))
              or x["id"] == finding), None)
    sm = ((f or {}).get("details") or {}).get("step_model") or {}
    after = (sm.get("after") or {}).get("step")
    return {"top": fs[0]["id"] if fs else None, "finding": f and f["id"],
            "expected_speedup": f and f["expected_speedup"], "interval": f and f.get("expected_speedup_interval"),
            "model_speedup": round(1.0 / after, 3) if after else None,
            **{k: sm.get(k) for k in ("f_load", "f_wait", "f_eval", "C", "U", "L", "step_s", "par_measured")}}


def spread(xs: list[float]) -> dict[str, Any]:
    """n, the geometric mean, the standard deviation of log and the range of positive values."""
    xs = [x for x in xs if x]
    if not xs:
        return {"n": 0}
    logs = [math.log(x) for x in xs]
    return {"n": len(xs), "geomean": round(math.exp(statistics.fmean(logs)), 3),
            "sd_log": round(statistics.stdev(logs), 3) if len(xs) > 1 else None,
            "min": round(min(xs), 3), "max": round(max(xs), 3)}
