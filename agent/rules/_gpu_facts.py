"""Facts and bounds shared by the rules over the GPU's idle time (not a rule).

The attribution (agent/analysis/gpu_idle.py) puts NVML's utilization samples and py-spy's timeline
on one clock and splits the GPU's idle seconds among host causes. Each rule over it turns one cause
into a finding, with the share x of the observed time that it explains; removing the cause can at
most take that share off the step, so the expected speedup is at most 1 / (1 - x). NVML samples
every 200 ms on an H200, so gaps inside one period are placed by the host timeline, not by NVML;
every finding says so, with the facts built here.
"""
from __future__ import annotations

from typing import Any

from trainprobe.agent.analysis.gpu_idle import Attribution, amdahl
from trainprobe.agent.evidence import Evidence
from trainprobe.agent.findings import Fact

CAUSE_SHARE = 0.10        # a cause must explain at least this share of the time as GPU idle


def period_fact(gpu: dict[str, Any]) -> Fact:
    p = gpu.get("sample_period_s") or 0.0
    return Fact("gpu", f"NVML sample period (idle gaps shorter than {1000 * p:.0f} ms cannot be resolved from "
                       "NVML alone; the host timeline places them)", p)


def common_facts(ev: Evidence, att: Attribution) -> list[Fact]:
    gpu = ev.get("gpu") or {}
    idx = ",".join(str(i) for i in att.gpu_indices)
    busy = round(att.busy_fraction, 4) if att.observed_s else gpu.get("busy_fraction")
    return [Fact("gpu", f"share of the window GPU {idx} was busy (NVML utilization samples)", busy),
            period_fact(gpu),
            Fact("gpu+pyspy", "seconds of GPU samples and host timeline that overlap (one wall clock)",
                 round(att.observed_s, 2))]


def top_leaf(spy: dict[str, Any], cat: str) -> str | None:
    """The innermost frame of the training thread's hottest stack in a category."""
    top = ((spy.get("training_thread") or {}).get("top_stacks") or {}).get(cat) or []
    return top[0]["stack"][-1] if top and top[0].get("stack") else None


def idle_bound(att: Attribution, what: str, x: float) -> str:
    return (f"GPU idle while the training thread was {what}: x={x:.2f} of {att.observed_s:.1f} s observed "
            f"({att.samples} NVML periods of {1000 * (att.period_s or 0):.0f} ms, idle split by the host timeline); "
            f"that idle time off the step: 1/(1-x) = {amdahl(x):.2f}x")


# A model run through torch.compile shows these in its frames (py-spy names a frame by its function
# and its file's base name, sometimes with the path): dynamo's frame hook, the AOT autograd wrappers,
# inductor's compiled graph calls.
COMPILED_MARKS = ("torch/_dynamo", "torch/_inductor", "torch/_functorch/aot_autograd", "eval_frame.py",
                  "aot_autograd.py", "runtime_wrappers.py", "compiled_fn", "CompiledFunction",
                  "OptimizedModule", "compile_fx.py", "output_code.py")
# ... and these when its graphs are replayed from CUDA graphs (mode="reduce-overhead" / "max-autotune").
CUDAGRAPH_MARKS = ("cudagraph_trees", "cudagraphs", "CUDAGraph", "cudagraph_")


def _frames(spy: dict[str, Any]) -> list[str]:
    tt = spy.get("training_thread") or {}
    out = [fr for v in (tt.get("top_stacks") or {}).values() for x in v for fr in x.get("stack") or []]
    for t in spy.get("other_threads") or []:
        out += [fr for x in t.get("top") or [] for fr in x.get("stack") or []]
    return out


def compiled_model(spy: dict[str, Any]) -> dict[str, Any]:
    """{'compiled': bool, 'cudagraphs': bool, 'frame': an example frame}: whether the training thread
    runs a torch.compile'd model, and whether its graphs replay from CUDA graphs (py-spy's frames)."""
    frames = _frames(spy)
    # torch.optim wraps an eager optimizer's step in torch._dynamo.disable: its DisableContext frame
    # (eval_frame.py) is no sign of a compiled model (nanoGPT --compile=False shows it every step).
    comp = next((fr for fr in frames if any(m in fr for m in COMPILED_MARKS)
                 and not fr.startswith("DisableContext.")), None)
    graphs = next((fr for fr in frames if any(m in fr for m in CUDAGRAPH_MARKS)), None)
    return {"compiled": bool(comp or graphs), "cudagraphs": bool(graphs), "frame": graphs or comp}
