"""compute.bound: no host-side stall dominates; the step is bound by its device's compute.

Both rules here read every other rule's findings (`after` names every other id) and fire only when
none of them found a gain worth acting on, so a healthy job gets one clear answer instead of noise.
The py-spy rule leads; the GPU rule (NVML's busy share) runs after it and adds its facts to the
same finding when both fire.

Its confidence says what was excluded: high only when every plausible host cause was measured
and found small (the data wait by py-spy; run-queue delay and the GIL wait by the process probe's
per-thread CPU time and schedstat; the GPU's busy share by NVML for a CUDA job). Each cause not
measured lowers it to medium, and a busy Python thread beside the loop whose GIL share could not be
measured lowers it to low; the finding lists what was not measured.
"""
from __future__ import annotations

from typing import Any

from trainprobe.agent.combiners.cpu_wait import training_wait
from trainprobe.agent.combiners.gil_wait import gil_wait, suspects
from trainprobe.agent.evidence import Evidence
from trainprobe.agent.findings import FINDING_IDS, Fact, Finding, pct
from trainprobe.agent.rules import rule
from trainprobe.agent.rules._gpu_facts import period_fact

WORTH_ACTING = 1.10           # a host-side finding below this gain does not count as a stall
COMPUTE_SHARE = 0.60          # forward + backward + optimizer share of the training thread
GPU_BUSY = 0.85               # the GPU's busy share above which it is the step's limit
# A training thread that waited for a CPU this share of the window is not compute-bound: something
# took its CPU (cpu.contended, cpu.oversubscribed), and py-spy shows that wait inside forward/backward.
RUNQ_NOT_COMPUTE = 0.10
OTHER_IDS = tuple(i for i in FINDING_IDS if i != "compute.bound")


def _stall_found(ev: Evidence) -> bool:
    """Whether an earlier rule found a host-side gain worth acting on."""
    return any(f.expected_speedup >= WORTH_ACTING for f in ev.context.get("findings", []))


def _unmeasured(ev: Evidence, gw: dict[str, Any] | None, busy: float | None) -> list[tuple[str, str]]:
    """(probe, what) for each plausible host cause that was not measured, so not excluded."""
    out = []
    if not ev.has("process"):
        out.append(("process", "run-queue delay and GIL waits (no per-thread CPU time: the process probe "
                               "did not run)"))
    elif gw is None:
        out.append(("pyspy", "GIL waits (who held the GIL was not measured: " +
                    str(((ev.get("pyspy") or {}).get("gil") or {}).get("reason") or "no py-spy --gil samples") + ")"))
    if (ev.get("process") or {}).get("uses_cuda") and busy is None:
        out.append(("gpu", "the GPU's busy share (no NVML evidence)"))
    busy_beside = suspects(ev)
    if gw is not None and busy_beside and gw["r"] >= 0.05:
        # A busy Python thread beside a loop that also waits for a CPU: a GIL hand-over that ends in
        # the run queue is counted as run-queue time, so the GIL estimate may be low (the ledger's
        # gil-bursts job: 0.06 estimated, 2.65x measured when the thread was removed).
        out.append(("process", f"GIL waits that end in the run queue (thread '{busy_beside[0].get('name')}' "
                               f"held the GIL {pct(busy_beside[0].get('share') or 0)} of the window beside the loop, "
                               f"which waited for a CPU {pct(gw['r'])} of the window)"))
    return out


@rule("compute.bound", requires=("pyspy",), uses=("process", "gpu", "contention", "sched"),
      description="nothing on the host holds the step back: compute dominates", after=OTHER_IDS)
def compute_bound(ev: Evidence) -> Finding | None:
    if _stall_found(ev):
        return None
    tt = (ev.get("pyspy") or {}).get("training_thread")
    if not tt:
        return None
    bd = tt["breakdown"]
    in_frames = bd.get("forward", 0.0) + bd.get("backward", 0.0) + bd.get("optimizer", 0.0)
    busy = (ev.get("gpu") or {}).get("busy_fraction")
    # py-spy's compute frames include the time the thread waited for a CPU inside them: the loop is
    # compute-bound only for the share it was on a CPU.
    wait = training_wait(ev)
    r = wait["r"] if wait else 0.0
    if wait and r >= RUNQ_NOT_COMPUTE and not (busy is not None and busy >= GPU_BUSY):
        ev.note(f"Not compute-bound: the training thread waited for a CPU {pct(r)} of the window "
                f"({wait['how']}); py-spy's {pct(in_frames)} in forward/backward/optimizer includes that wait.")
        return None
    compute = max(0.0, in_frames - r)
    facts = [Fact("pyspy", "share of the training thread in forward, backward and optimizer", round(in_frames, 3)),
             Fact("pyspy", "share waiting for or loading batches",
                  round(bd.get("data_wait", 0.0) + bd.get("data_load", 0.0), 3))]
    if wait:
        facts.append(Fact(wait["source"], "of which the training thread waited for a CPU "
                                          f"({wait['how']}; subtracted: compute on a CPU is the rest)", r))
    if busy is not None:
        facts.insert(0, Fact("gpu", "share of the window the GPU was busy", busy))
    device_busy = busy is not None and busy >= GPU_BUSY
    if not device_busy and compute + bd.get("host_sync", 0.0) < COMPUTE_SHARE:
        return None
    gw = gil_wait(ev)
    unmeasured = _unmeasured(ev, gw, busy)
    if gw is not None:
        facts.append(Fact("process", "share of the window the training thread was blocked inside Python code "
                                     "(GIL wait estimate)", gw["g"]))
    facts += [Fact(probe, "not measured, so not excluded: " + u, None) for probe, u in unmeasured]
    limit = "loop" if busy is not None and not device_busy else ("gpu" if busy is not None else "cpu")
    if limit == "loop":
        # A GPU that idles while the loop runs its forward/backward/optimizer is not the limit: the
        # loop's own work on the host is, and no rule found a fix for it worth acting on.
        title = (f"The step is set by the training loop's own forward/backward/optimizer work "
                 f"({pct(compute)} of it; the GPU busy {pct(busy)}): no host-side fix found worth "
                 f"{WORTH_ACTING:.2f}x")
    else:
        where = "the GPU" if limit == "gpu" else "the CPU (no GPU in use)"
        title = (f"The step is compute-bound on {where}: nothing on the host to fix "
                 f"({pct(busy if busy is not None else compute)} busy)")
    bound = ("1.0 by definition: no host-side stall above "
             f"{WORTH_ACTING:.2f}x was found; faster steps need less compute per step or a faster device")
    conf = "high" if device_busy or compute >= 0.8 else "medium"
    if unmeasured and conf == "high":
        conf = "medium"
    if gw is None and suspects(ev):
        conf = "low"
    return Finding("compute.bound", title, 1.0, bound, conf, facts, [], risk="low", interval=(1.0, WORTH_ACTING),
                   details={"limit": limit})


def _gpu_facts(gpu: dict[str, Any], busy: float) -> list[Fact]:
    facts = [Fact("gpu", "share of the window the GPU was busy", busy), period_fact(gpu)]
    for i in gpu.get("target_gpus") or []:
        per = (gpu.get("per_gpu") or {}).get(i) or {}
        if per.get("memory_busy_fraction") is not None:
            facts.append(Fact("gpu", f"share of the window GPU {i}'s memory was being read or written",
                              per["memory_busy_fraction"]))
        reasons = per.get("clocks_event_reasons") or {}
        slowed = [r for r in reasons if r not in ("gpu_idle",)]
        if slowed:
            facts.append(Fact("gpu", f"GPU {i} clocks held back by: " + ", ".join(slowed), True))
        pc = per.get("pcie") or {}
        if pc.get("rx_gbps_mean") and pc.get("link_gbps") and pc["rx_gbps_mean"] >= 0.5 * pc["link_gbps"]:
            facts.append(Fact("gpu", f"GPU {i} PCIe RX as a share of the link's {pc['link_gbps']:g} GB/s "
                                     "(host-to-device copies may bound the step)",
                              round(pc["rx_gbps_mean"] / pc["link_gbps"], 3)))
    return facts


# `after` names its own id too: it runs after the py-spy rule above, whose finding it joins.
@rule("compute.bound", requires=("gpu",), uses=("pyspy",),
      description="the GPU is busy nearly all the window and no host-side stall was found", after=FINDING_IDS)
def gpu_busy(ev: Evidence) -> Finding | None:
    if _stall_found(ev):
        return None
    gpu = ev.get("gpu") or {}
    busy = gpu.get("busy_fraction")
    if busy is None or busy < GPU_BUSY:
        return None
    return Finding("compute.bound", f"The GPU is busy {pct(busy)} of the time: nothing on the host holds the step back",
                   1.0, "1.0 by definition: the GPU is busy for nearly the whole window, so no host-side change can "
                        "shorten the step; faster steps need less work per step or a faster device",
                   "high", _gpu_facts(gpu, busy), [], risk="low", interval=(1.0, WORTH_ACTING))
