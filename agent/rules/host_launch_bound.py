"""host.launch_bound: the GPU idles while the host runs the step's Python (kernels launched slower than they run).

From the GPU-idle attribution (agent/analysis/gpu_idle.py, facts in _gpu_facts.py): x is the share
of the observed time the GPU idled while the training thread ran forward, backward and optimizer.
torch.compile(mode="reduce-overhead") captures only part of that (not the optimizer, not the Python
between steps): the expected speedup is 1 / (1 - e x), with e fitted to the GPU ledger.
"""
from __future__ import annotations

from trainprobe.agent.analysis import gpu_idle
from trainprobe.agent.analysis.gpu_idle import Attribution, amdahl
from trainprobe.agent.evidence import Evidence
from trainprobe.agent.findings import Fact, Finding, Fix, pct
from trainprobe.agent.rules import rule
from trainprobe.agent.rules._gpu_facts import common_facts, idle_bound

LAUNCH_SHARE = 0.15       # idle while the host runs the step's Python: launch overhead
# Share of the launch-bound idle that torch.compile(mode="reduce-overhead") of the model removes
# (docs/models.md: fitted to the GPU ledger's launch-bound row, 1.89x measured where the whole idle
# share gave 4.53x; one point, in-sample): (low, middle, high).
COMPILE_CAPTURE = (0.45, 0.60, 0.80)


def _facts(ev: Evidence, att: Attribution, x: float) -> list[Fact]:
    bd = ((ev.get("pyspy") or {}).get("training_thread") or {}).get("breakdown") or {}
    facts = common_facts(ev, att) + [
        Fact("pyspy", "share of the training thread in forward, backward and optimizer (issuing kernels)",
             round(att.host_share("launch"), 3)),
        Fact("gpu+pyspy", "share of the observed time the GPU idled while the host ran forward/backward/optimizer",
             round(x, 3))]
    if bd.get("backward", 0) > bd.get("forward", 0) and bd.get("backward", 0) > 0.3:
        facts.append(Fact("pyspy", "share of the training thread in autograd's backward", round(bd["backward"], 3)))
    steps = att.steps or {}
    if steps.get("inferred"):
        facts.append(Fact("pyspy", "steps per second seen in the host timeline", steps.get("steps_per_s")))
    return facts


def _fixes() -> list[Fix]:
    return [Fix("Capture the step in CUDA graphs: one launch replays all its kernels",
                change='model = torch.compile(model, mode="reduce-overhead")',
                knobs={"compile": "reduce-overhead"}),
            Fix("Give each kernel more work: fewer, larger steps",
                change="DataLoader(..., batch_size=4 * batch_size)  # scale the learning rate with it"),
            Fix("Fuse the optimizer's per-parameter kernels",
                change="torch.optim.AdamW(model.parameters(), ..., fused=True)  # or foreach=True")]


@rule("host.launch_bound", requires=("gpu", "pyspy"),
      description="the GPU idles while the host runs the step's Python: kernels are launched slower than they run")
def launch_bound(ev: Evidence) -> Finding | None:
    att = gpu_idle.for_evidence(ev)
    if not att.ok:
        return None
    x = att.idle_share("launch")
    if x < LAUNCH_SHARE:
        return None
    e_lo, e_mid, e_hi = COMPILE_CAPTURE
    speedup = amdahl(e_mid * x)
    bound = (idle_bound(att, "running the step's Python (forward, backward, optimizer)", x)
             + f"; torch.compile(mode=\"reduce-overhead\") of the model captures only part of it (not the "
               f"optimizer, not the Python between steps): 1/(1-e x) with e={e_mid:g} ({e_lo:g}-{e_hi:g}), "
               f"fitted to the ledger; an estimate")
    return Finding("host.launch_bound",
                   f"The GPU idles {pct(x)} of the time while the host issues its kernels: the step is launch-bound",
                   speedup, bound, "medium" if x >= 0.4 else "low", _facts(ev, att, x), _fixes(), risk="medium",
                   # The printed fix, torch.compile(mode="reduce-overhead"), measured 1.89x on the GPU
                   # ledger where 1/(1-x) said 4.53x; a hand-written whole-step CUDA graph (not printed)
                   # measured more. The interval spans the captured share e.
                   interval=(amdahl(e_lo * x), amdahl(e_hi * x)),
                   details={"gpu_idle_share_launch": round(x, 4), "attribution": att.to_dict()})
