"""cpu.oversubscribed: more runnable threads than CPUs; run-queue delay steals time from the loop.

Facts, per thread of the job (the training process and its workers) over the window:
    cpu   share of the window on a CPU (process probe: /proc stat),
    r     share of the window runnable but waiting for a CPU: the scheduler probe's run-queue
          delay (bcc, wake-up/preemption to switch-in), or, without eBPF, the kernel's own
          per-thread counter in /proc/PID/task/TID/schedstat (same quantity, no histogram),
    P     CPUs the job may use (affinity and cgroup quota).
The job's demand D = sum(cpu + r) is the mean number of its threads that were runnable. It is
oversubscribed when D exceeds P and the training thread, its
intra-op team or the workers lose a measurable share of the window in the run queue. Other
processes that crowd a job which fits its CPUs do not make this finding (no setting of the job
removes them); where the scheduler probe measured them they are reported beside it and shrink
the thread numbers proposed.

The expected speedup comes from the step model (agent/combiners/step_model.py): the step after the
cap with every other constraint in place. Threads that time-share a CPU doing useful work need the
same CPU-seconds after the cap, so the run-queue wait itself is not the gain (16 intra-op threads
on 2 CPUs, r = 0.79: 1/(1-r) said 4.67x, the cap measured 0.90x). The cap gains the share of the
job's CPU time that was waste (spinning, refilling caches after each preemption: read from the
busy team's involuntary switches per held core) and the CPUs the job will hold that it did not.
The probes cannot tell a spinning thread from a working one, so the interval is wide and the
confidence low. When the workers are the delayed ones and the loop waits on data (py-spy), the
gain is 1 / (1 - min(r_workers, f)).

With no more threads than CPUs, libgomp (torch's OpenMP) spins 300,000 times at every barrier
instead of the 100 it spins when there are more threads than CPUs; on CPUs other processes share,
the spinning thread burns the time its peer waits for (the ledger: 0.09-0.30x for a cap to 2
threads under load, 0.6-2.2x with OMP_WAIT_POLICY=PASSIVE). So where others share the job's CPUs
the cap carries OMP_WAIT_POLICY=PASSIVE: the team keeps waiting the way it waits today.

The thread numbers in the fix: the CPUs the job may use, minus what other processes used over the
window (scheduler probe: host busy cores minus the job's), minus one core per busy DataLoader
worker, is what the training process's intra-op threads should be capped at (at least 1).
"""
from __future__ import annotations

import math
import shlex
from typing import Any

from trainprobe.agent.combiners import step_model
from trainprobe.agent.combiners.step_model import Change
from trainprobe.agent.evidence import Evidence
from trainprobe.agent.findings import Fact, Finding, Fix, pct
from trainprobe.agent.rules import rule

TRAIN_RUNQ_SHARE = 0.05      # the training thread or its team waits for a CPU at least this share
WORKER_RUNQ_SHARE = 0.10     # or the workers do, while the loop waits on data
BUSY = 0.10                  # a thread on a CPU or waiting for one at least this share is "busy"


def _thread_rows(ev: Evidence) -> tuple[list[dict[str, Any]], str]:
    """Per-thread cpu and run-queue shares, from the scheduler probe where it ran, else schedstat."""
    proc = ev.get("process") or {}
    win = float(proc.get("window_s") or 0.0) or 1e-6
    sched = ev.get("sched") or {}
    by_tid = {t["tid"]: t for t in sched.get("threads", [])}
    source = "sched" if by_tid else "process"
    rows = []
    for p in proc.get("processes", []):
        for t in p.get("threads", []):
            cpu = float(t.get("cpu_fraction") or 0.0)
            s = by_tid.get(t["tid"])
            if s is not None:
                r = float(s["runq_share"])
            elif t.get("run_delay_seconds") is not None:
                r = float(t["run_delay_seconds"]) / win
            else:
                r = 0.0
            rows.append({"pid": p["pid"], "role": p.get("role"), "tid": t["tid"], "name": t.get("name"),
                         "cpu": cpu, "r": min(r, 1.0), "sched": s,
                         "involuntary_ctxsw": t.get("involuntary_ctxsw")})
    return rows, source


def _launcher_ranks(proc: dict[str, Any], rows: list[dict[str, Any]]) -> tuple[int, ...]:
    """The ranks whose threads are the loop where the target itself does not train (a launcher: its main
    thread neither on a CPU nor waiting for one BUSY of the window); () otherwise."""
    ranks = tuple(p["pid"] for p in proc.get("processes", []) if p.get("role") == "rank")
    main = next((r for r in rows if r["tid"] == int(proc["pid"])), None)
    if not ranks or (main is not None and main["cpu"] + main["r"] >= BUSY):
        return ()
    return ranks


def src_of(source: str) -> str:
    return "sched" if source == "sched" else "process"


def _cmdline_prefix(cmdline: str | None) -> str:
    return (cmdline or "python train.py").strip()


def _loads(rows: list[dict[str, Any]], pid: int, rank_pids: tuple[int, ...] = ()) -> dict[str, Any] | None:
    """Run-queue shares of the training thread, its busy team and the workers, and the job's demand.
    Under a launcher (`rank_pids`: torchrun's ranks, or the training processes the job spawned) the
    training threads are the ranks' main threads, the team their busy threads."""
    loop_pids = set(rank_pids) or {pid}
    main_rows = [r for r in rows if r["pid"] in loop_pids]
    trains = [r for r in main_rows if r["tid"] == r["pid"]]
    if not trains:
        return None
    train = max(trains, key=lambda r: r["r"])
    team = [r for r in main_rows if r["cpu"] + r["r"] >= BUSY]
    workers = [r for r in rows if r["role"] == "dataloader_worker"]
    worker_main = [r for r in workers if r["tid"] == r["pid"]]
    r_team = sum(r["r"] for r in team) / len(team) if team else 0.0
    return {"train": train, "team": team, "worker_main": worker_main, "ranks": sorted(rank_pids),
            "worker_pids": sorted({r["pid"] for r in workers}),
            "busy": [r for r in rows if r["cpu"] + r["r"] >= BUSY],
            "demand": sum(r["cpu"] + r["r"] for r in rows), "r_train": train["r"], "r_team": r_team,
            "r_loop": max(train["r"], r_team),
            "r_workers": sum(r["r"] for r in worker_main) / len(worker_main) if worker_main else 0.0}


def _data_share(ev: Evidence) -> float | None:
    bd = ((ev.get("pyspy") or {}).get("training_thread") or {}).get("breakdown") or {}
    return (bd.get("data_wait", 0.0) + bd.get("data_load", 0.0)) if bd else None


def _thread_numbers(proc: dict[str, Any], rows: list[dict[str, Any]], ld: dict[str, Any], p_cpus: float,
                    others: float | None) -> dict[str, int]:
    """The thread numbers the fixes propose: the CPUs left after other processes and busy workers."""
    # A worker is busy as a thread is (on a CPU or waiting for one BUSY of the window): one that ran
    # 0.098 cores and queued 0.07 is one of the busy threads the title counts, and the CPU the
    # team's cap leaves it (timm's EfficientNet on 2 CPUs: counted idle, the fix proposed the team's
    # own 2 threads, a change of nothing, at 1.02x).
    busy_pids = {r["pid"] for r in rows if r["cpu"] + r["r"] >= BUSY}
    busy_workers = [pr for pr in proc["processes"] if pr.get("role") == "dataloader_worker"
                    and pr.get("alive_at_end")
                    and ((pr.get("cpu_cores") or 0.0) >= BUSY or pr.get("pid") in busy_pids)]
    others_whole = int(math.floor(others + 0.25)) if others else 0
    p_free = max(1, int(math.floor(p_cpus + 1e-6)) - others_whole)
    # Intra-op threads inside a worker: threads that themselves burn CPU (a queue feeder thread
    # that only waits for a CPU is not one).
    worker_threads = max((len([r for r in rows if r["pid"] == wp and r["cpu"] >= 2 * BUSY])
                          for wp in ld["worker_pids"]), default=0)
    n_ranks = max(1, len(ld["ranks"]))
    return {"w_busy": len(busy_workers), "others_whole": others_whole, "p_free": p_free,
            "n_main": max(1, (p_free - len(busy_workers)) // n_ranks), "worker_threads": worker_threads,
            "n_workers_cap": max(1, p_free - 1) if ld["worker_pids"] else 0}


def _facts(ld: dict[str, Any], source: str, p_cpus: float, others: float | None, f_data: float | None) -> list[Fact]:
    src = "sched" if source == "sched" else "process"
    how = "eBPF run-queue delay" if source == "sched" else "schedstat run_delay (no eBPF: totals only)"
    facts = [
        Fact("process", "CPUs the job may use (affinity, cgroup quota)", p_cpus),
        Fact(src, "busy threads in the job (on a CPU or waiting for one >=10% of the window)", len(ld["busy"])),
        Fact(src, "mean runnable threads of the job (CPU + run-queue time / window)", round(ld["demand"], 2)),
        Fact(src, f"share of the window the training thread waited for a CPU ({how})", round(ld["r_train"], 3)),
        Fact(src, f"mean run-queue share of the {len(ld['team'])} busy threads of the training process",
             round(ld["r_team"], 3)),
    ]
    if ld["worker_main"]:
        facts.append(Fact(src, f"mean run-queue share of the {len(ld['worker_main'])} DataLoader workers",
                          round(ld["r_workers"], 3)))
    ts = ld["train"].get("sched")
    if ts:
        facts.append(Fact("sched", "training thread run-queue delay p50 / p99 (us)",
                          f"{ts.get('runq_p50_us')} / {ts.get('runq_p99_us')}"))
        facts.append(Fact("sched", "training thread: involuntary preemptions, yields while runnable",
                          f"{ts.get('involuntary_preemptions')}, {ts.get('yields')}"))
    if others is not None:
        facts.append(Fact("sched", "CPU cores used by other processes (on the job's CPUs where the contention probe "
                                   "ran, else the host's busy cores minus the job)", round(others, 2)))
    if f_data is not None:
        facts.append(Fact("pyspy", "share of the training thread waiting for or loading batches", round(f_data, 3)))
    return facts


def _gain(ev: Evidence, ld: dict[str, Any], nt: dict[str, int], source: str, worker_hit: bool,
          f_data: float | None) -> tuple[float, tuple[float, float], str, dict[str, Any]]:
    """(speedup, interval, bound, details): the step after the fix (step model), or the run-queue
    wait of the workers the loop waits on."""
    r_loop, r_workers = ld["r_loop"], ld["r_workers"]
    how = "eBPF run-queue delay" if source == "sched" else "schedstat run_delay (no eBPF: totals only)"
    worker_gain = 1.0
    if worker_hit and f_data is not None:
        worker_gain = 1.0 / (1.0 - min(r_workers, f_data, 0.95))
    spin = ld.get("spin")
    if spin is not None and spin["team"] > nt["n_main"] and spin["runtime_share"] >= SPIN_SHARE:
        return _spin_gain(ld, nt, spin)
    m = step_model.process_model(ev)
    if nt.get("loop_loads") and m is not None:
        return _loop_loads_gain(m, ld, r_loop)
    n_after = nt["n_main"] if len(ld["team"]) > nt["n_main"] else None
    fewer = _fewer_workers(ld, nt, f_data)
    ch = Change(intra_threads=n_after, workers=nt["n_workers_cap"] if fewer else None, runq_removed=True)
    step = m.after(ch) if m is not None else None
    if step is None or (worker_hit and f_data is not None and worker_gain > step.speedup):
        lo_r = min(r_workers, f_data or 0.0)
        bound = (f"workers wait for a CPU {r_workers:.2f} of the window and the loop waits on data f={f_data:.2f}: "
                 f"1/(1-min(r_w,f))={worker_gain:.2f}x")
        return worker_gain, (1.0 / (1.0 - min(lo_r * 0.5, 0.95)), 1.0 + (worker_gain - 1.0) * 2.0), bound, {}
    what = f"with the training process capped at {n_after or len(ld['team'])} intra-op threads"
    if fewer:
        what += f" and {nt['n_workers_cap']} DataLoader workers"
    sigma = m.sigma("mid", step_model.calibration())
    held = ("measured" if m.others is not None else "not measured: the CPUs the job did not hold are taken as "
            "theirs, the interval's top as its own")
    bound = (f"the training thread / its team wait for a CPU r={r_loop:.2f} of the window ({how}), but threads that "
             f"time-share a CPU doing useful work need the same CPU time after the cap: {what}, the step loses "
             f"only the waste (about {sigma:.0%} of the job's CPU time, from {m.switch_rate:.0f} involuntary "
             f"switches per second per held core; spinning and useful work look alike to the probes) and gains "
             f"the CPUs the job will hold ({m.u:.2f} of {m.p_allowed:.3g} held today; others' share {held}), "
             f"its compute on fewer threads at the team's parallel efficiency {_efficiency(m)}: "
             f"{step.speedup:.2f}x ({step.interval[0]:.2f}-{step.interval[1]:.2f}x); an estimate")
    return step.speedup, step.interval, bound, m.details(step)


def _loop_loads_gain(m: Any, ld: dict[str, Any], r_loop: float) -> tuple[float, tuple[float, float], str,
                                                                          dict[str, Any]]:
    """The step once the loop loads its own batches (the step model's workers_to_loop), in words."""
    step = m.after(Change(workers=0))
    cal = step_model.calibration()
    back, stall = m.workers_to_loop(max(m.threads_busy, 1), "mid", cal)
    bound = (f"today's step: the loop waits for or receives its batches {pct(m.f_wait)}, and no CPU is left beside "
             f"its compute (P={m.p_allowed:.3g} CPUs, L={m.loop_cores:.2f} for the loop): the "
             f"{len(ld['worker_pids'])} workers' {m.worker_cores:.2f} cores came out of its intra-op team's, which "
             f"waited at its barriers for the member a worker displaced (the loop itself waited for a CPU "
             f"{pct(r_loop)} of the time); with the batches made in the loop (about {pct(back)} of today's step, "
             f"the workers' CPU a batch less its hand-off, over k) the step is set by the "
             f"{step.binding} term ({step.mid:.2f} of today's): {step.speedup:.2f}x "
             f"({step.interval[0]:.2f}-{step.interval[1]:.2f}x); an estimate")
    return step.speedup, step.interval, bound, m.details(step)


def _efficiency(m: Any) -> str:
    """The e a cap's compute is priced at, and where it comes from, in words."""
    cal = step_model.calibration()
    e = m.cap_par("mid", cal)
    if m.par_measured is not None:
        basis = m.par_basis or "from the threads' CPU-clock samples"
        return f"e = {e:.2f} ({basis})"
    return f"e = {e:g} (fitted on the ledgers; no CPU-clock samples of the team)"


SPIN_MIN_SAMPLES = 50        # the ranks' busy threads' CPU-clock samples needed (0.5 s of their CPU)
SPIN_SHARE = 0.05            # the ranks' teams spent at least this share of their CPU in the OpenMP runtime


def _work(v: dict[str, Any]) -> int:
    """A thread's CPU-clock samples outside the OpenMP runtime and the kernel."""
    return int(v["samples"]) - int(v["openmp"]) - int(v["kernel"])


def _rank_team_spin(ev: Evidence, ld: dict[str, Any]) -> dict[str, Any] | None:
    """Per rank, from the process probe's CPU-clock samples: its intra-op team (its training thread and
    the busy threads that ran the OpenMP runtime; a communication thread such as gloo's is not one),
    the cores its training thread and its other team threads worked (outside the runtime and the
    kernel), their kernel time, and the training thread's share of the window off a CPU while not
    waiting for one (collectives, I/O: what a cap does not shorten); with the runtime's and the
    kernel's shares of the teams' CPU. None without enough samples."""
    proc = ev.get("process") or {}
    oc = proc.get("oncpu") or {}
    th = oc.get("threads") or {}
    win = float(proc.get("window_s") or 0.0)
    period = float(oc.get("period_ms") or 10.0) / 1000.0
    if not th or not win:
        return None
    ranks, n_all, rt_all, k_all = [], 0, 0, 0
    for rp in ld["ranks"]:
        busy = [r for r in ld["team"] if r["pid"] == rp and str(r["tid"]) in th]
        main_row = next((r for r in busy if r["tid"] == rp), None)
        if main_row is None:
            continue
        main = th[str(rp)]
        others = [th[str(r["tid"])] for r in busy if r["tid"] != rp and int(th[str(r["tid"])]["openmp"]) > 0]
        ranks.append({"pid": rp, "team": 1 + len(others), "loop_work": _work(main) * period / win,
                      "team_work": sum(_work(v) for v in others) * period / win,
                      "kernel": sum(int(v["kernel"]) for v in [main, *others]) * period / win,
                      "off_cpu": max(0.0, 1.0 - main_row["cpu"] - main_row["r"])})
        for v in [main, *others]:
            n_all += int(v["samples"])
            rt_all += int(v["openmp"])
            k_all += int(v["kernel"])
    if n_all < SPIN_MIN_SAMPLES or not ranks:
        return None
    return {"ranks": ranks, "samples": n_all, "runtime_share": rt_all / n_all, "kernel_share": k_all / n_all,
            "team": max(r["team"] for r in ranks)}


def _spin_gain(ld: dict[str, Any], nt: dict[str, int],
               spin: dict[str, Any]) -> tuple[float, tuple[float, float], str, dict[str, Any]]:
    """Each rank capped at n' intra-op threads, the ranks' threads together no more than the CPUs:
    nobody waits at a barrier for a peer that waits for a CPU another rank holds, and each rank runs
    its team on c = P / ranks cores of its own. Per second of today's progress the rank did w_l of
    work on its training thread and w_t on its other team threads (their CPU-clock samples outside
    the OpenMP runtime and the kernel), worth w_l + e w_t of one thread's work, e the team's parallel
    efficiency (par_eff: how much of the others' work bought speed); after the cap its team does
    1 + e (min(n', c) - 1) of one thread's work a second (c where c < 1), and the training thread's
    time off a CPU that was not a wait for one (o: collectives, I/O) stays: the step after the cap is
    o + (w_l + e w_t) / (1 + e (min(n', c) - 1)) of today's; the job's gain is the ranks' mean. The
    interval's bottom takes e = 1 with the kernel's time kept (switching that may stay), its top the
    capped team at full parallel speed against today's work at the middle e, or e = 0, whichever is
    higher: under thrash the team's work outside the runtime is not all useful (cache refills, the
    barrier code outside libgomp), and a team that thrashes no more does more of its work in
    parallel; the top also leaves out o."""
    # par_eff as it ships (fitted on single-process 2-CPU jobs whose teams did not thrash), not the
    # calibration a held-out fold sets: these rows are not fitted to, nor fit it (docs/models.md)
    cal = step_model.Calibration()
    n_ranks = max(len(ld["ranks"]), 1)
    cores = nt["p_free"] / n_ranks
    n_after = max(1, nt["n_main"])

    def rate(e: float) -> float:
        return cores if cores < 1.0 else 1.0 + e * (min(n_after, cores) - 1.0)

    def gain(e_after: float, e_today: float, kernel: bool, waits: bool = True) -> float:
        # the step after the cap, in today's: the off-CPU waits that stay, and today's work at the
        # capped team's pace
        gs = [1.0 / max((r["off_cpu"] if waits else 0.0)
                        + (r["loop_work"] + e_today * r["team_work"] + (r["kernel"] if kernel else 0.0))
                        / rate(e_after), 0.02) for r in spin["ranks"]]
        return max(1.0, sum(gs) / len(gs))
    e_hi, e_mid, e_lo = cal.par_eff[0], cal.par_eff[1], cal.par_eff[2]     # e = 0, 0.5, 1
    mid = gain(e_mid, e_mid, False)
    lo = min(gain(e_lo, e_lo, True), mid)
    # the top also drops the training thread's off-CPU share: /proc's CPU and run-queue ticks of a
    # thread that spins and waits in turn leave a slop of a few percent, which sets the step at 20x
    hi = max(gain(e_hi, e_hi, False, False), gain(e_lo, e_mid, False, False), mid)
    r0 = spin["ranks"][0]
    w, k, n = spin["runtime_share"], spin["kernel_share"], spin["samples"]
    bound = (f"{len(ld['ranks'])} training processes, {len(ld['team'])} busy threads on {nt['p_free']} free CPUs: "
             f"their threads spent {w:.0%} of their CPU in the OpenMP runtime (spinning at its barriers for a peer "
             f"that waits for a CPU) and {k:.0%} in the kernel ({n} CPU-clock samples); a rank's training thread "
             f"worked {r0['loop_work']:.2f} cores and its other intra-op threads {r0['team_work']:.2f} (PID "
             f"{r0['pid']}); with {n_after} intra-op thread{'s' if n_after != 1 else ''} a rank has {cores:.3g} "
             f"core{'s' if cores != 1 else ''} of its own and no peer to wait for, and its team does "
             f"{rate(e_mid):.2f} of one thread's work a second against today's "
             f"{r0['loop_work'] + e_mid * r0['team_work']:.2f} (parallel efficiency e = {e_mid:g}): "
             f"{mid:.2f}x ({lo:.2f}-{hi:.2f}x); an estimate")
    return mid, (lo, hi), bound, {"runtime_share": round(w, 4), "kernel_share": round(k, 4), "samples": n,
                                  "cores_per_rank": round(cores, 3), "threads_per_rank": n_after,
                                  "par_eff": e_mid,
                                  "ranks": [{k2: (round(v, 4) if isinstance(v, float) else v) for k2, v in r.items()}
                                            for r in spin["ranks"]]}


def _fixes(ev: Evidence, ld: dict[str, Any], nt: dict[str, int], p_cpus: float, others: float | None,
           f_data: float | None, sm: Any = None) -> list[Fix]:
    proc = ev.get("process") or {}
    main_proc = proc.get("main") or {}
    cmd = shlex.join(main_proc.get("argv") or _cmdline_prefix(main_proc.get("cmdline")).split())
    n_main, w_busy, team_now = nt["n_main"], nt["w_busy"], len(ld["team"])
    n_ranks = len(ld["ranks"])
    # a rank's intra-op team (the CPU-clock samples: threads in the OpenMP runtime), else its busy threads
    spin = ld.get("spin")
    per_rank = spin["team"] if spin is not None else (-(-team_now // n_ranks) if n_ranks else team_now)
    other_note = f", {nt['others_whole']} taken by other processes" if nt["others_whole"] else ""
    fixes = []
    # A team of no more threads than CPUs makes OpenMP spin at its barriers (libgomp: 300,000 spins,
    # 100 with more threads than CPUs); where others share the CPUs that spin burns the CPU its peers
    # wait for: keep the passive waits the team has today.
    passive = bool(sm is not None and sm.openmp and sm.shared() and n_main <= p_cpus)
    if per_rank > n_main:
        knobs: dict[str, Any] = {"intra_op_threads": n_main}
        env = f"OMP_NUM_THREADS={n_main} MKL_NUM_THREADS={n_main}"
        change = f"torch.set_num_threads({n_main})  # at start-up, before the first op"
        if n_ranks:
            # the variables reach every rank: torchrun's and multiprocessing's children inherit them
            change = (f"torch.set_num_threads({n_main})  # first thing in each training process, before its "
                      "first op (or the variables below, which its processes inherit)")
        if passive:
            knobs["omp_wait_policy"] = "passive"
            env += " OMP_WAIT_POLICY=PASSIVE"
            change += ("; start it with OMP_WAIT_POLICY=PASSIVE: other processes share these CPUs, and a team of "
                       "no more threads than CPUs would spin at each barrier on a CPU its peer waits for")
        who = f"each of the {n_ranks} training processes" if n_ranks else "the training process"
        fixes.append(Fix(f"Cap {who} at {n_main} intra-op thread{'s' if n_main != 1 else ''} "
                         f"({team_now} busy now; {p_cpus:.3g} CPUs{other_note}"
                         + (f", {w_busy} for busy workers" if w_busy else "") + ")",
                         change=change, command=f"{env} {cmd}", knobs=knobs))
    if nt["worker_threads"] > 1:
        fixes.append(Fix(f"One thread per DataLoader worker ({nt['worker_threads']} busy in one worker now)",
                         change="DataLoader(..., worker_init_fn=lambda _: torch.set_num_threads(1))",
                         knobs={"worker_threads": 1}))
    if nt.get("loop_loads"):
        fixes.append(Fix(f"Load the batches in the training loop: no CPU is left beside its compute on "
                         f"{nt['p_free']} free CPUs, so the {len(ld['worker_pids'])} DataLoader workers take "
                         "their CPU from its intra-op team", change="DataLoader(..., num_workers=0)",
                         knobs={"num_workers": 0}))
    elif _fewer_workers(ld, nt, f_data):
        fixes.append(Fix(f"Fewer DataLoader workers: {nt['n_workers_cap']} fit beside the loop on {nt['p_free']} "
                         "free CPUs", change=f"DataLoader(..., num_workers={nt['n_workers_cap']})",
                         knobs={"num_workers": nt["n_workers_cap"]}))
    if others is not None and others >= 0.5:
        fixes.append(Fix(f"Other processes used {others:.1f} of the {p_cpus:.3g} CPUs during the window: keep them "
                         "off the job's CPUs",
                         change="move the other busy processes to other CPUs or hosts, or give the job a cpuset of "
                                f"its own (taskset -a -cp CPUS {int(proc['pid'])}, or a cgroup cpuset) sized to its "
                                f"{max(1, math.ceil(ld['demand'] - 0.05))} runnable threads",
                         knobs={"other_processes_on_job_cpus": False}))
    return fixes


def _workers_beyond_cap(ld: dict[str, Any], nt: dict[str, int]) -> bool:
    """More DataLoader workers than fit beside the loop."""
    return bool(ld["worker_pids"]) and len(ld["worker_pids"]) > nt["n_workers_cap"]


def _fewer_workers(ld: dict[str, Any], nt: dict[str, int], f_data: float | None) -> bool:
    """Fewer DataLoader workers is a fix only where there are more than fit beside the loop and the
    loop does not wait on them: the ledger measured 0.21x when 3 busy workers feeding a loop that
    waited on data were cut to 1."""
    return _workers_beyond_cap(ld, nt) and (f_data is None or f_data < 0.10)


def _loop_loads(sm: Any, ld: dict[str, Any], nt: dict[str, int], f_data: float | None) -> bool:
    """No workers at all, the loop loading its own batches, is the fewer workers to propose where no
    CPU is left beside the loop's compute (a CPU-only job whose intra-op team fills its CPUs: the
    workers' CPU comes out of the team's, at its barriers) and the step model prices it above the
    workers that would fit (karpathy's makemore and minGPT's adder on 2 CPUs, 4 workers beside a team
    of 2: rated 1.03-1.04x for one worker, num_workers=0 measured 1.14x and 1.12x). One training
    process whose team the CPUs hold (no cap beside it), and a loop that does not wait on its workers."""
    if (sm is None or ld["ranks"] or not _fewer_workers(ld, nt, f_data) or len(ld["team"]) > nt["n_main"]
            or not sm.w_now or not sm.no_cpu_for_workers(max(sm.threads_busy, 1))):
        return False
    none = sm.after(Change(workers=0))
    some = sm.after(Change(workers=nt["n_workers_cap"], runq_removed=True))
    return none is not None and (some is None or none.speedup > some.speedup)


@rule("cpu.oversubscribed", requires=("process",), uses=("sched", "pyspy", "contention"),
      description="more runnable threads than CPUs, measured as run-queue delay (eBPF or schedstat)")
def cpu_oversubscribed(ev: Evidence) -> Finding | None:
    return _finding(ev)


def at_knobs(ev: Evidence, knobs: dict[str, Any]) -> Finding | None:
    """The finding as this rule gives it, its DataLoader workers at the count in these knobs
    (num_workers) instead of the count it would propose: the validation ledger's measured fixes were
    applied with the settings printed when they were run (a row that measured one worker where the
    rule now prints none is priced at one)."""
    return _finding(ev, {k: int(v) for k, v in knobs.items() if k == "num_workers"})


def _finding(ev: Evidence, force: dict[str, int] | None = None) -> Finding | None:
    proc = ev.get("process") or {}
    if not proc.get("processes"):
        return None
    rows, source = _thread_rows(ev)
    ld = _loads(rows, int(proc["pid"]), _launcher_ranks(proc, rows)) if rows else None
    if ld is None:
        return None
    ld["spin"] = _rank_team_spin(ev, ld) if ld["ranks"] else None
    p_cpus = float(proc.get("cpus_available") or 1.0)
    f_data = _data_share(ev)
    sched = ev.get("sched") or {}
    job_cores = float(proc.get("total_cpu_cores") or sum(r["cpu"] for r in rows))
    others = None
    con = ev.get("contention") or {}
    if con.get("others_cpu_seconds_on_job_cpus") is not None:
        # Others measured on the job's own CPUs (contention probe): their share is cpu.contended's.
        others = float(con["others_cpu_seconds_on_job_cpus"]) / (float(con["window_s"]) or 1e-6)
    elif sched.get("host_busy_cores") is not None:
        others = max(0.0, float(sched["host_busy_cores"]) - job_cores)
    # Oversubscribed: the job's own runnable threads exceed the CPUs it may use. Other processes
    # that crowd a job which fits its CPUs are context (and shrink the thread numbers proposed),
    # not this finding: no setting of the job would remove them.
    loop_hit = ld["r_loop"] >= TRAIN_RUNQ_SHARE
    worker_hit = ld["r_workers"] >= WORKER_RUNQ_SHARE and (f_data is None or f_data >= 0.10)
    if not ld["demand"] > p_cpus * 1.05 or not (loop_hit or worker_hit):
        return None
    nt = _thread_numbers(proc, rows, ld, p_cpus, others)
    spin = ld.get("spin")
    fewer_workers = _fewer_workers(ld, nt, f_data)
    if (spin is not None and spin["team"] <= nt["n_main"] and not worker_hit and nt["worker_threads"] <= 1
            and not fewer_workers):
        # The ranks' busy threads beyond the cap are not intra-op threads (none ran the OpenMP runtime:
        # a DDP rank's gloo threads, Lightning's ranks already at one thread each): no thread setting of
        # the job removes them.
        ev.note(f"{len(ld['busy'])} busy threads on {p_cpus:.3g} CPUs, but each training process already runs "
                f"at most {spin['team']} intra-op thread{'s' if spin['team'] != 1 else ''} (CPU-clock samples): "
                "the others are not the job's thread settings' to remove")
        return None
    sm = step_model.process_model(ev)
    if force and "num_workers" in force and _workers_beyond_cap(ld, {**nt, "n_workers_cap": force["num_workers"]}):
        nt["n_workers_cap"] = force["num_workers"]
        nt["loop_loads"] = force["num_workers"] == 0 and sm is not None and bool(sm.w_now)
    elif force is None and _loop_loads(sm, ld, nt, f_data):
        nt["n_workers_cap"], nt["loop_loads"] = 0, True
    fixes = _fixes(ev, ld, nt, p_cpus, others, f_data, sm)
    if not fixes:
        # No setting of the job lowers its runnable threads: its intra-op team already fits the CPUs,
        # and the threads beyond them are workers the loop waits on (or not the job's to set). A cap
        # at today's team would change nothing (minGPT's adder on 2 CPUs: "torch.set_num_threads(2)"
        # on a team of 2 was rated 1.14x and measured 1.00x).
        why = (f"; fewer DataLoader workers would starve a loop that waits on them {pct(f_data)} of the time"
               if _workers_beyond_cap(ld, nt) else "")
        ev.note(f"{len(ld['busy'])} busy threads on {p_cpus:.3g} CPUs ({ld['demand']:.2f} runnable on average), but "
                f"the training process already runs no more than {nt['n_main']} intra-op "
                f"thread{'s' if nt['n_main'] != 1 else ''}{why}: no thread or worker setting of the job removes "
                "the rest")
        return None
    facts = _facts(ld, source, p_cpus, others, f_data)
    q = min(1.0, job_cores / p_cpus) if p_cpus else 1.0
    speedup, interval, bound, model = _gain(ev, ld, nt, source, worker_hit, f_data)
    # The probes cannot tell a thread spinning in its wait from one doing useful work: the loop's
    # gain from a cap rests on an inference (switch rates), so it is low confidence.
    conf = "medium" if not model else "low"
    if model:
        facts.append(Fact(src_of(source), "involuntary context switches per second per core the busy threads held "
                                          "(a thread preempted while it spins or computes)",
                          round(sm.switch_rate)))
    if q < 0.6 and others is None:
        facts.append(Fact("process", "share of its CPUs the job held over the window (the rest went to other "
                                     "processes or idled; others not measured)", round(q, 3)))
    who = (f"the training thread waits for a CPU {pct(ld['r_train'])} of the time" if loop_hit else
           f"the DataLoader workers wait for a CPU {pct(ld['r_workers'])} of the time")
    return Finding("cpu.oversubscribed", f"{len(ld['busy'])} busy threads share {p_cpus:.3g} CPUs: {who}", speedup,
                   bound, conf, facts, fixes, risk="low",
                   interval=interval,
                   details={"source": source, "cpus_available": p_cpus, "busy_threads": len(ld["busy"]),
                            "demand": round(ld["demand"], 3), "runq_share_training": round(ld["r_train"], 4),
                            "runq_share_team": round(ld["r_team"], 4), "runq_share_workers": round(ld["r_workers"], 4),
                            "other_cores": None if others is None else round(others, 3),
                            "proposed_intra_op_threads": nt["n_main"],
                            "proposed_num_workers": nt["n_workers_cap"] if ld["worker_pids"] else None,
                            "step_model": model or None})
