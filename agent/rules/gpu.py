"""Rules over the GPU's idle time and what the training thread was doing at the time.

The attribution (agent/analysis/gpu_idle.py) puts NVML's utilization samples and py-spy's timeline
on one clock and splits the GPU's idle seconds among host causes. Each rule here turns one cause
into a finding, with the share x of the observed time that it explains; removing the cause can at
most take that share off the step, so the expected speedup is at most 1 / (1 - x), tightened where
a second fact bounds it (the PCIe link for copies, the GPU's own busy time for syncs). NVML samples
every 200 ms on an H200, so gaps inside one period are placed by the host timeline, not by NVML;
every finding says so.
"""
from __future__ import annotations

from typing import Any

from trainprobe.agent.analysis import gpu_idle
from trainprobe.agent.analysis.gpu_idle import Attribution, amdahl
from trainprobe.agent.evidence import Evidence
from trainprobe.agent.findings import FINDING_IDS, Fact, Finding, Fix, pct
from trainprobe.agent.rules import rule

CAUSE_SHARE = 0.10        # a cause must explain at least this share of the time as GPU idle
LAUNCH_SHARE = 0.15       # idle while the host runs the step's Python: launch overhead
SYNC_SHARE = 0.05         # the loop blocks in host syncs at least this share of its time
SYNC_WORTH = 1.05         # ... and removing them would gain at least this much
WORTH_ACTING = 1.10       # as agent/rules/compute.py: smaller host-side gains do not count
GPU_BUSY = 0.85           # the GPU's busy share above which it is the step's limit
PINNED_H2D_SHARE = 0.25   # batches already pinned: copy time this large means blocking copies
PRODUCER_WAIT = 0.10      # the loop waits on DataLoader workers this share: their pace sets the step
# Share of the launch-bound idle that torch.compile(mode="reduce-overhead") of the model removes
# (docs/models.md: fitted to the GPU ledger's launch-bound row, 1.89x measured where the whole idle
# share gave 4.53x; one point, in-sample): (low, middle, high).
COMPILE_CAPTURE = (0.45, 0.60, 0.80)


def _period_fact(gpu: dict[str, Any]) -> Fact:
    p = gpu.get("sample_period_s") or 0.0
    return Fact("gpu", f"NVML sample period (idle gaps shorter than {1000 * p:.0f} ms cannot be resolved from "
                       "NVML alone; the host timeline places them)", p)


def _common_facts(ev: Evidence, att: Attribution) -> list[Fact]:
    gpu = ev.get("gpu") or {}
    idx = ",".join(str(i) for i in att.gpu_indices)
    busy = round(att.busy_fraction, 4) if att.observed_s else gpu.get("busy_fraction")
    return [Fact("gpu", f"share of the window GPU {idx} was busy (NVML utilization samples)", busy),
            _period_fact(gpu),
            Fact("gpu+pyspy", "seconds of GPU samples and host timeline that overlap (one wall clock)",
                 round(att.observed_s, 2))]


def _leaf(spy: dict[str, Any], cat: str) -> str | None:
    top = ((spy.get("training_thread") or {}).get("top_stacks") or {}).get(cat) or []
    return top[0]["stack"][-1] if top and top[0].get("stack") else None


def _bound(att: Attribution, what: str, x: float) -> str:
    return (f"GPU idle while the training thread was {what}: x={x:.2f} of {att.observed_s:.1f} s observed "
            f"({att.samples} NVML periods of {1000 * (att.period_s or 0):.0f} ms, idle split by the host timeline); "
            f"that idle time off the step: 1/(1-x) = {amdahl(x):.2f}x")


def _existing(ev: Evidence, finding_id: str) -> Finding | None:
    return next((f for f in ev.context.get("findings", []) if f.id == finding_id), None)


@rule("dataloader.starved", requires=("gpu", "pyspy"), uses=("process",),
      description="the GPU idles while the training loop waits for or loads its next batch")
def gpu_idle_on_data(ev: Evidence) -> Finding | None:
    att = gpu_idle.for_evidence(ev)
    if not att.ok:
        return None
    x = att.idle_share("data_wait", "data_load")
    if x < CAUSE_SHARE:
        return None
    inloop = att.idle_share("data_load") >= att.idle_share("data_wait")
    facts = _common_facts(ev, att) + [
        Fact("gpu+pyspy", "share of the observed time the GPU idled while the loop "
                          + ("loaded batches itself" if inloop else "waited for DataLoader workers"), round(x, 3)),
        Fact("gpu+pyspy", "GPU idle seconds the data path explains, of all idle seconds",
             f"{att.idle_seconds.get('data_wait', 0) + att.idle_seconds.get('data_load', 0):.2f} of "
             f"{att.idle_total_s:.2f}")]
    speedup = amdahl(x)
    bound = _bound(att, "fetching its next batch", x)
    cpu = _existing(ev, "dataloader.starved")
    if cpu is not None and cpu.expected_speedup < speedup:
        # The CPU-capacity model of the py-spy rule is the tighter bound: the GPU side only adds facts.
        speedup = cpu.expected_speedup
        bound += f"; the CPU-capacity model ({cpu.expected_speedup:.2f}x) is tighter"
    proc = ev.get("process") or {}
    cpus = proc.get("cpus_available") or ev.context.get("cpus_available")
    n = max(1, min(int(cpus) - 1, 8)) if cpus else 4
    fixes = [Fix("Load batches in worker processes, into pinned memory",
                 change=f"DataLoader(..., num_workers={n}, pin_memory=True, persistent_workers=True)",
                 knobs={"num_workers": n, "pin_memory": True, "persistent_workers": True}),
             Fix("Copy batches without blocking the loop", change="x = x.cuda(non_blocking=True)  # with pin_memory=True",
                 knobs={"non_blocking": True})]
    title = f"The GPU idles {pct(x)} of the time while the training loop " + (
        "loads its own batches" if inloop else "waits for its DataLoader")
    return Finding("dataloader.starved", title, speedup, bound, "high" if x >= 0.3 else "medium", facts, fixes,
                   details={"gpu_idle_share_data": round(x, 4), "attribution": att.to_dict()})


def _pinned_already(spy: dict[str, Any]) -> bool:
    """A DataLoader with pin_memory=True runs a pin-memory thread in the training process."""
    for t in spy.get("other_threads") or []:
        if "pin_memory" in (t.get("name") or ""):
            return True
        for st in t.get("top") or []:
            if any("pin_memory.py" in fr or "_pin_memory_loop" in fr for fr in st.get("stack", [])):
                return True
    return False


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
    spy = ev.get("pyspy") or {}
    per = (gpu.get("per_gpu") or {}).get(att.gpu_indices[0]) or {}
    pcie = per.get("pcie") or {}
    rx, link = pcie.get("rx_gbps_mean"), pcie.get("link_gbps")
    facts = _common_facts(ev, att) + [
        Fact("pyspy", "share of the training thread in host-to-device copies", round(att.host_share("h2d_copy"), 3)),
        Fact("gpu+pyspy", "share of the observed time the GPU idled while the loop copied to it", round(x, 3))]
    leaf = _leaf(spy, "h2d_copy")
    if leaf:
        facts.append(Fact("pyspy", "where the loop copies: " + leaf, None))
    speedup = amdahl(x)
    # NVML counts part of a pageable copy's DMA as busy time, and pinning shortens that too: the H200
    # measured 1.20-1.23x this estimate (two runs). The interval reaches the link ceiling above.
    interval_hi = 1.0 + (speedup - 1.0) * 1.5
    bound = _bound(att, "copying batches to the GPU", x)
    if rx and link:
        facts += [Fact("gpu", "PCIe RX throughput to the GPU, GB/s (NVML, mean of the polls)", rx),
                  Fact("gpu", f"PCIe link ceiling, GB/s (Gen{(gpu.get('gpus') or [{}])[0].get('pcie', {}).get('gen')} "
                              f"x{(gpu.get('gpus') or [{}])[0].get('pcie', {}).get('width')}, one direction)", link)]
        pcie_bound = link / rx
        if pcie_bound < speedup:
            speedup = pcie_bound
        interval_hi = max(speedup, min(interval_hi, pcie_bound))
        bound += (f"; the same bytes at the link's {link:g} GB/s instead of today's {rx:g} GB/s: "
                  f"<= {pcie_bound:.1f}x")
    pinned = _pinned_already(spy)
    if pinned and x < PINNED_H2D_SHARE:
        return None           # pinned, non-blocking copies: the time in .cuda() is call overhead
    if pinned:
        facts.append(Fact("pyspy", "a pin-memory thread runs: the DataLoader already pins its batches", True))
        fixes = [Fix("Do not block on the copy: the batches are already pinned",
                     change="x = x.cuda(non_blocking=True); y = y.cuda(non_blocking=True)",
                     knobs={"non_blocking": True}),
                 Fix("Prefetch the next batch to the GPU on a side stream while this step computes",
                     change="with torch.cuda.stream(copy_stream): nxt = batch.cuda(non_blocking=True)")]
        title = f"The GPU idles {pct(x)} of the time while the loop copies batches to it, though they are pinned"
        conf = "low"
    else:
        fixes = [Fix("Copy from pinned (page-locked) memory, without blocking the loop",
                     change="DataLoader(..., pin_memory=True); x = x.cuda(non_blocking=True)",
                     knobs={"pin_memory": True, "non_blocking": True}),
                 Fix("Without a DataLoader: pin the host tensors once, where they are built",
                     change="xs = xs.pin_memory()  # or torch.empty(..., pin_memory=True); then xs.cuda(non_blocking=True)")]
        title = (f"The GPU idles {pct(x)} of the time while the loop copies batches to it from pageable memory "
                 "(no pin_memory)")
        conf = "high" if (x >= 0.3 and rx) else "medium"
    return Finding("h2d.pageable", title, speedup, bound, conf, facts, fixes, risk="low",
                   interval=(1.0 + (speedup - 1.0) / 1.25, interval_hi),
                   details={"gpu_idle_share_h2d": round(x, 4), "pcie_rx_gbps": rx, "pcie_link_gbps": link,
                            "pinned_already": pinned, "attribution": att.to_dict()})


@rule("host.sync", requires=("gpu", "pyspy"),
      description="the loop blocks in host-device syncs, so the GPU's queue drains every step")
def host_sync(ev: Evidence) -> Finding | None:
    att = gpu_idle.for_evidence(ev)
    if not att.ok:
        return None
    s = att.host_share("host_sync")
    if s < SYNC_SHARE:
        return None
    b = att.busy_fraction
    # A loop that also waits on its DataLoader workers steps at their pace: the time a sync takes
    # comes back as data wait (the GPU ledger's timm-item: s=0.19 beside a 0.55 worker wait,
    # 1.23x estimated, 0.90x measured with loss.item() every 100 steps). The rule stays silent.
    if att.host_share("data_wait") >= PRODUCER_WAIT:
        return None
    # With the syncs gone the host queues the next step while the GPU runs this one: a step then
    # takes the longer of the host's own time (1 - s) and the GPU's busy time (b).
    speedup = 1.0 / max(1.0 - s, b, 0.01)
    if speedup < SYNC_WORTH:
        return None
    spy = ev.get("pyspy") or {}
    facts = _common_facts(ev, att) + [
        Fact("pyspy", "share of the training thread blocked in host syncs (.item(), .cpu(), synchronize)", round(s, 3)),
        Fact("gpu+pyspy", "GPU busy share over the overlap", round(b, 3))]
    leaf = _leaf(spy, "host_sync")
    if leaf:
        facts.append(Fact("pyspy", "where the loop syncs: " + leaf, None))
    bound = (f"sync share s={s:.2f}, GPU busy b={b:.2f}: without per-step syncs the host queues ahead and a step takes "
             f"max(1-s, b)={max(1 - s, b):.2f} of today's: <= {speedup:.2f}x; NVML's {1000 * (att.period_s or 0):.0f} ms "
             "samples cannot show the drain after each sync, the host timeline does")
    fixes = [Fix("Accumulate metrics on the GPU and synchronise every N steps, not every step",
                 change="running += loss.detach()  # no loss.item() per step\n"
                        "if step % 100 == 0: log(running.item() / 100); running.zero_()",
                 knobs={"item_every": 100}),
             Fix("Time steps with CUDA events instead of torch.cuda.synchronize() in the loop",
                 change="start.record(); ...; end.record()  # read end.elapsed_time(start) every N steps")]
    return Finding("host.sync", f"The training loop blocks in host-GPU syncs {pct(s)} of the time",
                   speedup, bound, "medium", facts, fixes, risk="low",
                   details={"sync_share": round(s, 4), "gpu_busy": round(b, 4), "attribution": att.to_dict()})


@rule("host.launch_bound", requires=("gpu", "pyspy"),
      description="the GPU idles while the host runs the step's Python: kernels are launched slower than they run")
def launch_bound(ev: Evidence) -> Finding | None:
    att = gpu_idle.for_evidence(ev)
    if not att.ok:
        return None
    x = att.idle_share("launch")
    if x < LAUNCH_SHARE:
        return None
    spy = ev.get("pyspy") or {}
    bd = (spy.get("training_thread") or {}).get("breakdown") or {}
    facts = _common_facts(ev, att) + [
        Fact("pyspy", "share of the training thread in forward, backward and optimizer (issuing kernels)",
             round(att.host_share("launch"), 3)),
        Fact("gpu+pyspy", "share of the observed time the GPU idled while the host ran forward/backward/optimizer",
             round(x, 3))]
    if bd.get("backward", 0) > bd.get("forward", 0) and bd.get("backward", 0) > 0.3:
        facts.append(Fact("pyspy", "share of the training thread in autograd's backward", round(bd["backward"], 3)))
    steps = att.steps or {}
    if steps.get("inferred"):
        facts.append(Fact("pyspy", "steps per second seen in the host timeline", steps.get("steps_per_s")))
    e_lo, e_mid, e_hi = COMPILE_CAPTURE
    speedup = amdahl(e_mid * x)
    bound = (_bound(att, "running the step's Python (forward, backward, optimizer)", x)
             + f"; torch.compile(mode=\"reduce-overhead\") of the model captures only part of it (not the "
               f"optimizer, not the Python between steps): 1/(1-e x) with e={e_mid:g} ({e_lo:g}-{e_hi:g}), "
               f"fitted to the ledger; an estimate")
    fixes = [Fix("Capture the step in CUDA graphs: one launch replays all its kernels",
                 change='model = torch.compile(model, mode="reduce-overhead")',
                 knobs={"compile": "reduce-overhead"}),
             Fix("Give each kernel more work: fewer, larger steps",
                 change="DataLoader(..., batch_size=4 * batch_size)  # scale the learning rate with it"),
             Fix("Fuse the optimizer's per-parameter kernels",
                 change="torch.optim.AdamW(model.parameters(), ..., fused=True)  # or foreach=True")]
    return Finding("host.launch_bound",
                   f"The GPU idles {pct(x)} of the time while the host issues its kernels: the step is launch-bound",
                   speedup, bound, "medium" if x >= 0.4 else "low", facts, fixes, risk="medium",
                   # The printed fix, torch.compile(mode="reduce-overhead"), measured 1.89x on the GPU
                   # ledger where 1/(1-x) said 4.53x; a hand-written whole-step CUDA graph (not printed)
                   # measured more. The interval spans the captured share e.
                   interval=(amdahl(e_lo * x), amdahl(e_hi * x)),
                   details={"gpu_idle_share_launch": round(x, 4), "attribution": att.to_dict()})


@rule("compute.bound", requires=("gpu",), uses=("pyspy",),
      description="the GPU is busy nearly all the window and no host-side stall was found",
      after=tuple(i for i in FINDING_IDS if i != "compute.bound"))
def gpu_busy(ev: Evidence) -> Finding | None:
    if any(f.expected_speedup >= WORTH_ACTING for f in ev.context.get("findings", [])):
        return None
    gpu = ev.get("gpu") or {}
    busy = gpu.get("busy_fraction")
    if busy is None or busy < GPU_BUSY:
        return None
    facts = [Fact("gpu", "share of the window the GPU was busy", busy), _period_fact(gpu)]
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
    return Finding("compute.bound", f"The GPU is busy {pct(busy)} of the time: nothing on the host holds the step back",
                   1.0, "1.0 by definition: the GPU is busy for nearly the whole window, so no host-side change can "
                        "shorten the step; faster steps need less work per step or a faster device",
                   "high", facts, [], risk="low", interval=(1.0, WORTH_ACTING))
