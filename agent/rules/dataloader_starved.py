"""dataloader.starved: the training loop waits on its input pipeline.

Two rules. The py-spy rule models the step from the CPUs (below; the model's code is in
_dataloader_model.py). The GPU rule, with NVML evidence, reports the share of the time the GPU idled
while the loop fetched data; it runs after the py-spy rule (`after` names this id) and never claims
more than that rule's CPU-capacity model.

The speedup model (stated in every finding's speedup_bound): with W workers a step takes
max(C, k D / W, U / P) of today's, the loop's own time, the workers' production time and the host's
CPU capacity (the terms and the hand-off factor k are defined in _dataloader_model.py).
The workers proposed: never more than the CPUs the job may use minus the cores the training
process itself needs (L), and, within that, HEADROOM times the fewest that reach the best step time
under the pessimistic k: too few workers cost speed, a few too many only memory. Workers are
counted live (the most alive at once), not every PID seen: workers re-created every epoch come and
go, which the process probe sees, and the fix then adds persistent_workers=True. A fix never
restates the current setting (today's live workers, pin_memory when its thread is seen).
The expected speedup is 1 / T'(W) at the middle k, and the interval spans the k range, the loop
slowdown beside workers, the loop's shrink after a pinning fix (A_PIN), py-spy's sampling error of f
and, with GPU evidence, the GPU-idle share: an estimate, not a bound (constants fitted to the
validation ledger, docs/models.md). When today's workers already fill the
cores, settings cannot help; the finding then quotes what halving the per-sample CPU cost would give.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from trainprobe.agent.analysis import gpu_idle
from trainprobe.agent.analysis.gpu_idle import amdahl
from trainprobe.agent.combiners import step_model
from trainprobe.agent.combiners.step_model import CAL, Change, StepModel
from trainprobe.agent.combiners.training_ranks import collective_wait_share, data_share, gpu_busy_of, lockstep, trainers
from trainprobe.agent.evidence import Evidence
from trainprobe.agent.findings import Fact, Finding, Fix, pct
from trainprobe.agent.rules import rule
from trainprobe.agent.rules._dataloader_model import (A_PIN, BETA, HANDOFF_K, HEADROOM, SAMPLE_Z,
                                                      max_workers, model_inputs, propose_workers, settings_step,
                                                      step_time)
from trainprobe.agent.rules._gpu_facts import CAUSE_SHARE, common_facts, idle_bound

STARVED_SHARE = 0.10          # the loop waits on data for at least this share of its time
MIN_BAND = 0.15               # log half-width of the narrowest interval (sampling error of f and C)
BURSTY_BUSY = 0.70            # workers busy less than this while the loop still waits
GPU_WORTH = 1.05              # with GPU evidence: the GPU must idle during the data wait to gain this
FS_WORTH = 1.05               # handing batches over by file name joins the fix where it gains this over fds
UNREAD_SHOWN = 0.05           # py-spy could not read at least this share of its samples: the evidence says so


@dataclass
class Loop:
    """The training loop that waits longest on data (the straggler rank, or the one process)."""
    ranks: list[dict[str, Any]]
    worst: dict[str, Any]
    lockstep: bool = True                    # the ranks step together (training_ranks.lockstep)
    tt: dict[str, Any] = field(init=False)
    f_wait: float = field(init=False)
    f_load: float = field(init=False)
    f_eval: float = field(init=False)

    def __post_init__(self) -> None:
        self.tt = self.worst["training_thread"]
        bd = self.tt["breakdown"]
        # An evaluation pass's loader (iterated where nothing trains) is not the one a fix changes.
        ev_wait, ev_load, _start = step_model.eval_loaders(self.tt)
        self.f_wait = max(bd.get("data_wait", 0.0) - ev_wait, 0.0)
        self.f_load = max(bd.get("data_load", 0.0) - ev_load, 0.0)
        self.f_eval = ev_wait + ev_load

    @property
    def train_site(self) -> str | None:
        """The frame iterating the training loader, where an evaluation loader was told apart."""
        if self.f_eval <= 0:
            return None
        return next((r["site"] for r in self.tt.get("loaders") or [] if r.get("trains")), None)

    @property
    def eval_sites(self) -> list[dict[str, Any]]:
        return [r for r in self.tt.get("loaders") or [] if r.get("trains") is False]

    @property
    def multi(self) -> bool:
        return len(self.ranks) > 1

    @property
    def f(self) -> float:
        return self.f_wait + self.f_load

    @property
    def inloop(self) -> bool:
        return self.f_load >= self.f_wait

    @property
    def workers(self) -> dict[str, Any]:
        return self.worst.get("workers", {}) or {}

    @property
    def top_stacks(self) -> dict[str, Any]:
        return self.tt.get("top_stacks", {})

    @property
    def top(self) -> list[dict[str, Any]] | None:
        return self.top_stacks.get("data_load") if self.inloop else self.top_stacks.get("data_wait")

    @property
    def worker_top(self) -> list[dict[str, Any]]:
        return self.workers.get("top_stacks") or []


@dataclass
class Plan:
    """What the finding proposes and what it is worth."""
    speedup: float
    interval: tuple[float, float] | None
    bound: str
    fixes: list[Fix]
    w_prop: int
    kwargs: dict[str, Any]
    settings_help: Any
    w_cap: int = 0
    pinned_now: bool = False
    step_details: dict[str, Any] | None = None


def _rank_facts(ev: Evidence, lp: Loop) -> list[Fact]:
    """The other ranks: their own data share, and how long they wait in collectives for the straggler."""
    facts = []
    for r in lp.ranks:
        if r is lp.worst:
            continue
        facts.append(Fact("pyspy", f"rank PID {r['pid']}: share waiting for or loading its own batches",
                          round(data_share(r["training_thread"]), 3)))
        if not lp.lockstep:
            continue
        wait = collective_wait_share(ev, r)
        mine, theirs = gpu_busy_of(ev, r["pid"]), gpu_busy_of(ev, lp.worst["pid"])
        if mine and theirs and mine[0] != theirs[0]:
            # Ranks run the same model on the same batch size: the straggler's GPU shows what a
            # step's own kernels take; the rest of this rank's "busy" GPU is collectives spinning
            # while they wait for the straggler (NVML counts a waiting NCCL kernel as busy).
            facts.append(Fact("gpu", f"rank PID {r['pid']}: GPU {mine[0]} busy {pct(mine[1])} (NVML) against "
                              f"{pct(theirs[1])} on the straggler's GPU {theirs[0]} for the same steps: share of "
                              "the window its collectives wait for the straggler, not for its own data",
                              round(max(0.0, mine[1] - theirs[1]), 3)))
        elif wait is not None:
            facts.append(Fact("process", f"rank PID {r['pid']}: share of its step off-CPU in forward/backward "
                              f"(waiting in collectives for the straggler, not for its own data)", round(wait, 3)))
    return facts


def _loop_facts(ev: Evidence, lp: Loop) -> list[Fact]:
    """What py-spy saw the loop (and its workers) do while it waited."""
    who = f"rank PID {lp.worst['pid']}: " if lp.multi else ""
    facts = [Fact("pyspy", who + "share of the training thread waiting for or loading batches", round(lp.f, 3))]
    if lp.multi:
        facts += _rank_facts(ev, lp)
    if lp.inloop:
        facts.append(Fact("pyspy", "batches are loaded in the training loop itself (num_workers=0)",
                          round(lp.f_load, 3)))
        if lp.top:
            facts.append(Fact("pyspy", "hottest in-loop loading stack: " + " > ".join(lp.top[0]["stack"][-3:]),
                              lp.top[0]["fraction"]))
        unread = (ev.get("pyspy") or {}).get("unread") or {}
        if not lp.multi and unread.get("share", 0.0) >= UNREAD_SHOWN:
            # dropped where the loop's Python changes fastest: in its own loading, that share reads low
            facts.append(Fact("pyspy", "samples py-spy could not read without stopping the job (dropped; "
                              "often in the loop's own loading, whose share then reads low)", unread["share"]))
    else:
        facts.append(Fact("pyspy", "training thread blocked in _MultiProcessingDataLoaderIter waiting for workers",
                          round(lp.f_wait, 3)))
    for r in lp.eval_sites:
        facts.append(Fact("pyspy", f"share waiting on the DataLoader iterated at {r['site']}, where nothing "
                          "trains (an evaluation pass; the fix is for the training loader"
                          + (f" at {lp.train_site}" if lp.train_site else "") + ")",
                          round(r["data_wait"] + r["data_load"], 3)))
    if lp.workers.get("count") and lp.worker_top:
        facts.append(Fact("pyspy", "hottest worker stack: " + " > ".join(lp.worker_top[0]["stack"][-3:]),
                          lp.worker_top[0]["fraction"]))
    return facts


def _gpu_idle_fact(ev: Evidence, lp: Loop) -> Fact | None:
    gpu = ev.get("gpu")
    own = gpu_busy_of(ev, lp.worst["pid"]) if lp.multi else None
    if own is not None:
        return Fact("gpu", f"share of the window the straggler's GPU {own[0]} was idle", round(1.0 - own[1], 4))
    if gpu and gpu.get("idle_fraction") is not None:
        return Fact("gpu", "share of the window the GPU was idle", gpu["idle_fraction"])
    return None


def _pinned_now(spy: dict[str, Any], lp: Loop, w_now: int) -> bool:
    """Whether batches are pinned today: a pin-memory thread runs, or transformers' Trainer loads them."""
    pinned = any("pin_memory" in (t.get("name") or "") or any("_pin_memory_loop" in fr for top in t.get("top") or []
                                                              for fr in top.get("stack", []))
                 for t in (spy.get("other_threads") or []))
    if not w_now and not pinned:
        # With num_workers=0 no pin-memory thread runs to show the setting; transformers' Trainer
        # pins by default (dataloader_pin_memory=True), so a Trainer loop is not told to pin again.
        pinned = any("Trainer._inner_training_loop" in fr for v in lp.top_stacks.values() for x in v
                     for fr in x.get("stack", []))
    return pinned


def _churn(sm: StepModel | None, w: int, facts: list[Fact]) -> tuple[float, tuple[float, float], str] | None:
    """Workers re-created each epoch: (speedup, interval, bound) of keeping them, or None."""
    if sm is None or sm.churn_s <= 0:
        return None
    step = sm.after(Change(persistent=True, workers=w))
    facts.append(Fact("pyspy", "share of the loop starting and joining workers each epoch", round(sm.churn_s, 3)))
    m = CAL.churn_m
    bound = (f"workers re-created each epoch: the loop spends {100 * sm.churn_s:.0f}% of the step starting and "
             f"joining them (py-spy) and about {m[1] - 1:g}x that again in copy-on-write faults after each fork "
             f"(fitted to the ledger), at most half the loop's own time; persistent workers remove both: "
             + sm.derivation("with persistent workers", step).split("; ", 1)[1])
    if sm.one_start_only(Change(persistent=True, workers=w)):
        if sm.epoch_known():
            bound += (f"; the window saw the workers started once, and the workers it saw go had lived "
                      f"{sm.epoch_s:.1f} s, start to join: the start and join take their share of that epoch, "
                      f"not of the {sm.window_s:.1f} s window")
            facts.append(Fact("process", "seconds the workers of the last epoch lived, start to join",
                              round(sm.epoch_s, 2)))
        else:
            bound += ("; the window saw the workers started once, which cannot tell the epoch's length (an epoch "
                      "longer than the window holds its start in a smaller share of the job): the number is the "
                      "geometric mean of the step with the window's share and with none of it")
    return step.speedup, step.interval, bound


def _settings_kwargs(m: dict[str, Any], w_prop: int, more: bool, recreated: bool, bursty: bool,
                     pinned_now: bool) -> dict[str, Any]:
    """The DataLoader arguments the fix sets: never today's setting restated."""
    kwargs: dict[str, Any] = {}
    if more:
        kwargs["num_workers"] = w_prop
    if m["uses_cuda"] and not pinned_now:
        kwargs["pin_memory"] = True
    if recreated or (more and not m["w_now"]):
        kwargs["persistent_workers"] = True   # new workers are otherwise re-created every epoch
    if bursty and not more:
        kwargs["prefetch_factor"] = 4
    return kwargs


def _settings_fixes(m: dict[str, Any], kwargs: dict[str, Any], w_prop: int, more: bool, recreated: bool) -> list[Fix]:
    args = [f"{k}={v}" for k, v in kwargs.items()]
    what = (f"Load batches in {w_prop} worker process{'es' if w_prop != 1 else ''}" if more
            else ("Keep the DataLoader workers alive across epochs" if recreated
                  else "Let each worker prefetch more batches"))
    pinned = (" and load into pinned memory" if recreated and not more else " into pinned memory")
    fixes = [Fix(what + (pinned if kwargs.get("pin_memory") else ""),
                 change="DataLoader(..., " + ", ".join(args) + ")", knobs=dict(kwargs))]
    if m["uses_cuda"]:
        fixes.append(Fix("Copy batches without blocking the loop",
                         change="x = x.cuda(non_blocking=True)  # with pin_memory=True",
                         knobs={"non_blocking": True}))
    return fixes


def _settings_bound(lp: Loop, m: dict[str, Any], w_prop: int, cpu_note: str, pin_fix: bool, c_err: float) -> str:
    return (f"f={lp.f:.2f}; step = max(C(1+bW/P), kD/W, U/P) with C={m['c']:.2f}, D={m['d']:.2f}, W={w_prop}, "
            f"U={m['u']:.2f}, P={m['p']:.3g} (today's step = 1); loop slowdown b={BETA[1]:g} ({BETA[0]:g}-{BETA[2]:g}); "
            f"{cpu_note}; hand-off factor k={HANDOFF_K[0]:g}-{HANDOFF_K[2]:g}"
            f"{' (D measured in the loop)' if m['d_inloop'] else ' (D measured in the workers)'}; "
            f"{HEADROOM:g}x headroom over the fewest workers that reach the best step"
            + (f"; pin_memory=True also shortens the loop's own time: C x {A_PIN[1]:g} ({A_PIN[0]:g}-{A_PIN[2]:g})"
               if pin_fix else "")
            + f"; C +/- {c_err:.2f} (py-spy sampling error); an estimate")


def _settings_plan(ev: Evidence, lp: Loop, m: dict[str, Any], facts: list[Fact], recreated: bool,
                   force: dict[str, Any] | None = None) -> Plan:
    """More workers, persistent workers or deeper prefetch where they fit the CPUs; else the CPUs
    are the limit and the plan is a cheaper sample. `force`: the DataLoader settings to evaluate
    instead of the ones the rule would choose (at_knobs: a fix that was applied and measured)."""
    spy = ev.get("pyspy") or {}
    rest = m["loop"] if m["known_p"] else 0.0
    w_cap = max_workers(m["p"], rest)
    # d carries the middle hand-off factor where it was measured in the loop; scale it for the range.
    k = tuple(x / HANDOFF_K[1] for x in HANDOFF_K) if m["d_inloop"] else (1.0, 1.0, 1.0)
    pinned_now = _pinned_now(spy, lp, m["w_now"])
    # A CUDA job that copies from pageable memory gets pin_memory=True with the fix (_settings_kwargs),
    # a loop loading its own batches too; the step model decides what that is worth (for such a loop,
    # only at the interval's optimistic end). Where batches come from workers the loop sheds part of
    # its own time (A_PIN, fitted to the GPU ledger; the fallback without a step model).
    pin_set = bool(m["uses_cuda"] and not pinned_now)
    if force is not None:
        pin_set = pin_set and bool(force.get("pin_memory"))
    pin_fix = pin_set and not m["d_inloop"]
    a = A_PIN if pin_fix else (1.0, 1.0, 1.0)
    # f is a share of py-spy samples: C carries its sampling error (SAMPLE_Z standard errors).
    n_samples = max(1.0, float(lp.tt.get("seconds") or 0.0) * float(spy.get("rate_hz") or 25.0))
    c_err = SAMPLE_Z * math.sqrt(max(lp.f * (1.0 - lp.f), 0.0) / n_samples)
    w_min, _ = propose_workers(m["c"] * a[1], m["d"] * k[2], m["u"], m["p"], w_cap)
    w_best = min(w_cap, max(w_min, int(math.ceil(w_min * HEADROOM - 1e-9))))
    cpu_note = (f"P={m['p']:.3g} CPUs, L={rest:.1f} for the loop, so W<={w_cap}" if m["known_p"]
                else "CPUs unknown (no process evidence): capacity not bounded")
    w_now = m["w_now"]
    bursty = bool(w_now and (lp.workers.get("busy_fraction") or 1.0) < BURSTY_BUSY and lp.f_wait > STARVED_SHARE)
    if bursty:
        facts.append(Fact("pyspy", "workers' busy share while the loop waits (bursty production)",
                          lp.workers.get("busy_fraction")))
    if m["pids_seen"] > w_now:
        facts.append(Fact("process", f"worker PIDs seen over the window ({w_now} alive at once)", m["pids_seen"]))
    if force is not None:
        w_best = int(force.get("num_workers", w_now))
        recreated = recreated and bool(force.get("persistent_workers"))
    more = w_best > w_now
    settings_help = more or recreated or (bursty and w_now)
    if force is not None and "sample_cost_factor" in force:
        settings_help = False
    if not settings_help:
        plan = _cpu_limited_plan(lp, m, cpu_note)
        plan.w_cap, plan.pinned_now = w_cap, pinned_now
        return plan
    w_prop = max(w_best, w_now)
    sm = step_model.from_evidence(ev, lp.worst["pid"] if lp.multi else None)
    threads, fs = None, False
    if sm is not None:
        step = sm.after(Change(workers=w_prop, pin_memory=pin_set, persistent=recreated))
        if step.oversubscribed:
            # The workers need CPUs the intra-op threads take: cap the threads so both fit (the joint fix).
            threads = max(1, int(math.floor(sm.p_allowed + 1e-6)) - w_prop)
            step = sm.after(Change(workers=w_prop, pin_memory=pin_set, persistent=recreated, intra_threads=threads))
            facts.append(Fact("process", f"busy intra-op threads of the training process beside {w_prop} new "
                                         f"worker(s) on {sm.p_allowed:.3g} CPUs", sm.threads_busy))
        fs_step = _by_file_name(sm, step, Change(workers=w_prop, pin_memory=pin_set, persistent=recreated,
                                                 intra_threads=threads, sharing_fs=True), more, force)
        if fs_step is not None:
            fs, step = True, fs_step
        speedup, interval = step.speedup, step.interval
        what = (f"with {w_prop} worker{'s' if w_prop != 1 else ''}" + (f" and {threads} intra-op thread"
                                                                       f"{'s' if threads != 1 else ''}"
                                                                       if threads else "")
                + (" handing batches over by file name" if fs else ""))
        words = sm.derivation(what, step, fs)
        scaling = sm.scaling_words(w_prop)
        if scaling:
            words += "; " + scaling
    else:
        speedup, interval = settings_step(m, w_prop, c_err, k, a)
        words = ""
    if bursty and not more and not recreated:
        # Deeper prefetch removes only the bursty part of the wait, which the samples do not
        # separate from the workers' pace: half the gain, with the interval from none to all.
        interval = (1.0, speedup)
        speedup = 1.0 + (speedup - 1.0) / 2.0
    churn = _churn(sm, w_prop, facts) if recreated and not more else None
    if churn is not None:
        speedup, interval, bound = churn
    else:
        bound = (words + f"; at most {w_cap} worker{'s' if w_cap != 1 else ''} fit beside the loop "
                 f"({cpu_note}); the symbols and constants are in details" if words
                 else _settings_bound(lp, m, w_prop, cpu_note, pin_fix, c_err))
    kwargs = _settings_kwargs(m, w_prop, more, recreated, bursty, pinned_now)
    fixes = _settings_fixes(m, kwargs, w_prop, more, recreated)
    if threads:
        fixes.insert(1, Fix(f"Cap the training process at {threads} intra-op thread{'s' if threads != 1 else ''} so "
                            f"the worker{'s' if w_prop != 1 else ''} get{'' if w_prop != 1 else 's'} a CPU "
                            f"({sm.threads_busy} busy now on {sm.p_allowed:.3g} CPUs)",
                            change=f"torch.set_num_threads({threads})  # at start-up, before the first op",
                            command=f"OMP_NUM_THREADS={threads} MKL_NUM_THREADS={threads} python ...",
                            knobs={"intra_op_threads": threads}))
    if fs:
        hl, hw = sm.batch_handoff("mid", CAL)
        fixes.insert(2 if threads else 1, Fix(
            f"Hand batches from the workers to the loop by shared-memory file name: at {1000 * sm.step_s:.1f} ms a "
            f"step, passing each tensor as a file descriptor (a socket handshake with a thread of the worker) "
            f"would cost about {100 * (hl + hw):.0f}% of today's step a batch (a job killed hard can leave its "
            "batches' files in /dev/shm)",
            change='torch.multiprocessing.set_sharing_strategy("file_system")  # at start-up, before the DataLoader '
                   'is built',
            knobs={"sharing_strategy": "file_system"}))
    if recreated:
        facts.append(Fact("process", "worker processes were re-created during the window", True))
    plan = Plan(speedup, interval, bound, fixes, w_prop, kwargs, settings_help, w_cap, pinned_now)
    plan.step_details = sm.details(step) if sm is not None else None
    return plan


def _by_file_name(sm: StepModel, step: Any, ch: Change, more: bool, force: dict[str, Any] | None) -> Any:
    """The step with batches handed over by shared-memory file name (torch.multiprocessing's
    "file_system" sharing strategy) where that is part of the fix: a loop that loads its own batches
    today, given workers, with the step's length measured, where the step model puts the saving at
    FS_WORTH or more (the per-batch hand-off is a fixed cost a batch: a large part of a short step).
    Under `force` (a fix that was applied and measured), where it was applied. None otherwise."""
    if force is not None:
        return sm.after(ch) if force.get("sharing_strategy") == "file_system" else None
    if not (more and sm.d_inloop and sm.step_s and not sm.interleaved_calls):
        return None
    fs = sm.after(ch)
    return fs if fs.speedup >= FS_WORTH * step.speedup else None


def _cpu_limited_plan(lp: Loop, m: dict[str, Any], cpu_note: str) -> Plan:
    """The CPUs are the limit: more workers would only queue for the same cores. What halving the
    per-sample CPU cost would give."""
    c, d, u, p, w_now = m["c"], m["d"], m["u"], m["p"], m["w_now"]
    t_half = step_time(max(w_now, 1), c, d / 2.0, u - d / 2.0, p)
    speedup = 1.0 / t_half
    where = (lp.top[0]["stack"][-1] if (lp.inloop and lp.top) else
             (lp.worker_top[0]["stack"][-1] if lp.worker_top else "the dataset's __getitem__"))
    fixes = [Fix("The CPUs are the limit: make each sample cheaper to produce",
                 change=f"speed up {where}: cache decoded samples, move augmentation to the GPU, "
                        "or give this job more CPUs", knobs={"sample_cost_factor": 0.5})]
    bound = (f"f={lp.f:.2f}; {w_now} workers already fill the {p:.3g} CPUs ({cpu_note}); if a sample cost half "
             f"the CPU: step >= max(C={c:.2f}, D/2W={d / 2:.2f}/{max(w_now, 1)}, (U-D/2)/P={u - d / 2:.2f}/{p:.3g})")
    return Plan(speedup, (1.0, speedup), bound, fixes, w_now, {}, False)


def _gpu_ceiling(ev: Evidence) -> tuple[float, float] | None:
    """(x, 1/(1-x)): the share of the time the GPU idled while the loop fetched data (GPU evidence)."""
    if not ev.has("gpu"):
        return None
    att = gpu_idle.for_evidence(ev)
    if not att.ok:
        return None
    x = att.idle_share("data_wait", "data_load")
    return x, amdahl(x)


def _with_gpu_side(ev: Evidence, plan: Plan) -> bool:
    """Widen the plan's interval by the GPU's side; False when the GPU stayed busy during the wait."""
    ceiling = _gpu_ceiling(ev)
    if ceiling is None:
        return True
    # The GPU's side: data-wait time during which the GPU idled. Not a bound (the ledger measured
    # gains past it: a loop freed from loading also launches its kernels sooner).
    x_gpu, gpu_speedup = ceiling
    if gpu_speedup < GPU_WORTH:
        return False       # the GPU stays busy while the loop waits: the wait hides behind GPU work
    if gpu_speedup < plan.speedup:
        # The GPU ledger measured past this figure on every starved row where it was lower than
        # the CPU model (timm 6.20x against 4.4x, Lightning 3.17x against 2.2x): it only widens
        # the interval's low end.
        lo, hi = plan.interval or (1.0, plan.speedup)
        plan.interval = (min(lo, gpu_speedup), hi)
        plan.bound += (f"; the GPU idled {x_gpu:.2f} of the time while the loop fetched data (1/(1-x)="
                       f"{gpu_speedup:.2f}x): the interval's low end reaches it")
    return True


def _widen(plan: Plan, recreated: bool) -> None:
    """The shares the model starts from are sampled (py-spy) and windowed (/proc): the interval is
    never narrower than MIN_BAND around the estimate; wider when short-lived workers hid their CPU."""
    if plan.interval is None:
        return
    band = MIN_BAND if not recreated else 0.35
    plan.interval = (min(plan.interval[0], 1.0 + (plan.speedup - 1.0) / math.exp(band)),
                     max(plan.interval[1], 1.0 + (plan.speedup - 1.0) * math.exp(band)))


def _title(lp: Loop, w_now: int) -> str:
    title = (f"The training loop loads its own batches {pct(lp.f)} of the time (num_workers=0)"
             if lp.inloop and not w_now else f"The training loop waits on the DataLoader {pct(lp.f)} of the time")
    if lp.f_eval >= 0.05:
        title += f" (and {pct(lp.f_eval)} on an evaluation pass's loader)"
    if lp.multi and lp.lockstep:
        title = (f"Rank PID {lp.worst['pid']} is the straggler: " + title[0].lower() + title[1:]
                 + f"; the other {len(lp.ranks) - 1} rank(s) wait for it in collectives")
    elif lp.multi:
        title = (f"Training process PID {lp.worst['pid']} (one of {len(lp.ranks)} that step on their own): "
                 + title[0].lower() + title[1:])
    return title


def _details(lp: Loop, m: dict[str, Any], plan: Plan, recreated: bool) -> dict[str, Any]:
    return {"data_share": round(lp.f, 4), "rank_pid": lp.worst["pid"] if lp.multi else None,
            "ranks": len(lp.ranks), "proposed_num_workers": plan.w_prop, "current_num_workers": m["w_now"],
            "cpus_available": m["p"], "settings_help": plan.settings_help, "recreated": recreated,
            "pin_memory_now": plan.pinned_now, "dataloader_kwargs": plan.kwargs,
            "step_model": plan.step_details,
            "model": {"C": round(m["c"], 4), "D": round(m["d"], 4), "U": round(m["u"], 4), "P": m["p"],
                      "L": round(m["loop"], 3), "W_max": plan.w_cap}}


def _starved_loop(ev: Evidence) -> Loop | None:
    ranks = trainers(ev.get("pyspy") or {})
    if not ranks:
        return None
    lp = Loop(ranks, max(ranks, key=lambda r: data_share(r["training_thread"])), lockstep(ev))
    return lp if lp.f >= STARVED_SHARE else None


EVAL_FIX_SHARE = 0.10     # an evaluation loader's wait at least this share of the window gets its own fix line


@rule("dataloader.starved", requires=("pyspy",), uses=("process", "gpu"),
      description="the training loop waits on the DataLoader (py-spy) and more workers fit the CPUs")
def dataloader_starved(ev: Evidence) -> Finding | None:
    return _finding(ev)


def at_knobs(ev: Evidence, knobs: dict[str, Any]) -> Finding | None:
    """The finding as this rule gives it, evaluated at these DataLoader settings (num_workers,
    pin_memory, persistent_workers, sample_cost_factor) instead of the ones it would propose: the
    validation ledger's measured fixes were applied with the settings printed when they were run."""
    return _finding(ev, dict(knobs))


def _finding(ev: Evidence, force: dict[str, Any] | None = None) -> Finding | None:
    lp = _starved_loop(ev)
    if lp is None:
        return None
    facts = _loop_facts(ev, lp)
    m = model_inputs(ev, lp.worst["pid"], len(lp.ranks), lp.f, lp.f_load, int(lp.workers.get("count") or 0), facts,
                     lp.workers, float(lp.tt.get("seconds") or 0.0))
    startup = lp.tt.get("worker_startup_seconds", 0)
    recreated = m["recreated"] or startup > 0
    if startup > 0:
        facts.append(Fact("pyspy", "seconds the loop spent starting DataLoader workers", startup))
    gpu_fact = _gpu_idle_fact(ev, lp)
    if gpu_fact is not None:
        facts.append(gpu_fact)
    plan = _settings_plan(ev, lp, m, facts, recreated, force)
    if not _with_gpu_side(ev, plan):
        return None
    _widen(plan, recreated)
    conf = "high" if (m["known_p"] and lp.f >= 0.3 and plan.settings_help) else "medium"
    if lp.multi and lp.lockstep:
        plan.bound += "; ranks step in lockstep, so the job's step is the straggler's"
    if lp.train_site:
        for fx in plan.fixes:
            if fx.change and fx.change.startswith("DataLoader("):
                fx.change += f"  # the training loader, iterated at {lp.train_site}"
        for r in lp.eval_sites:
            share = r["data_wait"] + r["data_load"]
            if share >= EVAL_FIX_SHARE:
                # Its own fix, not priced: the number above is for the training loader's.
                plan.fixes.append(Fix(
                    f"The evaluation pass's loader, iterated at {r['site']}, waits {pct(share)} of the time too: "
                    "give it workers that persist as well (not counted in the expected speedup)",
                    change="DataLoader(..., num_workers=N, persistent_workers=True)  # the evaluation loader"))
    return Finding("dataloader.starved", _title(lp, m["w_now"]), max(plan.speedup, 1.0), plan.bound, conf, facts,
                   plan.fixes, risk="low", interval=plan.interval,
                   details=_details(lp, m, plan, recreated))


def _existing(ev: Evidence) -> Finding | None:
    """The finding the py-spy rule above made, if it fired (this id is in the GPU rule's `after`)."""
    return next((f for f in ev.context.get("findings", []) if f.id == "dataloader.starved"), None)


def _gpu_fixes(ev: Evidence) -> list[Fix]:
    proc = ev.get("process") or {}
    cpus = proc.get("cpus_available") or ev.context.get("cpus_available")
    n = max(1, min(int(cpus) - 1, 8)) if cpus else 4
    return [Fix("Load batches in worker processes, into pinned memory",
                change=f"DataLoader(..., num_workers={n}, pin_memory=True, persistent_workers=True)",
                knobs={"num_workers": n, "pin_memory": True, "persistent_workers": True}),
            Fix("Copy batches without blocking the loop", change="x = x.cuda(non_blocking=True)  # with pin_memory=True",
                knobs={"non_blocking": True})]


# `after` names its own id: it runs after the py-spy rule above, whose CPU-capacity model bounds it.
@rule("dataloader.starved", requires=("gpu", "pyspy"), uses=("process",), after=("dataloader.starved",),
      description="the GPU idles while the training loop waits for or loads its next batch")
def gpu_idle_on_data(ev: Evidence) -> Finding | None:
    att = gpu_idle.for_evidence(ev)
    if not att.ok:
        return None
    x = att.idle_share("data_wait", "data_load")
    if x < CAUSE_SHARE:
        return None
    inloop = att.idle_share("data_load") >= att.idle_share("data_wait")
    facts = common_facts(ev, att) + [
        Fact("gpu+pyspy", "share of the observed time the GPU idled while the loop "
                          + ("loaded batches itself" if inloop else "waited for DataLoader workers"), round(x, 3)),
        Fact("gpu+pyspy", "GPU idle seconds the data path explains, of all idle seconds",
             f"{att.idle_seconds.get('data_wait', 0) + att.idle_seconds.get('data_load', 0):.2f} of "
             f"{att.idle_total_s:.2f}")]
    speedup = amdahl(x)
    bound = idle_bound(att, "fetching its next batch", x)
    cpu = _existing(ev)
    if cpu is not None and cpu.expected_speedup < speedup:
        # The CPU-capacity model of the py-spy rule is the tighter bound: the GPU side only adds facts.
        speedup = cpu.expected_speedup
        bound += f"; the CPU-capacity model ({cpu.expected_speedup:.2f}x) is tighter"
    title = f"The GPU idles {pct(x)} of the time while the training loop " + (
        "loads its own batches" if inloop else "waits for its DataLoader")
    return Finding("dataloader.starved", title, speedup, bound, "high" if x >= 0.3 else "medium", facts,
                   _gpu_fixes(ev), details={"gpu_idle_share_data": round(x, 4), "attribution": att.to_dict()})
