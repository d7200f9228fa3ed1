"""The DataLoader step-time model behind dataloader.starved (not a rule).

Per step, normalised to the measured step time T = 1:
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
model_inputs reads C, D, U, P and L for one training process from the process evidence.
"""
from __future__ import annotations

import math
from typing import Any

from trainprobe.agent.combiners.step_model import CAL, workers_of
from trainprobe.agent.evidence import Evidence
from trainprobe.agent.findings import Fact

# The calibrated constants live in one place, the step model's Calibration (fitted held out on the
# validation ledger: scripts/ledger.py --heldout, docs/models.md); these names are its (low, middle,
# high) values as the worker proposal below reads them.
# k: CPU a batch costs in a worker over what it cost in the loop.
HANDOFF_K = CAL.handoff_k
HEADROOM = 1.5                # workers proposed over the fewest that reach the best step time
# Loop slowdown from sharing the CPUs with W busy workers: C grows by BETA * W / P.
BETA = CAL.beta
# The loop's own time after pin_memory=True in a CUDA job that copied from pageable memory: A_PIN * C.
A_PIN = CAL.a_pin
SAMPLE_Z = 2.0                # sampling error of f in the interval: this many standard errors
CROWDED_RUNQ = 0.05           # the loop waits for a CPU at least this share: count only the CPUs it gets


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
    """Smallest W in 1..w_cap whose step time is within 2% of the best in that range. Past the W at
    which the workers' d / W falls below the loop's own floor max(c, u / p), more workers cannot
    shorten the step, so the search stops there (a bundle claiming 48 million CPUs took 6.7 GB and
    36 s to enumerate them all)."""
    w_cap = max(w_cap, 1)
    floor = max(c, u / p if p > 0 else 0.0)
    if floor > 0:
        w_cap = min(w_cap, math.ceil(d / floor) + 1)
    elif d > 0:         # nothing but the workers' pace: the step shortens all the way to w_cap
        w = max(1, math.ceil(w_cap / 1.02))
        while w > 1 and d / (w - 1) <= d / w_cap * 1.02:
            w -= 1
        while d / w > d / w_cap * 1.02:
            w += 1
        return w, step_time(w, c, d, u, p)
    times = {w: step_time(w, c, d, u, p) for w in range(1, w_cap + 1)}
    best = min(times.values())
    w = min(k for k, t in times.items() if t <= best * 1.02)
    return w, times[w]


def _trainer_process(proc: dict[str, Any], trainer_pid: int | None, n_trainers: int) -> dict[str, Any] | None:
    me = next((x for x in proc["processes"] if x["pid"] == trainer_pid), None) if trainer_pid else None
    if me is None and n_trainers == 1:
        me = next((x for x in proc["processes"] if x["role"] == "main"), None)
    return me


def _cpus_for_loop(proc: dict[str, Any], me: dict[str, Any], n_trainers: int, facts: list[Fact]) -> float:
    """P: the rank's fair share of the node's CPUs, less what other work takes from it."""
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
    return p


def model_inputs(ev: Evidence, trainer_pid: int | None, n_trainers: int, f: float, f_load: float, w_now: int,
                 facts: list[Fact], spy_workers: dict[str, Any] | None = None,
                 tt_seconds: float = 0.0) -> dict[str, Any]:
    """C, D, U, P, L for one training process (the target, or one rank) from the process evidence."""
    proc = ev.get("process")
    c = max(1.0 - f, 0.02)
    me = _trainer_process(proc, trainer_pid, n_trainers) if proc else None
    if not proc or me is None:
        return _inputs_without_process(ev, n_trainers, f, w_now, c)
    p = _cpus_for_loop(proc, me, n_trainers, facts)
    w_proc, w_now, worker_cores = workers_of(proc, me, w_now, spy_workers, tt_seconds)
    main_cores = float(me.get("cpu_cores") or 0.0)
    u = main_cores + worker_cores if n_trainers > 1 else float(proc.get("total_cpu_cores") or (main_cores + worker_cores))
    d = worker_cores + f_load if w_now else f_load * HANDOFF_K[1]
    if d <= 0:
        d = f
    # Cores the loop uses while it computes: the CPU of its threads, not the pin-memory thread's (which
    # runs whatever the loop does), less its own loading, over the time it computes; never more than
    # its busy threads or the CPUs it may use (a loop that waits most of the window would otherwise
    # read 12.5 cores on 2 CPUs).
    team = [t for t in me.get("threads") or [] if "pin" not in (t.get("name") or "")]
    team_cores = sum(float(t.get("cpu_fraction") or 0.0) for t in team) if team else main_cores
    busy = max(1, sum(1 for t in team if float(t.get("cpu_fraction") or 0.0) >= 0.10))
    loop_cores = max(1.0, min((team_cores - f_load) / c, float(busy), p))
    share = f" (1/{n_trainers} of {proc['cpus_available']:.3g}, shared by {n_trainers} ranks)" if n_trainers > 1 else ""
    quota = proc.get("cpu_quota_cores")
    allowed = float(proc["cpus_available"]) / max(n_trainers, 1)
    where = f"affinity {proc.get('cpus_allowed')} CPUs, " + (f"cgroup quota {quota:.3g} CPUs" if quota else "no cgroup quota")
    facts.append(Fact("process", f"CPUs the training process may use ({where})" + share, round(allowed, 2)))
    if p < allowed - 1e-6:
        facts.append(Fact("process", "CPUs it can count on while other work crowds them (derived: the CPUs it may "
                                     "use times 1 - its loop's run-queue share)", round(p, 2)))
    facts += [
              Fact("process", "CPU cores it and its workers used over the window", round(u, 2)),
              Fact("process", "cores the training process uses while it computes", round(loop_cores, 2)),
              Fact("process", "DataLoader worker processes", w_now)]
    churn = proc.get("worker_churn", {}) or {}
    return {"c": c, "d": d, "u": u, "p": p, "loop": loop_cores, "w_now": w_now, "known_p": True,
            "d_inloop": not w_now, "pids_seen": len(w_proc),
            "uses_cuda": bool(proc.get("uses_cuda")),
            "recreated": bool(churn.get("appeared") or churn.get("vanished"))}


def _inputs_without_process(ev: Evidence, n_trainers: int, f: float, w_now: int, c: float) -> dict[str, Any]:
    """Without the process probe: P from the session's context, U and D from py-spy's shares."""
    p = float(ev.context.get("cpus_available") or 0.0) / max(n_trainers, 1)
    return {"c": c, "d": f * (HANDOFF_K[1] if not w_now else 1.0), "u": 1.0 + w_now,
            "p": p or float(64 * max(w_now, 1)), "loop": 1.0, "w_now": w_now, "d_inloop": not w_now, "pids_seen": w_now,
            "known_p": bool(p), "uses_cuda": bool(ev.context.get("uses_cuda")), "recreated": False}


def settings_step(m: dict[str, Any], w: int, c_err: float, k: tuple[float, float, float],
                  a: tuple[float, float, float]) -> tuple[float, tuple[float, float]]:
    """(speedup, interval) with w workers: today's step carries today's workers' share of the CPUs,
    so only the change is charged; the interval spans k, the loop slowdown, A_PIN and C's error."""
    c, d, u, p, w_now = m["c"], m["d"], m["u"], m["p"], m["w_now"]
    t_now = step_time(w_now, c, d, u, p, BETA[1]) / step_time(w_now, c, d, u, p) if w_now else 1.0
    t_mid = step_time(w, c, d, u, p, BETA[1], a[1]) / t_now
    interval = (t_now / step_time(w, c + c_err, d * k[2], u, p, BETA[2], a[2]),
                1.0 / step_time(w, max(c - c_err, 0.02), d * k[0], u, p, BETA[0], a[0]))
    return 1.0 / t_mid, interval
