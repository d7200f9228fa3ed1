"""host.sync: the loop blocks in host-device syncs, so the GPU's queue drains every step.

From the GPU-idle attribution (agent/analysis/gpu_idle.py, facts in _gpu_facts.py): s is the share
of the training thread blocked in syncs (.item(), .cpu(), synchronize) and b the GPU's busy share.
Without per-step syncs the host queues the next step while the GPU runs this one: the step after
the fix comes from the step model (agent/combiners/step_model.py), the longest of the loop's own
time less s, the GPU's busy time b, the DataLoader workers' pace and the CPUs. A loop that waits
on its workers steps at their pace, so removing the sync gains what the data pipeline allows (the
GPU ledger's timm-item: s=0.19 beside a 0.55 worker wait, 0.90x measured with loss.item() every 100
steps; 1/max(1-s, b) had said 1.23x).
"""
from __future__ import annotations

from trainprobe.agent.analysis import gpu_idle
from trainprobe.agent.analysis.gpu_idle import Attribution
from trainprobe.agent.combiners import step_model
from trainprobe.agent.combiners.step_model import Change
from trainprobe.agent.evidence import Evidence
from trainprobe.agent.findings import Fact, Finding, Fix, pct
from trainprobe.agent.rules import rule
from trainprobe.agent.rules._gpu_facts import common_facts, top_leaf

SYNC_SHARE = 0.05         # the loop blocks in host syncs at least this share of its time
SYNC_WORTH = 1.05         # ... and removing them would gain at least this much


def _fixes() -> list[Fix]:
    return [Fix("Accumulate metrics on the GPU and synchronise every N steps, not every step",
                change="running += loss.detach()  # no loss.item() per step\n"
                       "if step % 100 == 0: log(running.item() / 100); running.zero_()",
                knobs={"item_every": 100}),
            Fix("Time steps with CUDA events instead of torch.cuda.synchronize() in the loop",
                change="start.record(); ...; end.record()  # read end.elapsed_time(start) every N steps")]


def _facts(ev: Evidence, att: Attribution, s: float, b: float) -> list[Fact]:
    facts = common_facts(ev, att) + [
        Fact("pyspy", "share of the training thread blocked in host syncs (.item(), .cpu(), synchronize)", round(s, 3)),
        Fact("gpu+pyspy", "GPU busy share over the overlap", round(b, 3))]
    leaf = top_leaf(ev.get("pyspy") or {}, "host_sync")
    if leaf:
        facts.append(Fact("pyspy", "where the loop syncs: " + leaf, None))
    return facts


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
    sm = step_model.from_evidence(ev)
    if sm is None:
        return None
    step = sm.after(Change(sync_removed=True))
    if step.speedup < SYNC_WORTH:
        return None
    bound = (sm.derivation("without per-step syncs (the host queues ahead of the GPU)", step)
             + f"; NVML's {1000 * (att.period_s or 0):.0f} ms samples cannot show the drain after each sync, "
               "the host timeline does")
    return Finding("host.sync", f"The training loop blocks in host-GPU syncs {pct(s)} of the time",
                   step.speedup, bound, "medium", _facts(ev, att, s, b), _fixes(), risk="low",
                   # No ledger row measured this fix where it fires: the medium band of an uncalibrated figure.
                   interval=(min(step.interval[0], 1 + (step.speedup - 1) / 1.42),
                             max(step.interval[1], 1 + (step.speedup - 1) * 1.42)),
                   details={"sync_share": round(s, 4), "gpu_busy": round(b, 4), "step_model": sm.details(step),
                            "attribution": att.to_dict()})
