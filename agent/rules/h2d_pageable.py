"""h2d.pageable: the GPU idles while the training loop copies batches to it (pageable or blocking copies).

From the GPU-idle attribution (agent/analysis/gpu_idle.py, facts in _gpu_facts.py): x is the share
of the observed time the GPU idled while the loop was in host-to-device copies. Removing the copy
from the step gives at most 1 / (1 - x), tightened by the PCIe link: the same bytes at the link's
ceiling instead of today's throughput take link / rx less time at most. Batches that a pin-memory
thread already pins make a smaller share call overhead (no finding) and a larger one blocking copies.
"""
from __future__ import annotations

from typing import Any

from trainprobe.agent.analysis import gpu_idle
from trainprobe.agent.analysis.gpu_idle import Attribution, amdahl
from trainprobe.agent.combiners import step_model
from trainprobe.agent.combiners.step_model import Change
from trainprobe.agent.evidence import Evidence
from trainprobe.agent.findings import Fact, Finding, Fix, pct
from trainprobe.agent.rules import rule
from trainprobe.agent.rules._gpu_facts import CAUSE_SHARE, common_facts, idle_bound, top_leaf

PINNED_H2D_SHARE = 0.25   # batches already pinned: copy time this large means blocking copies


def pinned_already(spy: dict[str, Any]) -> bool:
    """A DataLoader with pin_memory=True runs a pin-memory thread in the training process."""
    for t in spy.get("other_threads") or []:
        if "pin_memory" in (t.get("name") or ""):
            return True
        for st in t.get("top") or []:
            if any("pin_memory.py" in fr or "_pin_memory_loop" in fr for fr in st.get("stack", [])):
                return True
    return False


def _link_bound(gpu: dict[str, Any], rx: float, link: float, speedup: float, interval_hi: float,
                bound: str, facts: list[Fact]) -> tuple[float, float, str]:
    """The PCIe link's ceiling: (speedup, interval high end, bound) once it is taken into account."""
    first = (gpu.get("gpus") or [{}])[0].get("pcie", {})
    facts += [Fact("gpu", "PCIe RX throughput to the GPU, GB/s (NVML, mean of the polls)", rx),
              Fact("gpu", f"PCIe link ceiling, GB/s (Gen{first.get('gen')} x{first.get('width')}, one direction)",
                   link)]
    pcie_bound = link / rx
    if pcie_bound < speedup:
        speedup = pcie_bound
    interval_hi = max(speedup, min(interval_hi, pcie_bound))
    bound += f"; the same bytes at the link's {link:.3g} GB/s instead of today's {rx:.3g} GB/s: <= {pcie_bound:.1f}x"
    return speedup, interval_hi, bound


def _fixes(x: float, pinned: bool, rx: float | None, facts: list[Fact]) -> tuple[list[Fix], str, str]:
    """(fixes, title, confidence): not blocking on copies that are pinned already, else pinning."""
    if pinned:
        facts.append(Fact("pyspy", "a pin-memory thread runs: the DataLoader already pins its batches", True))
        fixes = [Fix("Do not block on the copy: the batches are already pinned",
                     change="x = x.cuda(non_blocking=True); y = y.cuda(non_blocking=True)",
                     knobs={"non_blocking": True}),
                 Fix("Prefetch the next batch to the GPU on a side stream while this step computes",
                     change="with torch.cuda.stream(copy_stream): nxt = batch.cuda(non_blocking=True)")]
        return fixes, f"The GPU idles {pct(x)} of the time while the loop copies batches to it, though they are pinned", "low"
    fixes = [Fix("Copy from pinned (page-locked) memory, without blocking the loop",
                 change="DataLoader(..., pin_memory=True); x = x.cuda(non_blocking=True)",
                 knobs={"pin_memory": True, "non_blocking": True}),
             Fix("Without a DataLoader: pin the host tensors once, where they are built",
                 change="xs = xs.pin_memory()  # or torch.empty(..., pin_memory=True); then xs.cuda(non_blocking=True)")]
    title = (f"The GPU idles {pct(x)} of the time while the loop copies batches to it from pageable memory "
             "(no pin_memory)")
    return fixes, title, "high" if (x >= 0.3 and rx) else "medium"


def _facts(ev: Evidence, att: Attribution, x: float) -> list[Fact]:
    facts = common_facts(ev, att) + [
        Fact("pyspy", "share of the training thread in host-to-device copies", round(att.host_share("h2d_copy"), 3)),
        Fact("gpu+pyspy", "share of the observed time the GPU idled while the loop copied to it", round(x, 3))]
    leaf = top_leaf(ev.get("pyspy") or {}, "h2d_copy")
    if leaf:
        facts.append(Fact("pyspy", "where the loop copies: " + leaf, None))
    return facts


@rule("h2d.pageable", requires=("gpu", "pyspy"), uses=("process",),
      description="the GPU idles while the training loop copies batches to it (pageable or blocking copies)")
def h2d_blocking(ev: Evidence) -> Finding | None:
    att = gpu_idle.for_evidence(ev)
    if not att.ok:
        return None
    x = att.idle_share("h2d_copy")
    if x < CAUSE_SHARE:
        return None
    gpu = ev.get("gpu") or {}
    pinned = pinned_already(ev.get("pyspy") or {})
    if pinned and x < PINNED_H2D_SHARE:
        return None           # pinned, non-blocking copies: the time in .cuda() is call overhead
    pcie = (((gpu.get("per_gpu") or {}).get(att.gpu_indices[0]) or {}).get("pcie") or {})
    rx, link = pcie.get("rx_gbps_mean"), pcie.get("link_gbps")
    facts = _facts(ev, att, x)
    speedup = amdahl(x)
    # The step model keeps every other constraint in place (the workers' pace, the GPU's busy time):
    # the copy off the loop's path gains what they allow.
    sm = step_model.from_evidence(ev)
    step = sm.after(Change(h2d_removed=True)) if sm is not None else None
    if step is not None and step.speedup < speedup:
        speedup = step.speedup
    # NVML counts part of a pageable copy's DMA as busy time, and pinning shortens that too: the H200
    # measured 1.20-1.23x this estimate (two runs). The interval reaches the link ceiling above.
    interval_hi = 1.0 + (speedup - 1.0) * 1.5
    bound = idle_bound(att, "copying batches to the GPU", x)
    if step is not None:
        bound += "; " + sm.derivation("with the copy off the loop's path", step)
    if rx and link:
        speedup, interval_hi, bound = _link_bound(gpu, rx, link, speedup, interval_hi, bound, facts)
    fixes, title, conf = _fixes(x, pinned, rx, facts)
    return Finding("h2d.pageable", title, speedup, bound, conf, facts, fixes, risk="low",
                   interval=(1.0 + (speedup - 1.0) / 1.25, interval_hi),
                   details={"gpu_idle_share_h2d": round(x, 4), "pcie_rx_gbps": rx, "pcie_link_gbps": link,
                            "pinned_already": pinned, "attribution": att.to_dict()})
