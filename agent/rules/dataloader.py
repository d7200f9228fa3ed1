"""dataloader.starved: the training loop waits on its input pipeline.

The speedup model (stated in every finding's speedup_bound). Per step, normalised to the measured
step time T = 1:
    f  share of the training thread spent waiting for or loading a batch (py-spy),
    C  = 1 - f, the loop's own time per step,
    D  CPU-seconds of data production per step: the workers' measured CPU (cores used), or the
       in-loop loading share when num_workers=0,
    U  CPU-seconds the whole job uses per step (all threads of the process and its workers),
    P  CPUs the job may use (affinity and cgroup quota),
    L  cores the training process itself uses while it computes (its intra-op threads; a fact).
With W single-threaded workers a step takes max(C, k D / W, U / P): the loop's own time, the
workers' production time, and the host's CPU capacity. k is the hand-off factor: a batch made in a
worker costs more CPU than the same batch made in the loop (pickling through shared memory, the
worker's own interpreter, collation twice); it is fitted to the ledger (docs/models.md) and applies
only where D was measured in the loop (num_workers=0); workers' measured CPU already carries it.
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
from typing import Any

from trainprobe.agent.evidence import Evidence
from trainprobe.agent.findings import Fact, Finding, Fix, pct
from trainprobe.agent.rules import rule

STARVED_SHARE = 0.10          # the loop waits on data for at least this share of its time
# The hand-off factor k (docs/models.md): CPU a batch costs in a worker over what it cost in the loop.
HANDOFF_K = (1.0, 1.5, 2.0)   # (low, middle, high)
HEADROOM = 1.5                # workers proposed over the fewest that reach the best step time
# Loop slowdown from sharing the CPUs with W busy workers: C grows by BETA * W / P (docs/models.md).
BETA = (0.0, 0.0, 0.9)        # (none, middle, high)
# The loop's own time after a fix that turns pin_memory on in a CUDA job that copied from pageable
# memory: C becomes A_PIN * C (docs/models.md: fitted to the GPU ledger's timm and Lightning rows,
# where the loop after the fix ran faster than its own measured time C; in-sample).
A_PIN = (0.6, 0.77, 1.0)      # (most shrink, middle, none)
# Re-created workers cost the loop more than the time py-spy sees it starting and joining them (s):
# after each fork the parent pays copy-on-write faults in its own code. Persistent workers return
# CHURN_M * s (docs/models.md: fitted to the CPU ledger's workers-recreated row, two runs).
CHURN_M = (1.0, 2.3, 3.0)
SAMPLE_Z = 2.0                # sampling error of f in the interval: this many standard errors
CROWDED_RUNQ = 0.05           # the loop waits for a CPU at least this share: count only the CPUs it gets
MIN_BAND = 0.15               # log half-width of the narrowest interval (sampling error of f and C)
BURSTY_BUSY = 0.70            # workers busy less than this while the loop still waits
GPU_WORTH = 1.05              # with GPU evidence: the GPU must idle during the data wait to gain this


def step_time(w: int, c: float, d: float, u: float, p: float, beta: float = 0.0, a: float = 1.0) -> float:
    """Step time with w workers; the loop's own time grows by beta * w / p as workers share its CPUs
    and is scaled by a (the loop's own time after the fix over today's, e.g. A_PIN)."""
    c = c * a
    c_w = c * (1.0 + beta * w / p) if p > 0 else c
    return max(c_w, d / max(w, 1), u / p if p > 0 else 0.0)


def max_workers(p: float, rest_cores: float = 0.0) -> int:
    """The most workers the job may run: its CPUs minus the cores the rest of the job needs."""
    return max(1, int(math.floor(p - rest_cores + 1e-6)))


def propose_workers(c: float, d: float, u: float, p: float, w_cap: int) -> tuple[int, float]:
    """Smallest W in 1..w_cap whose step time is within 2% of the best in that range."""
    times = {w: step_time(w, c, d, u, p) for w in range(1, max(w_cap, 1) + 1)}
    best = min(times.values())
    w = min(k for k, t in times.items() if t <= best * 1.02)
    return w, times[w]


def _spy_worker_cores(workers: dict[str, Any], window_s: float) -> float:
    """Cores the DataLoader workers kept busy, from py-spy's samples of them (0 when unknown)."""
    if not window_s:
        return 0.0
    busy = sum(float(w.get("seconds") or 0.0) * (1.0 - float((w.get("breakdown") or {}).get("idle", 0.0)))
               for w in workers.get("per_worker") or [])
    return busy / window_s


def _model_inputs(ev: Evidence, trainer_pid: int | None, n_trainers: int, f: float, f_load: float, w_now: int,
                  facts: list[Fact], spy_workers: dict[str, Any] | None = None,
                  tt_seconds: float = 0.0) -> dict[str, Any]:
    """C, D, U, P for one training process (the target, or one rank) from the process evidence."""
    proc = ev.get("process")
    c = max(1.0 - f, 0.02)
    me = None
    if proc:
        me = next((x for x in proc["processes"] if x["pid"] == trainer_pid), None) if trainer_pid else None
        if me is None and n_trainers == 1:
            me = next((x for x in proc["processes"] if x["role"] == "main"), None)
    if proc and me is not None:
        # Ranks on one node share its CPUs: each may count on its fair share.
        p = float(proc["cpus_available"]) / max(n_trainers, 1)
        # CPUs other processes take: the training thread waited for a CPU a share r of the window
        # (schedstat), so a new worker would too. Capacity counts only what the job can get.
        th = next((t for t in me.get("threads", []) if t["tid"] == me["pid"]), None)
        win = float(proc.get("window_s") or 0.0)
        r_loop = (float(th["run_delay_seconds"]) / win) if (th and win and th.get("run_delay_seconds") is not None) \
            else 0.0
        if r_loop >= CROWDED_RUNQ:
            facts.append(Fact("process", "share of the window the training thread waited for a CPU (schedstat): "
                                         "other work crowds the CPUs", round(r_loop, 3)))
            p = max(1.0, p * (1.0 - min(r_loop, 0.9)))
        w_proc = [x for x in proc["processes"] if x["role"] == "dataloader_worker" and x.get("ppid") == me["pid"]
                  and x.get("cpu_cores") is not None]
        # Live workers: the most alive at once (at the window's start or end), not every PID seen:
        # workers re-created every epoch come and go and would otherwise be counted several times.
        alive_end = len([x for x in w_proc if x["alive_at_end"]])
        alive_start = len([x for x in w_proc if x.get("seen") in ("both", "start")])
        live = max(alive_end, alive_start)
        w_now = live if w_proc else w_now
        worker_cores = sum(x["cpu_cores"] for x in w_proc)
        # Workers that lived only part of the window (re-created each epoch) are missing from the
        # process probe's start/end readings; py-spy sampled them while they lived.
        worker_cores = max(worker_cores, _spy_worker_cores(spy_workers or {}, tt_seconds))
        main_cores = float(me.get("cpu_cores") or 0.0)
        u = main_cores + worker_cores if n_trainers > 1 else float(proc.get("total_cpu_cores") or (main_cores + worker_cores))
        d = worker_cores + f_load if w_now else f_load * HANDOFF_K[1]
        if d <= 0:
            d = f
        loop_cores = max(1.0, (main_cores - f_load) / c)
        share = f" (1/{n_trainers} of {proc['cpus_available']:g}, shared by {n_trainers} ranks)" if n_trainers > 1 else ""
        facts += [Fact("process", "CPUs the training process may use (affinity, cgroup quota)" + share, round(p, 2)),
                  Fact("process", "CPU cores it and its workers used over the window", round(u, 2)),
                  Fact("process", "cores the training process uses while it computes", round(loop_cores, 2)),
                  Fact("process", "DataLoader worker processes", w_now)]
        churn = proc.get("worker_churn", {}) or {}
        return {"c": c, "d": d, "u": u, "p": p, "loop": loop_cores, "w_now": w_now, "known_p": True,
                "d_inloop": not w_now, "pids_seen": len(w_proc),
                "uses_cuda": bool(proc.get("uses_cuda")),
                "recreated": bool(churn.get("appeared") or churn.get("vanished"))}
    p = float(ev.context.get("cpus_available") or 0.0) / max(n_trainers, 1)
    return {"c": c, "d": f * (HANDOFF_K[1] if not w_now else 1.0), "u": 1.0 + w_now,
            "p": p or float(64 * max(w_now, 1)), "loop": 1.0, "w_now": w_now, "d_inloop": not w_now, "pids_seen": w_now,
            "known_p": bool(p), "uses_cuda": bool(ev.context.get("uses_cuda")), "recreated": False}


def trainers(spy: dict[str, Any]) -> list[dict[str, Any]]:
    """The training processes py-spy saw: each rank of a multi-rank job, else the target itself."""
    # A child py-spy caught only briefly (a DataLoader worker re-created each epoch, sampled before it
    # entered its worker loop) is not a rank: a rank's training thread is seen doing training work.
    ranks = [r for r in spy.get("ranks") or [] if r.get("training_thread")
             and sum(v for k, v in r["training_thread"]["breakdown"].items() if k != "other") >= 0.1]
    if ranks and (spy.get("launcher") or len(ranks) > 1):
        return ranks
    if spy.get("training_thread"):
        return [{"pid": spy["training_thread"].get("pid") or spy.get("pid"), "training_thread": spy["training_thread"],
                 "workers": spy.get("workers") or {}}]
    return []


def data_share(tt: dict[str, Any]) -> float:
    return tt["breakdown"].get("data_wait", 0.0) + tt["breakdown"].get("data_load", 0.0)


def gpu_busy_of(ev: Evidence, pid: int) -> tuple[int, float] | None:
    """(GPU index, NVML busy share over the window) of the GPU a process used, from the gpu evidence."""
    gpu = ev.get("gpu") or {}
    idx = [p["gpu_index"] for p in gpu.get("processes") or [] if p.get("pid") == pid]
    per = gpu.get("per_gpu") or {}
    if len(set(idx)) != 1:
        return None
    g = per.get(idx[0])
    if not g or g.get("busy_fraction") is None:
        return None
    return idx[0], float(g["busy_fraction"])


def collective_wait_share(ev: Evidence, rank: dict[str, Any]) -> float | None:
    """Share of a rank's training thread spent off-CPU outside data waits: with ranks in lockstep,
    time spent waiting in collectives for a slower rank. Needs the process probe's thread CPU."""
    proc = ev.get("process")
    if not proc:
        return None
    me = next((x for x in proc["processes"] if x["pid"] == rank["pid"]), None)
    if me is None:
        return None
    th = next((t for t in me["threads"] if t["tid"] == rank["pid"]), None)
    if th is None or th.get("cpu_fraction") is None:
        return None
    bd = rank["training_thread"]["breakdown"]
    return max(0.0, 1.0 - th["cpu_fraction"] - bd.get("data_wait", 0.0))


@rule("dataloader.starved", requires=("pyspy",), uses=("process", "gpu"),
      description="the training loop waits on the DataLoader (py-spy) and more workers fit the CPUs")
def dataloader_starved(ev: Evidence) -> Finding | None:
    spy = ev.get("pyspy") or {}
    ranks = trainers(spy)
    if not ranks:
        return None
    worst = max(ranks, key=lambda r: data_share(r["training_thread"]))
    multi = len(ranks) > 1
    tt = worst["training_thread"]
    bd = tt["breakdown"]
    f_wait, f_load = bd.get("data_wait", 0.0), bd.get("data_load", 0.0)
    f = f_wait + f_load
    if f < STARVED_SHARE:
        return None
    workers_spy = worst.get("workers", {}) or {}
    inloop = f_load >= f_wait
    who = f"rank PID {worst['pid']}: " if multi else ""
    facts = [Fact("pyspy", who + "share of the training thread waiting for or loading batches", round(f, 3))]
    if multi:
        for r in ranks:
            if r is worst:
                continue
            wait = collective_wait_share(ev, r)
            facts.append(Fact("pyspy", f"rank PID {r['pid']}: share waiting for or loading its own batches",
                              round(data_share(r["training_thread"]), 3)))
            mine, theirs = gpu_busy_of(ev, r["pid"]), gpu_busy_of(ev, worst["pid"])
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
    top_tt = tt.get("top_stacks", {})
    top = top_tt.get("data_load") if inloop else top_tt.get("data_wait")
    if inloop:
        facts.append(Fact("pyspy", "batches are loaded in the training loop itself (num_workers=0)", round(f_load, 3)))
        if top:
            facts.append(Fact("pyspy", "hottest in-loop loading stack: " + " > ".join(top[0]["stack"][-3:]),
                              top[0]["fraction"]))
    else:
        facts.append(Fact("pyspy", "training thread blocked in _MultiProcessingDataLoaderIter waiting for workers",
                          round(f_wait, 3)))
    worker_top = workers_spy.get("top_stacks") or []
    if workers_spy.get("count") and worker_top:
        facts.append(Fact("pyspy", "hottest worker stack: " + " > ".join(worker_top[0]["stack"][-3:]),
                          worker_top[0]["fraction"]))
    m = _model_inputs(ev, worst["pid"], len(ranks), f, f_load, int(workers_spy.get("count") or 0), facts,
                      workers_spy, float(tt.get("seconds") or 0.0))
    c, d, u, p, w_now = m["c"], m["d"], m["u"], m["p"], m["w_now"]
    recreated = m["recreated"] or tt.get("worker_startup_seconds", 0) > 0
    if tt.get("worker_startup_seconds", 0) > 0:
        facts.append(Fact("pyspy", "seconds the loop spent starting DataLoader workers", tt["worker_startup_seconds"]))
    gpu = ev.get("gpu")
    own = gpu_busy_of(ev, worst["pid"]) if multi else None
    if own is not None:
        facts.append(Fact("gpu", f"share of the window the straggler's GPU {own[0]} was idle", round(1.0 - own[1], 4)))
    elif gpu and gpu.get("idle_fraction") is not None:
        facts.append(Fact("gpu", "share of the window the GPU was idle", gpu["idle_fraction"]))

    rest = m["loop"] if m["known_p"] else 0.0
    w_cap = max_workers(p, rest)
    # d carries the middle hand-off factor where it was measured in the loop; scale it for the range.
    k_lo, k_mid, k_hi = (k / HANDOFF_K[1] for k in HANDOFF_K) if m["d_inloop"] else (1.0, 1.0, 1.0)
    pinned_now = any("pin_memory" in (t.get("name") or "") or any("_pin_memory_loop" in fr for top in t.get("top") or []
                                                                   for fr in top.get("stack", []))
                     for t in (spy.get("other_threads") or []))
    if not w_now and not pinned_now:
        # With num_workers=0 no pin-memory thread runs to show the setting; transformers' Trainer
        # pins by default (dataloader_pin_memory=True), so a Trainer loop is not told to pin again.
        pinned_now = any("Trainer._inner_training_loop" in fr for v in top_tt.values() for x in v
                         for fr in x.get("stack", []))
    # A CUDA job that copies from pageable memory gets pin_memory=True with the fix: its loop sheds
    # part of its own time too (A_PIN, fitted to the GPU ledger).
    pin_fix = bool(m["uses_cuda"] and not pinned_now and not m["d_inloop"])
    a_lo, a_mid, a_hi = A_PIN if pin_fix else (1.0, 1.0, 1.0)
    # f is a share of py-spy samples: C carries its sampling error (SAMPLE_Z standard errors).
    n_samples = max(1.0, float(tt.get("seconds") or 0.0) * float(spy.get("rate_hz") or 25.0))
    c_err = SAMPLE_Z * math.sqrt(max(f * (1.0 - f), 0.0) / n_samples)
    w_min, _ = propose_workers(c * a_mid, d * k_hi, u, p, w_cap)
    w_best = min(w_cap, max(w_min, int(math.ceil(w_min * HEADROOM - 1e-9))))
    t_best = step_time(w_best, c, d, u, p)
    cpu_note = (f"P={p:g} CPUs, L={rest:.1f} for the loop, so W<={w_cap}" if m["known_p"]
                else "CPUs unknown (no process evidence): capacity not bounded")
    bursty = bool(w_now and (workers_spy.get("busy_fraction") or 1.0) < BURSTY_BUSY and f_wait > STARVED_SHARE)
    if bursty:
        facts.append(Fact("pyspy", "workers' busy share while the loop waits (bursty production)",
                          workers_spy.get("busy_fraction")))
    if m["pids_seen"] > w_now:
        facts.append(Fact("process", f"worker PIDs seen over the window ({w_now} alive at once)", m["pids_seen"]))
    more = w_best > w_now
    settings_help = more or recreated or (bursty and w_now)
    fixes: list[Fix] = []
    kwargs: dict[str, Any] = {}
    interval = None
    churn_bound = None
    if settings_help:
        w_prop = max(w_best, w_now)
        w_eval = w_prop
        # Today's step already carries today's workers' share of the CPUs: charge only the change.
        t_now = step_time(w_now, c, d, u, p, BETA[1]) / step_time(w_now, c, d, u, p) if w_now else 1.0
        t_mid = step_time(w_eval, c, d, u, p, BETA[1], a_mid) / t_now
        speedup = 1.0 / t_mid
        interval = (t_now / step_time(w_eval, c + c_err, d * k_hi, u, p, BETA[2], a_hi),
                    1.0 / step_time(w_eval, max(c - c_err, 0.02), d * k_lo, u, p, BETA[0], a_lo))
        if bursty and not more and not recreated:
            # Deeper prefetch removes only the bursty part of the wait, which the samples do not
            # separate from the workers' pace: half the gain, with the interval from none to all.
            interval = (1.0, speedup)
            speedup = 1.0 + (speedup - 1.0) / 2.0
        if recreated and not more:
            # Only the re-creation goes: the loop's time starting workers (py-spy: in
            # _MultiProcessingDataLoaderIter.__init__) and joining them at each epoch's end.
            s_start = min(float(tt.get("worker_startup_seconds") or 0.0) / max(float(tt.get("seconds") or 0.0), 1e-6),
                          f)
            s_stop = min(sum(x["fraction"] for x in top_tt.get("data_wait") or []
                             if any("_shutdown_workers" in fr for fr in x["stack"])), f - s_start)
            churn = s_start + s_stop
            if churn > 0:
                def _g(mult: float) -> float:
                    return 1.0 / (1.0 - min(mult * churn, 0.9))
                speedup = _g(CHURN_M[1])
                interval = (_g(CHURN_M[0] * 0.5), _g(CHURN_M[2]))
                facts.append(Fact("pyspy", "share of the loop starting and joining workers each epoch", round(churn, 3)))
                churn_bound = (f"workers re-created each epoch: the loop spends s={churn:.2f} starting and joining them "
                               f"(py-spy) and about {CHURN_M[1] - 1:g}x that again in copy-on-write faults after each "
                               f"fork (fitted to the ledger); persistent workers remove it: 1/(1-{CHURN_M[1]:g}s)="
                               f"{speedup:.2f}x ({CHURN_M[0] * 0.5:g}s to {CHURN_M[2]:g}s); an estimate")
        if more:
            kwargs["num_workers"] = w_prop
        if m["uses_cuda"] and not pinned_now:
            kwargs["pin_memory"] = True
        if recreated or (more and not w_now):
            kwargs["persistent_workers"] = True   # new workers are otherwise re-created every epoch
        if bursty and not more:
            kwargs["prefetch_factor"] = 4
        if not kwargs:
            settings_help = False
    if settings_help:
        args = [f"{k}={v}" for k, v in kwargs.items()]
        what = (f"Load batches in {w_prop} worker process{'es' if w_prop != 1 else ''}" if more
                else ("Keep the DataLoader workers alive across epochs" if recreated
                      else "Let each worker prefetch more batches"))
        fixes.append(Fix(what + (" into pinned memory" if kwargs.get("pin_memory") else ""),
                         change="DataLoader(..., " + ", ".join(args) + ")", knobs=dict(kwargs)))
        if m["uses_cuda"]:
            fixes.append(Fix("Copy batches without blocking the loop",
                             change="x = x.cuda(non_blocking=True)  # with pin_memory=True",
                             knobs={"non_blocking": True}))
        if recreated:
            facts.append(Fact("process", "worker processes were re-created during the window", True))
        bound = (f"f={f:.2f}; step = max(C(1+bW/P), kD/W, U/P) with C={c:.2f}, D={d:.2f}, W={w_prop}, U={u:.2f}, "
                 f"P={p:g} (today's step = 1); loop slowdown b={BETA[1]:g} ({BETA[0]:g}-{BETA[2]:g}); "
                 f"{cpu_note}; hand-off factor k={HANDOFF_K[0]:g}-{HANDOFF_K[2]:g}"
                 f"{' (D measured in the loop)' if m['d_inloop'] else ' (D measured in the workers)'}; "
                 f"{HEADROOM:g}x headroom over the fewest workers that reach the best step"
                 + (f"; pin_memory=True also shortens the loop's own time: C x {A_PIN[1]:g} ({A_PIN[0]:g}-{A_PIN[2]:g})"
                    if pin_fix else "")
                 + f"; C +/- {c_err:.2f} (py-spy sampling error); an estimate")
        bound = churn_bound or bound
    else:
        # The CPUs are the limit: more workers would only queue for the same cores.
        w_prop = w_now
        t_half = step_time(max(w_now, 1), c, d / 2.0, u - d / 2.0, p)
        speedup = 1.0 / t_half
        interval = (1.0, speedup)
        where = (top[0]["stack"][-1] if (inloop and top) else
                 (worker_top[0]["stack"][-1] if worker_top else "the dataset's __getitem__"))
        fixes.append(Fix("The CPUs are the limit: make each sample cheaper to produce",
                         change=f"speed up {where}: cache decoded samples, move augmentation to the GPU, "
                                "or give this job more CPUs", knobs={"sample_cost_factor": 0.5}))
        bound = (f"f={f:.2f}; {w_now} workers already fill the {p:g} CPUs ({cpu_note}); if a sample cost half "
                 f"the CPU: step >= max(C={c:.2f}, D/2W={d / 2:.2f}/{max(w_now, 1)}, (U-D/2)/P={u - d / 2:.2f}/{p:g})")
    ceiling = _gpu_ceiling(ev)
    if ceiling is not None:
        # The GPU's side: data-wait time during which the GPU idled. Not a bound (the ledger measured
        # gains past it: a loop freed from loading also launches its kernels sooner).
        x_gpu, gpu_speedup = ceiling
        if gpu_speedup < GPU_WORTH:
            return None       # the GPU stays busy while the loop waits: the wait hides behind GPU work
        if gpu_speedup < speedup:
            # The GPU ledger measured past this figure on every starved row where it was lower than
            # the CPU model (timm 6.20x against 4.4x, Lightning 3.17x against 2.2x): it only widens
            # the interval's low end.
            lo, hi = interval or (1.0, speedup)
            interval = (min(lo, gpu_speedup), hi)
            bound += (f"; the GPU idled {x_gpu:.2f} of the time while the loop fetched data (1/(1-x)="
                      f"{gpu_speedup:.2f}x): the interval's low end reaches it")
    if interval is not None:
        # The shares the model starts from are sampled (py-spy) and windowed (/proc): never narrower
        # than MIN_BAND around the estimate; wider when short-lived workers hid their CPU time.
        band = MIN_BAND if not recreated else 0.35
        interval = (min(interval[0], 1.0 + (speedup - 1.0) / math.exp(band)),
                    max(interval[1], 1.0 + (speedup - 1.0) * math.exp(band)))
    conf = "high" if (m["known_p"] and f >= 0.3 and settings_help) else "medium"
    title = (f"The training loop loads its own batches {pct(f)} of the time (num_workers=0)" if inloop and not w_now
             else f"The training loop waits on the DataLoader {pct(f)} of the time")
    if multi:
        title = (f"Rank PID {worst['pid']} is the straggler: " + title[0].lower() + title[1:]
                 + f"; the other {len(ranks) - 1} rank(s) wait for it in collectives")
        bound += "; ranks step in lockstep, so the job's step is the straggler's"
    return Finding("dataloader.starved", title, max(speedup, 1.0), bound, conf, facts, fixes, risk="low",
                   interval=interval,
                   details={"data_share": round(f, 4), "rank_pid": worst["pid"] if multi else None,
                            "ranks": len(ranks), "proposed_num_workers": w_prop, "current_num_workers": w_now,
                            "cpus_available": p, "settings_help": settings_help, "recreated": recreated,
                            "pin_memory_now": pinned_now,
                            "dataloader_kwargs": kwargs,
                            "model": {"C": round(c, 4), "D": round(d, 4), "U": round(u, 4), "P": p,
                                      "L": round(m["loop"], 3), "W_max": w_cap}})


def _gpu_ceiling(ev: Evidence) -> tuple[float, float] | None:
    """(x, 1/(1-x)): the share of the time the GPU idled while the loop fetched data (GPU evidence)."""
    if not ev.has("gpu"):
        return None
    from trainprobe.agent.analysis import gpu_idle
    att = gpu_idle.for_evidence(ev)
    if not att.ok:
        return None
    x = att.idle_share("data_wait", "data_load")
    return x, gpu_idle.amdahl(x)
