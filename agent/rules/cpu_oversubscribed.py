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

The expected speedup: with no more runnable threads than CPUs the run-queue wait goes away, so the
loop gains 1 / (1 - r) where r is the larger of the training thread's and its intra-op team's mean
run-queue share (a parallel region ends when its last thread does); when the loop waits on data
(py-spy) and the workers are the delayed ones, 1 / (1 - min(r_workers, f)). This leaves out the
CPU that spinning OpenMP threads burn while their peers wait, which an oversubscribed team also
loses, so the real gain can be larger.

The thread numbers in the fix: the CPUs the job may use, minus what other processes used over the
window (scheduler probe: host busy cores minus the job's), minus one core per busy DataLoader
worker, is what the training process's intra-op threads should be capped at (at least 1).
"""
from __future__ import annotations

import math
import shlex
from typing import Any

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


def _cmdline_prefix(cmdline: str | None) -> str:
    return (cmdline or "python train.py").strip()


def _loads(rows: list[dict[str, Any]], pid: int) -> dict[str, Any] | None:
    """Run-queue shares of the training thread, its busy team and the workers, and the job's demand."""
    main_rows = [r for r in rows if r["pid"] == pid]
    train = next((r for r in main_rows if r["tid"] == pid), None)
    if train is None:
        return None
    team = [r for r in main_rows if r["cpu"] + r["r"] >= BUSY]
    workers = [r for r in rows if r["role"] == "dataloader_worker"]
    worker_main = [r for r in workers if r["tid"] == r["pid"]]
    r_team = sum(r["r"] for r in team) / len(team) if team else 0.0
    return {"train": train, "team": team, "worker_main": worker_main,
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
    busy_workers = [pr for pr in proc["processes"] if pr.get("role") == "dataloader_worker"
                    and pr.get("alive_at_end") and (pr.get("cpu_cores") or 0.0) >= BUSY]
    others_whole = int(math.floor(others + 0.25)) if others else 0
    p_free = max(1, int(math.floor(p_cpus + 1e-6)) - others_whole)
    # Intra-op threads inside a worker: threads that themselves burn CPU (a queue feeder thread
    # that only waits for a CPU is not one).
    worker_threads = max((len([r for r in rows if r["pid"] == wp and r["cpu"] >= 2 * BUSY])
                          for wp in ld["worker_pids"]), default=0)
    return {"w_busy": len(busy_workers), "others_whole": others_whole, "p_free": p_free,
            "n_main": max(1, p_free - len(busy_workers)), "worker_threads": worker_threads,
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


def _gain(ld: dict[str, Any], source: str, worker_hit: bool, f_data: float | None,
          q: float) -> tuple[float, tuple[float, float], str]:
    """(speedup, interval, bound): the run-queue wait of the loop, or of the workers the loop waits on."""
    r_loop, r_workers = ld["r_loop"], ld["r_workers"]
    how = "eBPF run-queue delay" if source == "sched" else "schedstat run_delay (no eBPF: totals only)"
    loop_gain = 1.0 / (1.0 - min(r_loop, 0.95))
    worker_gain = 1.0
    if worker_hit and f_data is not None:
        worker_gain = 1.0 / (1.0 - min(r_workers, f_data, 0.95))
    speedup = max(loop_gain, worker_gain)
    # Low end: only the job's own share of the run-queue waits goes (others' processes stay): the
    # share q of the CPUs the job held over the window. Without the scheduler probe others' load is
    # not measured, which the ledger shows can be most of the wait on a shared host.
    r_hit = r_loop if loop_gain >= worker_gain else min(r_workers, f_data or 0.0)
    interval = (1.0 / (1.0 - min(r_hit * q, 0.95)), 1.0 + (speedup - 1.0) * (1.5 if source == "sched" else 2.0))
    if worker_gain > loop_gain:
        bound = (f"workers wait for a CPU {r_workers:.2f} of the window and the loop waits on data f={f_data:.2f}: "
                 f"1/(1-min(r_w,f))={worker_gain:.2f}x")
    else:
        bound = (f"the training thread / its team wait for a CPU r={r_loop:.2f} of the window ({how}); with no more "
                 f"runnable threads than CPUs that wait goes: 1/(1-r)={loop_gain:.2f}x (leaves out CPU burnt by "
                 "spinning OpenMP threads, so the real gain can be larger)")
    return speedup, interval, bound


def _fixes(ev: Evidence, ld: dict[str, Any], nt: dict[str, int], p_cpus: float, others: float | None,
           f_data: float | None) -> list[Fix]:
    proc = ev.get("process") or {}
    main_proc = proc.get("main") or {}
    cmd = shlex.join(main_proc.get("argv") or _cmdline_prefix(main_proc.get("cmdline")).split())
    n_main, w_busy, team_now = nt["n_main"], nt["w_busy"], len(ld["team"])
    other_note = f", {nt['others_whole']} taken by other processes" if nt["others_whole"] else ""
    fixes = []
    if team_now > n_main:
        fixes.append(Fix(f"Cap the training process at {n_main} intra-op thread{'s' if n_main != 1 else ''} "
                         f"({team_now} busy now; {p_cpus:g} CPUs{other_note}"
                         + (f", {w_busy} for busy workers" if w_busy else "") + ")",
                         change=f"torch.set_num_threads({n_main})  # at start-up, before the first op",
                         command=f"OMP_NUM_THREADS={n_main} MKL_NUM_THREADS={n_main} {cmd}",
                         knobs={"intra_op_threads": n_main}))
    if nt["worker_threads"] > 1:
        fixes.append(Fix(f"One thread per DataLoader worker ({nt['worker_threads']} busy in one worker now)",
                         change="DataLoader(..., worker_init_fn=lambda _: torch.set_num_threads(1))",
                         knobs={"worker_threads": 1}))
    # Fewer workers only when the loop does not wait on them: the ledger measured 0.21x when 3 busy
    # workers feeding a loop that waited on data were cut to 1.
    if ld["worker_pids"] and len(ld["worker_pids"]) > nt["n_workers_cap"] and (f_data is None or f_data < 0.10):
        fixes.append(Fix(f"Fewer DataLoader workers: {nt['n_workers_cap']} fit beside the loop on {nt['p_free']} "
                         "free CPUs", change=f"DataLoader(..., num_workers={nt['n_workers_cap']})",
                         knobs={"num_workers": nt["n_workers_cap"]}))
    if others is not None and others >= 0.5:
        fixes.append(Fix(f"Other processes used {others:.1f} of the {p_cpus:g} CPUs during the window: keep them "
                         "off the job's CPUs",
                         change="move the other busy processes to other CPUs or hosts, or give the job a cpuset of "
                                f"its own (taskset -a -cp CPUS {int(proc['pid'])}, or a cgroup cpuset) sized to its "
                                f"{max(1, math.ceil(ld['demand'] - 0.05))} runnable threads",
                         knobs={"other_processes_on_job_cpus": False}))
    if not fixes:
        fixes.append(Fix(f"Keep runnable threads within the {p_cpus:g} CPUs",
                         change=f"torch.set_num_threads({n_main})",
                         command=f"OMP_NUM_THREADS={n_main} {cmd}", knobs={"intra_op_threads": n_main}))
    return fixes


@rule("cpu.oversubscribed", requires=("process",), uses=("sched", "pyspy", "contention"),
      description="more runnable threads than CPUs, measured as run-queue delay (eBPF or schedstat)")
def cpu_oversubscribed(ev: Evidence) -> Finding | None:
    proc = ev.get("process") or {}
    if not proc.get("processes"):
        return None
    rows, source = _thread_rows(ev)
    ld = _loads(rows, int(proc["pid"])) if rows else None
    if ld is None:
        return None
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
    facts = _facts(ld, source, p_cpus, others, f_data)
    q = min(1.0, job_cores / p_cpus) if p_cpus else 1.0
    speedup, interval, bound = _gain(ld, source, worker_hit, f_data, q)
    conf = "high" if (source == "sched" and ld["r_loop"] >= 0.10) else "medium"
    if source != "sched" and q < 0.6 and others is None:
        conf = "low"      # the job held under 60% of its CPUs: others' load, unmeasured, may cause the wait
        facts.append(Fact("process", "share of its CPUs the job held over the window (the rest went to other "
                                     "processes, not measured without --deep)", round(q, 3)))
    who = (f"the training thread waits for a CPU {pct(ld['r_train'])} of the time" if loop_hit else
           f"the DataLoader workers wait for a CPU {pct(ld['r_workers'])} of the time")
    return Finding("cpu.oversubscribed", f"{len(ld['busy'])} busy threads share {p_cpus:g} CPUs: {who}", speedup,
                   bound, conf, facts, _fixes(ev, ld, nt, p_cpus, others, f_data), risk="low", interval=interval,
                   details={"source": source, "cpus_available": p_cpus, "busy_threads": len(ld["busy"]),
                            "demand": round(ld["demand"], 3), "runq_share_training": round(ld["r_train"], 4),
                            "runq_share_team": round(ld["r_team"], 4), "runq_share_workers": round(ld["r_workers"], 4),
                            "other_cores": None if others is None else round(others, 3),
                            "proposed_intra_op_threads": nt["n_main"],
                            "proposed_num_workers": nt["n_workers_cap"] if ld["worker_pids"] else None})
