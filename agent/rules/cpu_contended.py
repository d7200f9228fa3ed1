"""cpu.contended: processes outside the job take its CPUs; its threads wait in the run queue.

Facts, over the window:
    r     share of the window the training thread (or its busy intra-op team, whichever is larger)
          was runnable but not running: schedstat run_delay (contention probe), or eBPF's
          run-queue delay when the sched probe ran (agent/combiners/cpu_wait.py);
    r_w   the same for the DataLoader workers' main threads;
    O     CPU-seconds that ran on the job's CPUs and were neither the job's nor the agent's
          (/proc/stat per CPU), named process by process (contention probe);
    P     the CPUs the job may use (its affinity, capped by its cgroup quota);
    D     the job's own runnable threads: the sum of its threads' on-CPU and run-queue shares.
It is contended when others took at least 10% of the job's CPUs and the loop (or the workers it
waits on) waited for a CPU at least 5% of the window. D tells it apart from cpu.oversubscribed:
when the job's own runnable threads exceed P, part of the wait is its own and stays after the
others leave (r_self = 1 - P/D); that part is cpu.oversubscribed's.

The expected speedup, in shares of today's step time T: without the others the loop's run-queue
wait falls from r to r_self, so a loop that is runnable whenever it is not waiting on data takes
T' = (1 - r) / (1 - r_self). When the loop waits on data (py-spy's share f >= 0.10), the step is
the longer of the loop's own part (1 - f - (r - r_self)) and the workers' production, which speeds
up like their own wait: (1 - r_w) / (1 - r_self). Capped by what else limits the step: the GPU's
busy share b (T' >= b) and the job's CPU work, which must fit its P CPUs (T' >= U / P, U the
cores it used). gain = 1 / T'. This assumes the CPU handed back runs the job as fast as before the
others came (no cache or SMT-sibling loss), so the interval around it is asymmetric downwards.
"""
from __future__ import annotations

import math
import shlex
from typing import Any

from trainprobe.agent.combiners import step_model
from trainprobe.agent.combiners.cpu_wait import HOW, thread_waits
from trainprobe.agent.combiners.step_model import Change
from trainprobe.agent.evidence import Evidence
from trainprobe.agent.findings import Fact, Finding, Fix, pct
from trainprobe.agent.rules import rule
from trainprobe.probes.parsers.procfs import format_cpulist, parse_cpulist

OTHERS_SHARE = 0.10        # others took at least this share of the job's CPUs
RUNQ_SHARE = 0.05          # the loop or the workers waited for a CPU at least this share
DATA_SHARE = 0.10          # the loop waits on data at least this share: the workers' wait counts
BUSY = 0.10                # a thread on a CPU or waiting for one at least this share is busy
FREE_SHARE = 0.10          # a CPU where others ran less than this share of the window is free
MIN_GAIN = 1.05
NAMED = 5                  # competitors named in the evidence and fixes
DETAILED = 10              # competitors in the finding's details
# The band around the gain above 1.0. benchmarks/bench_contended.py on the loaded 2-CPU VM (other
# work took 50-75% of the CPU throughout, so "every other process gone" cannot be staged there):
# the job's steps per CPU-second were 0.95-1.0 of those with the competitors stopped, and the
# whole-CPU rate over the diagnosed window's measured 0.95-1.33x the printed gain (pred/meas
# 0.75-1.05); with only the benchmark's competitors stopped the gain came out 0.9-1.15x the high
# end of speedup_if_named_leave. Not yet calibrated on a quiet host.
LOW_K, HIGH_K = 0.7, 1.4


def _short(cmd: str, n: int = 60) -> str:
    one = " ".join(cmd.split())
    return one if len(one) <= n else one[: n - 3] + "..."


def _who(c: dict[str, Any]) -> str:
    user = c.get("user") or (f"uid {c['uid']}" if c.get("uid") is not None else "user ?")
    return f"PID {c['pid']} {_short(c.get('cmdline') or c['comm'], 40)} ({user})"


def _loop(rows: list[dict[str, Any]], ev: Evidence, pid: int) -> dict[str, Any] | None:
    """Run-queue shares of the loop (the target's main thread and busy team, or the ranks' main
    threads under a launcher) and of the workers."""
    ranks = {p["pid"] for p in (ev.get("process") or {}).get("processes", []) if p.get("role") == "rank"}
    if ranks:
        loop = [r for r in rows if r["pid"] in ranks and r["main"]]
        workers = [r for r in rows if r["main"] and r["pid"] not in ranks and not r["target"]]
    else:
        loop = [r for r in rows if r["tid"] == pid]
        workers = [r for r in rows if r["main"] and not r["target"]]
    if not loop:
        return None
    team = [r for r in rows if (r["pid"] in ranks if ranks else r["target"]) and r["cpu"] + r["r"] >= BUSY]
    busy_w = [r for r in workers if r["cpu"] + r["r"] >= BUSY]
    r_train = max(r["r"] for r in loop)
    r_team = sum(r["r"] for r in team) / len(team) if team else 0.0
    return {"train": loop[0], "r_train": r_train, "r_team": r_team, "r_loop": max(r_train, r_team),
            "team": team, "workers": busy_w,
            "r_workers": sum(r["r"] for r in busy_w) / len(busy_w) if busy_w else 0.0}


def _data_share(ev: Evidence) -> float | None:
    bd = ((ev.get("pyspy") or {}).get("training_thread") or {}).get("breakdown") or {}
    return (bd.get("data_wait", 0.0) + bd.get("data_load", 0.0)) if bd else None


def _gain(ld: dict[str, Any], r_self: float, f: float | None, busy: float | None,
          u_cores: float, budget: float) -> tuple[float, str, str]:
    """(gain, bound text, what limits it)."""
    r, r_w = min(ld["r_loop"], 0.95), min(ld["r_workers"], 0.95)
    if f is not None and f >= DATA_SHARE and r_w >= RUNQ_SHARE:
        loop_part = max(0.05, 1.0 - f - max(0.0, r - r_self))
        data_part = (1.0 - r_w) / (1.0 - r_self)
        t_new = max(loop_part, data_part)
        how = (f"the loop waits on data f={f:.2f}; T' = max(loop 1-f-(r-r_self)={loop_part:.2f}, "
               f"workers (1-r_w)/(1-r_self)={data_part:.2f}) with r={r:.2f}, r_w={r_w:.2f}, r_self={r_self:.2f}")
    else:
        t_new = (1.0 - r) / (1.0 - r_self)
        how = f"T' = (1-r)/(1-r_self) = (1-{r:.2f})/(1-{r_self:.2f}) = {t_new:.2f}"
    limit = "the run-queue wait"
    caps = []
    if busy is not None and busy > 0:
        caps.append((busy, f"the GPU's busy share {busy:.2f}"))
    if budget > 0 and u_cores > 0:
        caps.append((u_cores / budget, f"the job's CPU work U/P = {u_cores:.2f}/{budget:.3g}"))
    for floor, what in caps:
        if floor > t_new:
            t_new, limit = floor, what
    t_new = max(t_new, 0.05)
    gain = 1.0 / t_new
    capped = "" if limit == "the run-queue wait" else f", capped by {limit}"
    return gain, f"{how}{capped}: gain 1/T' = {gain:.2f}x", limit


def gain_if_leave(cpu: float, r: float, others_share: float, leaving_share: float) -> tuple[float, float]:
    """(low, high) speedup of a loop thread that ran `cpu` and waited `r` of the window, when
    competitors that took `leaving_share` of its CPU (of `others_share` taken by all others) leave.
    Low: the others left behind are CPU-bound and take their part of what is freed (the loop's
    share becomes cpu / (cpu + others - leaving)); high: they keep their CPU time and the loop gets
    all of it (cpu + leaving), at most the 1/(1-r) of every other process leaving."""
    cpu = max(cpu, 1e-3)
    all_gone = 1.0 / (1.0 - min(r, 0.95))
    rest = max(0.0, others_share - leaving_share)
    low = min(all_gone, (cpu + others_share) / (cpu + rest) if cpu + rest > 0 else all_gone)
    high = min(all_gone, (cpu + leaving_share) / cpu)
    return round(max(1.0, low), 2), round(max(1.0, low, high), 2)


def _free_cpus(con: dict[str, Any], win: float) -> list[int]:
    """CPUs where others ran under FREE_SHARE of the window, least busy first, within the cpuset the
    job may use (its cgroup's, else every online CPU)."""
    allowed = parse_cpulist(con.get("cpuset_cpus")) or parse_cpulist(con.get("cpus_online"))
    per = con.get("per_cpu") or {}
    free = [(per[c]["others_s"], c) for c in allowed if c in per and per[c]["others_s"] / win < FREE_SHARE]
    return [c for _o, c in sorted(free)]


def _scheduler_fix(cgroup: str | None, need: int) -> Fix:
    k8s = "kubepods" in (cgroup or "")
    slurm = "slurm" in (cgroup or "")
    title = ("Ask the scheduler for CPUs of the job's own"
             + (" (this job runs under Kubernetes)" if k8s else " (this job runs under Slurm)" if slurm else ""))
    slurm_text = f"Slurm: sbatch/srun --exclusive --cpus-per-task={need} (or a partition with OverSubscribe=NO)"
    k8s_text = (f"Kubernetes: kubelet --cpu-manager-policy=static, and a Guaranteed QoS pod (requests == limits) "
                f"with an integer CPU request (cpu: \"{need}\") so it gets exclusive cores")
    change = "; ".join([k8s_text, slurm_text] if k8s else [slurm_text, k8s_text])
    return Fix(title, change=change, knobs={"exclusive_cpus": need})


def _cap_command(c: dict[str, Any], quota_pct: int) -> str | None:
    cg = (c.get("cgroup") or "").strip("/")
    if not cg:
        return None
    unit = cg.rsplit("/", 1)[-1]
    if unit.endswith((".service", ".scope", ".slice")):
        return f"systemctl set-property {shlex.quote(unit)} CPUQuota={quota_pct}%"
    return f"echo '{quota_pct * 1000} 100000' > {shlex.quote('/sys/fs/cgroup/' + cg + '/cpu.max')}"


def _fixes(con: dict[str, Any], ev: Evidence, named: list[dict[str, Any]], demand: float, win: float) -> list[Fix]:
    pid = int(con["pid"])
    job_cpus = set(parse_cpulist(con["job_cpus"]))
    online = parse_cpulist(con.get("cpus_online"))
    per = con.get("per_cpu") or {}
    fixes: list[Fix] = []
    movable = [c for c in named if not c["kernel_thread"]]
    kernel = [c for c in named if c["kernel_thread"]]
    need = max(1, math.ceil(demand - 0.05))
    if movable:
        pids = " ".join(str(c["pid"]) for c in movable)
        fixes.append(Fix(f"Lower the priority of {', '.join(_who(c) for c in movable[:3])}: the job then gets "
                         "its CPUs back whenever it is runnable",
                         change="nice 19 weighs 15 against a nice-0 thread's 1024 under CFS: the competitor keeps "
                                "only the CPU time the job leaves idle",
                         command=f"renice -n 19 -p {pids}", knobs={"renice_pids": [c["pid"] for c in movable]}))
        elsewhere = sorted((c for c in online if c not in job_cpus), key=lambda c: per.get(c, {}).get("others_s", 0.0))
        if elsewhere:
            where = format_cpulist(elsewhere)
            fixes.append(Fix(f"Move them off the job's CPUs ({con['job_cpus']}) to CPUs {where}",
                             change="restrict the competitors' affinity to CPUs the job does not use",
                             command="; ".join(f"taskset -a -cp {where} {c['pid']}" for c in movable),
                             knobs={"move_pids": [c["pid"] for c in movable], "to_cpus": where}))
        caps = [cmd for cmd in (_cap_command(c, 25) for c in movable) if cmd]
        fixes.append(Fix("Cap their CPU time with a quota",
                         change=("a cgroup CPU quota on each competitor's unit or cgroup (25% of one CPU here); "
                                 "for a process in the root cgroup, start it again under systemd-run --scope -p "
                                 "CPUQuota=25%"),
                         command="; ".join(caps) if caps else None, knobs={"quota_pct": 25}))
    if kernel:
        fixes.append(Fix(f"Kernel threads run on the job's CPUs ({', '.join(c['comm'] for c in kernel[:3])}): steer "
                         "interrupts away from them",
                         change="set /proc/irq/N/smp_affinity_list of the busy IRQs (see /proc/interrupts) to other "
                                "CPUs, or tell irqbalance to keep off them (IRQBALANCE_BANNED_CPULIST)"))
    free = [c for c in _free_cpus(con, win)]
    job_pids = con.get("job_pids") or [pid]
    argv = ((ev.get("process") or {}).get("main") or {}).get("argv")
    cmd = shlex.join(argv) if argv else "python train.py"
    if len(free) >= need:
        cpus = format_cpulist(free[:need])
        fixes.append(Fix(f"Pin the job to CPU{'s' if need > 1 else ''} {cpus}, free of other work over the window",
                         change=f"run the job on CPUs others did not use (measured: others ran <{pct(FREE_SHARE)} of "
                                f"the window there); at start-up: taskset -c {cpus} {cmd}, or a cgroup cpuset "
                                f"(systemd-run --scope -p AllowedCPUs={cpus} {cmd})",
                         command="; ".join(f"taskset -a -cp {cpus} {p}" for p in job_pids),
                         knobs={"pin_job_to_cpus": cpus}))
    else:
        enough = f"{need} CPUs were" if need > 1 else "CPU was"
        fixes.append(Fix(f"No {enough} free of other work over the window ({len(free)} free): pinning the job "
                         "elsewhere cannot help; lower, move or cap the others, or ask for exclusive CPUs"))
    fixes.append(_scheduler_fix(con.get("cgroup"), need))
    return fixes


@rule("cpu.contended", requires=("contention",), uses=("sched", "process", "pyspy", "pressure", "gpu"),
      description="processes outside the job take its CPUs: its threads wait in the run queue")
def cpu_contended(ev: Evidence) -> Finding | None:
    con = ev.get("contention") or {}
    got = thread_waits(ev)
    if not con or got is None:
        return None
    rows, source = got
    pid = int(con["pid"])
    ld = _loop(rows, ev, pid)
    if ld is None:
        return None
    win = float(con["window_s"]) or 1e-6
    n_cpus = max(1, int(con["job_cpu_count"]))
    budget = float(con["job_cpu_budget"]) or float(n_cpus)
    others = con.get("others_cpu_seconds_on_job_cpus")
    others_how = "/proc/stat on the job's CPUs, less the job's and the agent's time"
    if others is None:
        others, others_how = con["competitors_cpu_seconds_on_job_cpus"], "the outside processes' CPU time placed there"
    o_cores = float(others) / win
    o_share = o_cores / n_cpus
    f = _data_share(ev)
    loop_hit = ld["r_loop"] >= RUNQ_SHARE
    worker_hit = ld["r_workers"] >= RUNQ_SHARE and f is not None and f >= DATA_SHARE
    if o_share < OTHERS_SHARE or not (loop_hit or worker_hit):
        return None
    demand = float(con["job_runnable_mean"])
    # Counters read a few ms apart can put a job that fits its CPUs a hair above them.
    r_self = max(0.0, 1.0 - budget / demand) if demand > budget * 1.05 else 0.0
    busy = (ev.get("gpu") or {}).get("busy_fraction")
    u_cores = float(con["job_cpu_seconds"]) / win
    gain, bound, limit = _gain(ld, r_self, f, busy, u_cores, budget)
    sm = step_model.from_evidence(ev)
    sm_details = None
    if sm is not None:
        # The step after the others leave with every other constraint in place (step model): the
        # workers' pace, the GPU's busy time, the job's CPU work over all its CPUs.
        step = sm.after(Change(others_removed=(ld["r_loop"], r_self)))
        gain = max(step.speedup, 1.0)
        sm_details = {**sm.details(step), "change": {"others_removed": [round(ld["r_loop"], 4), round(r_self, 4)]}}
        limit = step_model.BINDING_WORDS.get(step.binding, step.binding)
        bound = f"{bound}; on the step model: the step is then set by {limit} ({step.mid:.2f} of today's): {gain:.2f}x"
    if gain < MIN_GAIN:
        return None
    comps = [c for c in con.get("competitors", []) if c["cpu_seconds_on_job_cpus"] > 0]
    named = comps[:NAMED]
    named_s = sum(c["cpu_seconds_on_job_cpus"] for c in comps)
    how = HOW[source]
    facts = [
        Fact("contention", f"CPUs the job may use ({con['job_cpu_budget_basis']})", con["job_cpus"]),
        Fact(source, f"share of the window the training thread waited for a CPU ({how})", round(ld["r_train"], 3)),
        Fact(source, "share of the window the training thread ran on a CPU", round(ld["train"]["cpu"], 3)),
    ]
    if len(ld["team"]) > 1:
        facts.append(Fact(source, f"mean run-queue share of the {len(ld['team'])} busy threads of the training process",
                          round(ld["r_team"], 3)))
    if ld["workers"]:
        facts.append(Fact(source, f"mean run-queue share of the {len(ld['workers'])} busy DataLoader workers",
                          round(ld["r_workers"], 3)))
    facts += [
        Fact("contention", f"CPU-seconds others ran on the job's CPUs over {win:.1f} s ({others_how})", round(others, 2)),
        Fact("contention", "share of the job's CPUs others took", round(o_share, 3)),
        Fact("contention", f"the job's own runnable threads (mean) against its {budget:.3g} CPUs "
                           "(above them it would be cpu.oversubscribed too)", round(demand, 2)),
    ]
    for c in named:
        facts.append(Fact("contention", f"{_who(c)}: CPU-s on the job's CPUs ({c['attribution']}), share of them",
                          f"{c['cpu_seconds_on_job_cpus']:.2f} s, {pct(c['share_of_job_cpus'])}"))
    if con.get("irq_seconds_on_job_cpus", 0.0) / win / n_cpus >= 0.05:
        facts.append(Fact("contention", "share of the job's CPUs spent in interrupts",
                          round(con["irq_seconds_on_job_cpus"] / win / n_cpus, 3)))
    if con.get("steal_seconds_on_job_cpus", 0.0) / win / n_cpus >= 0.05:
        facts.append(Fact("contention", "share of the job's CPUs the hypervisor gave to other machines (steal)",
                          round(con["steal_seconds_on_job_cpus"] / win / n_cpus, 3)))
    psi = ((ev.get("pressure") or {}).get("host") or {}).get("cpu", {}).get("some")
    if psi:
        facts.append(Fact("pressure", "host CPU pressure: share of the window some task waited for a CPU "
                                      f"(PSI some, avg10 {psi['avg10']:.0f}%)", psi.get("stall_fraction")))
    if con.get("scan_capped"):
        facts.append(Fact("contention", f"processes read (capped at {con['max_processes']}: others not named)",
                          con["processes_scanned"]))
    # Confidence: the wait is measured, the others' time is exact; what is estimated is who ran
    # where (an affinity straddling the job's CPUs) and whether the wait is all the others'.
    explained = named_s / others if others else 0.0
    conf = "high" if source in ("sched", "contention") and r_self == 0.0 and explained >= 0.5 else "medium"
    if others and sum(c["cpu_seconds_on_job_cpus"] for c in comps if c["attribution"] == "overlap") > 0.5 * others:
        conf = "low"
    lo, hi = 1.0 + (gain - 1.0) * LOW_K, 1.0 + (gain - 1.0) * HIGH_K
    if conf != "high":
        lo, hi = 1.0 + (gain - 1.0) * LOW_K * 0.7, 1.0 + (gain - 1.0) * HIGH_K * 1.2
    top = ", ".join(_who(c) for c in named[:2]) or "unnamed work (interrupts, exited processes)"
    who = (f"the training thread waits for a CPU {pct(ld['r_loop'])} of the time" if loop_hit else
           f"the DataLoader workers wait for a CPU {pct(ld['r_workers'])} of the time")
    title = (f"Other processes take {pct(o_share)} of the job's CPU{'s' if n_cpus > 1 else ''} {con['job_cpus']}: "
             f"{who} (top: {top})")
    return Finding(
        "cpu.contended", title, gain, bound, conf, facts, _fixes(con, ev, named, demand, win), risk="medium",
        interval=(lo, hi),
        details={"source": source, "job_cpus": con["job_cpus"], "job_cpu_budget": budget, "step_model": sm_details,
                 "runq_share_training": round(ld["r_train"], 4), "runq_share_team": round(ld["r_team"], 4),
                 "runq_share_workers": round(ld["r_workers"], 4), "own_runnable_threads": round(demand, 3),
                 "runq_share_own": round(r_self, 4), "others_cpu_seconds_on_job_cpus": round(float(others), 3),
                 "others_cores_on_job_cpus": round(o_cores, 3), "others_share_of_job_cpus": round(o_share, 4),
                 "limited_by": limit, "data_share": f,
                 "competitors": [{k: c.get(k) for k in ("pid", "comm", "cmdline", "user", "uid", "kernel_thread",
                                                      "cpu_seconds_on_job_cpus", "share_of_job_cpus", "attribution",
                                                      "sibling_of_target")} for c in comps[:DETAILED]],
                 "free_cpus": format_cpulist(_free_cpus(con, win)),
                 # What the named competitors alone are worth (the fixes that move or cap them).
                 "speedup_if_named_leave": list(gain_if_leave(
                     ld["train"]["cpu"], ld["r_loop"], o_share,
                     sum(c["cpu_seconds_on_job_cpus"] for c in named) / win / n_cpus))})
