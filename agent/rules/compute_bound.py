"""compute.bound: no host-side stall dominates; the step is bound by its device's compute.

It runs after every other rule (`after` names every host-side id) and fires only when none of them
found a gain worth acting on, so a healthy job gets one clear answer instead of noise.

Its confidence says what was excluded: high only when every plausible host cause was measured
and found small (the data wait by py-spy; run-queue delay and the GIL wait by the process probe's
per-thread CPU time and schedstat; the GPU's busy share by NVML for a CUDA job). Each cause not
measured lowers it to medium, and a busy Python thread beside the loop whose GIL share could not be
measured lowers it to low; the finding lists what was not measured.
"""
from __future__ import annotations

from trainprobe.agent.combiners.gil_wait import gil_wait, suspects
from trainprobe.agent.evidence import Evidence
from trainprobe.agent.findings import FINDING_IDS, Fact, Finding, pct
from trainprobe.agent.rules import rule

WORTH_ACTING = 1.10           # a host-side finding below this gain does not count as a stall
COMPUTE_SHARE = 0.60          # forward + backward + optimizer share of the training thread


@rule("compute.bound", requires=("pyspy",), uses=("process", "gpu"),
      description="nothing on the host holds the step back: compute dominates",
      after=tuple(i for i in FINDING_IDS if i != "compute.bound"))
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
    unmeasured = []
    gw = gil_wait(ev)
    if not ev.has("process"):
        unmeasured.append(("process", "run-queue delay and GIL waits (no per-thread CPU time: the process probe "
                                      "did not run)"))
    elif gw is None:
        unmeasured.append(("process", "GIL waits (the training thread's CPU time was not read)"))
    if (ev.get("process") or {}).get("uses_cuda") and busy is None:
        unmeasured.append(("gpu", "the GPU's busy share (no NVML evidence)"))
    if gw is not None:
        facts.append(Fact("process", "share of the window the training thread was blocked inside Python code "
                                     "(GIL wait estimate)", gw["g"]))
    busy_beside = suspects(ev)
    gil_blind = gw is None and bool(busy_beside)
    if gw is not None and busy_beside and gw["r"] >= 0.05:
        # A busy Python thread beside a loop that also waits for a CPU: a GIL hand-over that ends in
        # the run queue is counted as run-queue time, so the GIL estimate may be low (the ledger's
        # gil-bursts job: 0.06 estimated, 2.65x measured when the thread was removed).
        unmeasured.append(("process", f"GIL waits that end in the run queue (thread '{busy_beside[0].get('name')}' "
                                      f"busy {pct(busy_beside[0].get('busy_fraction') or 0)} beside the loop, which "
                                      f"waited for a CPU {pct(gw['r'])} of the window)"))
    for probe, u in unmeasured:
        facts.append(Fact(probe, "not measured, so not excluded: " + u, None))
    where = "the GPU" if busy is not None else "the CPU (no GPU in use)"
    title = (f"The step is compute-bound on {where}: nothing on the host to fix "
             f"({pct(busy if busy is not None else compute)} busy)")
    bound = ("1.0 by definition: no host-side stall above "
             f"{WORTH_ACTING:.2f}x was found; faster steps need less compute per step or a faster device")
    conf = "high" if device_busy or compute >= 0.8 else "medium"
    if unmeasured and conf == "high":
        conf = "medium"
    if gil_blind:
        conf = "low"
    return Finding("compute.bound", title, 1.0, bound, conf, facts, [], risk="low", interval=(1.0, WORTH_ACTING))
