"""compute.bound: no host-side stall dominates; the step is bound by its device's compute.

It runs after every other rule and fires only when none of them found a gain worth acting on, so
a healthy job gets one clear answer instead of noise.
"""
from __future__ import annotations

from agent.evidence import Evidence
from agent.findings import Fact, Finding, pct
from agent.rules import rule

WORTH_ACTING = 1.10           # a host-side finding below this gain does not count as a stall
COMPUTE_SHARE = 0.60          # forward + backward + optimizer share of the training thread


@rule("compute.bound", requires=("pyspy",), uses=("process", "gpu"),
      description="nothing on the host holds the step back: compute dominates")
def compute_bound(ev: Evidence) -> Finding | None:
    others = [f for f in ev.context.get("findings", []) if f.expected_speedup >= WORTH_ACTING]
    if others:
        return None
    tt = (ev.get("pyspy") or {}).get("training_thread")
    if not tt:
        return None
    bd = tt["breakdown"]
    compute = bd.get("forward", 0.0) + bd.get("backward", 0.0) + bd.get("optimizer", 0.0)
    gpu = ev.get("gpu") or {}
    busy = gpu.get("busy_fraction")
    facts = [Fact("pyspy", "share of the training thread in forward, backward and optimizer", round(compute, 3)),
             Fact("pyspy", "share waiting for or loading batches",
                  round(bd.get("data_wait", 0.0) + bd.get("data_load", 0.0), 3))]
    if busy is not None:
        facts.insert(0, Fact("gpu", "share of the window the GPU was busy", busy))
        device_busy = busy >= 0.85
    else:
        device_busy = False
    if not device_busy and compute + bd.get("host_sync", 0.0) < COMPUTE_SHARE:
        return None
    where = "the GPU" if busy is not None else "the CPU (no GPU in use)"
    title = (f"The step is compute-bound on {where}: nothing on the host to fix "
             f"({pct(busy if busy is not None else compute)} busy)")
    bound = ("1.0 by definition: no host-side stall above "
             f"{WORTH_ACTING:.2f}x was found; faster steps need less compute per step or a faster device")
    return Finding("compute.bound", title, 1.0, bound, "high" if device_busy or compute >= 0.8 else "medium",
                   facts, [], risk="low")
