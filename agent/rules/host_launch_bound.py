"""host.launch_bound: the GPU idles while the host runs the step's Python (kernels launched slower than they run).

From the GPU-idle attribution (agent/analysis/gpu_idle.py, facts in _gpu_facts.py): x is the share
of the observed time the GPU idled while the training thread ran forward, backward and optimizer.
torch.compile(mode="reduce-overhead") replays the step's kernels from CUDA graphs: the host no longer
issues them one by one, so a share e of the training thread's time in the model's forward and backward,
h, goes, whether the GPU idled or ran meanwhile. Compiling the model leaves the optimizer's step and the
Python around the model eager: what a framework runs inside the optimizer's closure (Lightning's hooks
and self.log sample as optimizer, a quarter of its demos' steps) is not in h. The
step after the fix comes from the step model (agent/combiners/step_model.py): the loop's own time less
e h, with every other constraint (the GPU's own busy time, the workers' pace, the CPUs) in place; e
is the step model's calibrated compile_e. A model that is compiled already (py-spy sees
dynamo, AOT autograd or inductor frames) is told so, and what is left is CUDA graphs; an eager
model's interval reaches higher (compiling it fuses kernels too, which shortens the GPU's own time:
nanoGPT eager measured 1.64x and 1.84x in two runs where capture alone, the GPU's own time then
setting the step, gives 1.44x; not predictable from the host); one whose
graphs already replay from CUDA graphs gets no finding (the launch time left is not the model's).
A step that calls its modules from several places in turn (a GAN's discriminator on real images,
a detached fake and the fake again) keeps none of e at the middle estimate (the step model's
compile_multi: two GANs on the public ledger measured 1.00x and 0.97x), so the rule is silent there;
so is a step whose forward runs a recurrent module (nn.LSTM, GRU, RNN): dynamo graph-breaks around it
by default (torch._dynamo.config.allow_rnn), the recurrence stays eager between the graphs, and
compiling pytorch/examples' word-level LSTM language model measured 0.87x where capture alone said 1.86x;
and so is one whose forward runs torch's nn.TransformerEncoder / TransformerDecoder: given a mask without
an is_causal hint, they check whether it is causal with a data-dependent bool, a graph break inside
each call (Lightning's demo Transformer compiled in place measured 0.92x, where capture alone said 1.93x).
"""
from __future__ import annotations

from trainprobe.agent.analysis import gpu_idle
from trainprobe.agent.analysis.gpu_idle import Attribution
from trainprobe.agent.evidence import Evidence
from trainprobe.agent.findings import Fact, Finding, Fix, pct
from trainprobe.agent.rules import rule
from trainprobe.agent.combiners import step_model
from trainprobe.agent.combiners.step_model import CAL, Change
from trainprobe.agent.rules._gpu_facts import common_facts, compiled_model, idle_bound

# The GPU idles at least this share of the window while the host runs the step's Python: the host is
# on the step's critical path, its kernels about as short as their launches. Below it the queue is
# deep (the in-house healthy GPU job: 0.01, its GPU 99% busy) or the step waits on something else
# (the H200 fixture whose loop loads its own batches: 0.06), and all compile could still take is
# fusion of the GPU's own time, which host evidence cannot tell from nothing. Until 2026-12-06 the
# gate was 0.15: minGPT's chargpt on an H100 read 0.137 in one window (GPU 82% busy: compute.bound,
# no fix) and 0.25 in the next, where the printed compile measured 1.99x. The step model's verdict
# (LAUNCH_WORTH) still decides; nanoGPT eager's 0.084 window (compiled: 1.64x and 1.84x in other
# runs) stays under the gate.
LAUNCH_SHARE = 0.10
LAUNCH_WORTH = 1.05       # the step after the fix must be at least this much shorter
# Share of the model's forward and backward time that torch.compile(mode="reduce-overhead") takes
# off the step: the step model's compile_e (docs/models.md: the in-house launch-bound row, 1.89x
# measured with h = 0.82; held out it is a prior, not a fit): (low, middle, high).
COMPILE_CAPTURE = tuple(sorted(CAL.compile_e))


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


def _fixes(compiled: bool) -> list[Fix]:
    first = (Fix("The model is compiled already (torch.compile): what is left is CUDA graphs, one launch "
                 "replaying all of a graph's kernels",
                 change='model = torch.compile(model, mode="reduce-overhead")  # or mode="max-autotune"',
                 knobs={"compile": "reduce-overhead"}) if compiled else
             Fix("Capture the step in CUDA graphs: one launch replays all its kernels",
                 change='model = torch.compile(model, mode="reduce-overhead")',
                 knobs={"compile": "reduce-overhead"}))
    return [first,
            Fix("Give each kernel more work: fewer, larger steps",
                change="DataLoader(..., batch_size=4 * batch_size)  # scale the learning rate with it"),
            Fix("Fuse the optimizer's per-parameter kernels",
                change="torch.optim.AdamW(model.parameters(), ..., fused=True)  # or foreach=True")]


def _split_reason(kind: str | None) -> str:
    if kind == "rnn":
        return ("runs a recurrent module (nn.LSTM, GRU, RNN), which torch.compile graph-breaks around by default "
                "(torch._dynamo.config.allow_rnn)")
    if kind == "transformer":
        return ("runs torch's nn.TransformerEncoder / TransformerDecoder, whose check of a mask passed without an "
                "is_causal hint is a data-dependent bool: torch.compile breaks the graph inside every call (passing "
                "is_causal=True, or tgt_is_causal=True, with a causal mask removes that check)")
    return "calls its modules from several places in turn, each call a graph of its own"


@rule("host.launch_bound", requires=("gpu", "pyspy"),
      description="the GPU idles while the host runs the step's Python: kernels are launched slower than they run")
def launch_bound(ev: Evidence) -> Finding | None:
    att = gpu_idle.for_evidence(ev)
    if not att.ok:
        return None
    x = att.idle_share("launch")
    if x < LAUNCH_SHARE:
        return None
    comp = compiled_model(ev.get("pyspy") or {})
    if comp["cudagraphs"]:
        return None        # the graphs replay from CUDA graphs already: no setting of the model is left
    sm = step_model.from_evidence(ev)
    if sm is None:
        return None
    # Compiling an eager model fuses its kernels too: the loop's and the GPU's time fall by an amount
    # host evidence cannot predict; the middle counts the step model's fitted compile_fusion, the
    # interval spans none to its optimistic end (split graphs: only the optimistic end).
    step = sm.after(Change(launch_captured=True, fusion=not comp["compiled"]))
    if step.speedup < LAUNCH_WORTH:
        if sm.split_graphs and not comp["compiled"]:
            ev.note(f"The GPU idles {pct(x)} of the time while the host issues its kernels, but CUDA graphs "
                    "(torch.compile mode=\"reduce-overhead\") are not printed: the step "
                    + _split_reason(sm.graph_break_kind)
                    + "; measured on public code: 0.87x (an LSTM language model), 0.92x (Lightning's nn.Transformer "
                    "language model), 1.00x and 0.97x (two GANs).")
        return None        # another constraint (the workers' pace, the GPU) sets the step after the fix
    e_lo, e_mid, e_hi = COMPILE_CAPTURE
    fuse_lo, fuse_mid, fuse_hi = step_model.calibration().compile_fusion
    fusion_words = (f"the estimate counts no fusion (the step {_split_reason(sm.graph_break_kind)}), the interval's "
                    f"top lets the step fall to {fuse_lo:g} of what capture alone leaves" if sm.split_graphs else
                    f"the estimate lets the step fall to {fuse_mid:g} of what capture alone leaves (fitted on "
                    f"compiled eager models of the ledgers), the interval from {fuse_hi:g} (no fusion) to {fuse_lo:g}")
    facts = _facts(ev, att, x)
    what = ("with CUDA graphs (the model is compiled already; CUDA graphs capture about "
            f"e={e_mid:g} ({e_lo:g}-{e_hi:g}) of the model's forward and backward time (h={sm.graph_share:.2f} of the "
            "step), not the optimizer's step nor the Python around the model)"
            if comp["compiled"] else
            f"with torch.compile(mode=\"reduce-overhead\") (its CUDA graphs take about e={e_mid:g} "
            f"({e_lo:g}-{e_hi:g}) of the model's forward and backward time (h={sm.graph_share:.2f} of the step) off "
            "the step, not the optimizer's step nor the Python around the model (a framework's closure, hooks and "
            "logging), and leave the GPU's own time; compiling an eager model also fuses "
            "its kernels, which shortens the loop's and the GPU's time by an amount the host's evidence does not "
            "predict: "
            + fusion_words + ")")
    bound = idle_bound(att, "running the step's Python (forward, backward, optimizer)", x) + "; " + \
        sm.derivation(what, step)
    if comp["compiled"]:
        facts.append(Fact("pyspy", "the model runs through torch.compile (frame seen: " + str(comp["frame"]) + ")",
                          True))
    speedup, interval = step.speedup, step.interval
    return Finding("host.launch_bound",
                   f"The GPU idles {pct(x)} of the time while the host issues its kernels: the step is launch-bound",
                   speedup, bound, ("medium" if x >= 0.4 else "low") if not comp["compiled"] else "low", facts,
                   _fixes(comp["compiled"]), risk="medium",
                   # The printed fix, torch.compile(mode="reduce-overhead"), measured 1.89x on the GPU
                   # ledger where 1/(1-x) said 4.53x; a hand-written whole-step CUDA graph (not printed)
                   # measured more. The interval spans the captured share e.
                   interval=interval,
                   details={"gpu_idle_share_launch": round(x, 4), "compiled": comp["compiled"],
                            "step_model": sm.details(step), "attribution": att.to_dict()})
