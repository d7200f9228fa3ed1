"""The agent's own cost: the budget a run must fit, the plan that fits it, and what it really cost.

Budget (docs/cost.md): the whole agent tree (this process and every process it starts) may use at
most BUDGET_SHARE of the CPU capacity the job may use over the window, and never less than
FLOOR_CPU_S_PER_S (small machines: 1% of 2 CPUs cannot pay for the agent's own start-up and a useful
sample rate), with RSS at most BUDGET_RSS_MB. The session plans probes against it before the window
(each probe declares its cost: probes/base.py `estimate_cost`, `fit_budget`) and measures after.
"""
from __future__ import annotations

import os
import resource
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from trainprobe.probes.parsers import procfs
from trainprobe.probes.base import JobShape, Probe, ProbeCost, WatchSpec

BUDGET_SHARE = 0.01            # of the job's CPU capacity over the window
FLOOR_CPU_S_PER_S = 0.03       # 0.3 CPU-s per 10 s window, whatever the machine
BUDGET_RSS_MB = 150.0
# Measured (benchmarks/bench_cost.py): the CLI's own CPU outside the probes (interpreter start with
# bytecode cached, imports, target checks, evidence, rules, report) and its RSS.
AGENT_FIXED_CPU_S = 0.18
# Evidence and rules for each process of the job beyond the target: the agent's own thread took
# 0.25 CPU-s with 14 workers on the GPU node.
AGENT_PER_PROCESS_CPU_S = 0.005
AGENT_RSS_MB = 30.0
# The first adjustable probe (py-spy: the training thread's stacks) runs at its minimum when the
# budget is spent (short windows, small machines), but not when that minimum is out of all
# proportion: more than this many times the budget and more than half a core over the window. py-spy
# reads every thread on each sample, so 10,000 threads make its least sampling cost hundreds of
# CPU-seconds (and py-spy gives up past 4096 threads). Then it is left out, saying why; `--rate N`
# runs it anyway.
MAX_MINIMUM_OVER_BUDGET = 4.0
MAX_MINIMUM_CORES = 0.5
# A VM's speed moves the whole tree's CPU: the same start-up took 0.065 and 0.17 CPU-s hours apart on
# the 2-CPU VM, and py-spy's cost moved with it. The models below and in each probe are the costs at
# the speed where the CLI's own start-up (interpreter, click, the command's imports, up to the
# diagnose command: `note_startup`) takes AGENT_START_NOMINAL_CPU_S; a CLI whose start-up took longer
# scales every figure of its plan by that ratio (SPEED_MAX at most), so the plan tracks the machine at
# that moment. A faster start-up does not lower them (the figures are the budget's guard). The
# start-up has become cheaper than when the figures were taken (imports off the diagnose path): 0.085
# is its CPU at the figures' speed today (two VM runs of bench_cost.py, 2026-12-04: 1.14 and 1.27
# reference tasks, where 0.10 read the machine as 1.07x and 1.27x slow while the reference task said
# 1.6-1.7x, and py-spy measured 35% over its plan).
AGENT_START_NOMINAL_CPU_S = 0.085
SPEED_MAX = 3.0
# A start-up that compiled this many modules from source (no bytecode cache) is not a measure of speed.
COMPILED_MIN = 3
# The models' spread between runs is about +-15% (contention, the target's stacks): adjustable
# probes are planned against this share of the budget, so the measured tree stays within it.
PLAN_MARGIN = 0.85


def job_shape(pid: int, root: str = "/") -> JobShape:
    try:
        kids = procfs.descendants_of(pid, root)
    except Exception:  # noqa: BLE001 - the target's tree cannot be read: plan for the target alone
        kids = []
    status = procfs.parse_status(procfs.try_read_text(root, f"proc/{pid}/status") or "")
    cap, basis = procfs.cpu_capacity(pid, root)
    threads = int(status.get("Threads", "1") or 1)
    busy = busy_threads(pid, root) if 1 < threads <= BUSY_READ_LIMIT else None
    return JobShape(pid=pid, processes=(pid, *[k for k, _ in kids]), children=dict(kids),
                    threads=threads, busy_threads=busy, cpu_capacity=cap, cpu_capacity_basis=basis,
                    ranks=tuple(k for k, parent in kids if parent == pid and _is_rank(k, root)))


BUSY_READ_LIMIT = 256          # threads of the target read for busy_threads (more: not read)
BUSY_GAP_S = 0.1               # between the two readings of each thread's on-CPU time
BUSY_RECENT = 0.05             # a thread on a CPU this share of the gap is busy
BUSY_LIFETIME = 0.05           # or this share of its life (a periodic holder: 100 ms a second is 10%)


def busy_threads(pid: int, root: str = "/") -> int | None:
    """Threads of `pid` that ran at least BUSY_RECENT of a BUSY_GAP_S gap or BUSY_LIFETIME of their
    life (schedstat's on-CPU ns, stat's start time); None where /proc cannot say."""
    try:
        uptime = float((procfs.try_read_text(root, "proc/uptime") or "0").split()[0])
    except (ValueError, IndexError):
        return None
    a = procfs.task_snapshot(root, pid, BUSY_READ_LIMIT)
    time.sleep(BUSY_GAP_S)
    b = procfs.task_snapshot(root, pid, BUSY_READ_LIMIT)
    recent, _ = procfs.thread_cpu_shares({"start": a, "end": b})
    if not recent:
        return None
    n = 0
    for tid, (share, _rq) in recent.items():
        if share >= BUSY_RECENT:
            n += 1
            continue
        raw = a["tasks"][str(tid)]
        ss = procfs.parse_schedstat(raw.get("schedstat"))
        try:
            life = max(uptime - procfs.parse_stat(raw["stat"])["starttime_ticks"] / procfs.CLK_TCK, 1e-3)
        except (ValueError, IndexError, KeyError):
            continue            # a stat line the kernel did not finish: the thread is not counted
        n += ss is not None and ss["run_s"] / life >= BUSY_LIFETIME
    return n


def _is_rank(pid: int, root: str) -> bool:
    """A child that a launcher (torchrun) started as a rank carries LOCAL_RANK; one the job started
    itself through multiprocessing's spawn (torch.multiprocessing.spawn, mp.Process) is not one of
    torch's named DataLoader workers (probes/support/ranks.py)."""
    try:
        if "LOCAL_RANK" in procfs.parse_environ_whitelist(procfs.read_bytes(root, f"proc/{pid}/environ")):
            return True
    except Exception:  # noqa: BLE001 - gone or unreadable: not known to be a rank
        return False
    from trainprobe.probes.support import ranks
    return ranks.child_is_spawned_trainer(pid, root)


def budget_cpu_s(job: JobShape, window_s: float) -> tuple[float, str]:
    share = BUDGET_SHARE * job.cpu_capacity * window_s
    floor = FLOOR_CPU_S_PER_S * window_s
    if share >= floor:
        return share, f"{BUDGET_SHARE:.0%} of {job.cpu_capacity:g} CPUs ({job.cpu_capacity_basis}) over {window_s:g} s"
    return floor, (f"floor of {FLOOR_CPU_S_PER_S * 10:g} CPU-s per 10 s (1% of {job.cpu_capacity:g} CPUs "
                   f"would be {share:.2f} CPU-s)")


_startup: list[tuple[float, int]] = []     # the CLI's start-up CPU-s, and how many modules it compiled


def _process_start_unix() -> float | None:
    """This process's start, from /proc (starttime in clock ticks after boot; the boot from the
    uptime, to 10 ms: /proc/stat's btime has whole seconds)."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            boot = time.time() - float(f.read().split()[0])
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def compiled_this_run(modules: dict[str, Any] | None = None, since: float | None = None) -> int:
    """How many of the loaded modules this process compiled from source: their bytecode cache is
    missing (PYTHONDONTWRITEBYTECODE, a read-only install) or was written after the process started.
    Compiling is most of a cold start-up's CPU (0.26 CPU-s against 0.10-0.15 warm on the GPU node),
    which says nothing about the machine's speed."""
    since = _process_start_unix() if since is None else since
    n = 0
    for m in list((sys.modules if modules is None else modules).values()):
        spec = getattr(m, "__spec__", None)
        origin, cached = getattr(spec, "origin", None), getattr(spec, "cached", None)
        if not (origin and cached and str(origin).endswith(".py")):
            continue
        try:
            mtime = os.stat(cached).st_mtime
        except OSError:
            n += 1                 # no cache: compiled now and not written
            continue
        if since is not None and mtime >= since - 0.05:
            n += 1
    return n


def note_startup() -> None:
    """Record this process's CPU so far (the CLI's start-up), once: the diagnose command calls it
    first thing. A process that never calls it (tests, the library) plans at the models' speed."""
    if not _startup:
        s = resource.getrusage(resource.RUSAGE_SELF)
        try:
            compiled = compiled_this_run()
        except Exception:  # noqa: BLE001 - the check is an aid to the plan, never a failure
            compiled = 0
        _startup.append((s.ru_utime + s.ru_stime, compiled))


def machine_speed() -> tuple[float, str]:
    """How much slower than the models this machine runs the agent now, from the CLI's start-up."""
    if not _startup:
        return 1.0, "the models as measured (start-up not measured in this process)"
    took, compiled = _startup[0]
    if compiled >= COMPILED_MIN:
        return 1.0, (f"the models as measured: the CLI's start-up ({took:.3f} CPU-s) compiled {compiled} modules' "
                     "bytecode (no cache), which says nothing of this machine's speed")
    f = min(SPEED_MAX, max(1.0, startup_speed() or 1.0))
    return f, (f"the CLI's start-up took {took:.3f} CPU-s against the models' {AGENT_START_NOMINAL_CPU_S:g}: "
               f"every figure x{f:.2f}")


def startup_speed() -> float | None:
    """The CLI's start-up over the models' (unclamped: below 1 on a machine faster than the models), or
    None where it was not measured or compiled bytecode. The plan never scales its figures down (they
    are the budget's guard); the cost benchmarks compare the model at this speed."""
    if not _startup or _startup[0][1] >= COMPILED_MIN:
        return None
    return _startup[0][0] / AGENT_START_NOMINAL_CPU_S


def _speed_of(pr: Probe, speed: float) -> float:
    """The machine's speed factor as it applies to `pr`: its native children's share keeps the models'
    figure (py-spy is not the interpreter whose start-up measured `speed`)."""
    share = min(1.0, max(0.0, float(getattr(pr, "native_share", 0.0) or 0.0)))
    return share + (1.0 - share) * speed


def _scaled(c: ProbeCost, speed: float) -> ProbeCost:
    if speed == 1.0:
        return c
    return ProbeCost(c.cpu_s * speed, c.rss_mb, f"{c.basis}; x{speed:.2f} for this machine's speed")


@dataclass
class Plan:
    budget_cpu_s: float
    budget_basis: str
    budget_rss_mb: float
    job: JobShape
    probes: dict[str, ProbeCost] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    over_budget: str | None = None
    speed: float = 1.0
    speed_basis: str = ""
    startup_speed: float | None = None

    @property
    def agent_cpu_s(self) -> float:
        return self.speed * (AGENT_FIXED_CPU_S + AGENT_PER_PROCESS_CPU_S * max(0, len(self.job.processes) - 1))

    @property
    def planned_cpu_s(self) -> float:
        return self.agent_cpu_s + sum(c.cpu_s for c in self.probes.values())

    @property
    def planned_rss_mb(self) -> float:
        return AGENT_RSS_MB + sum(c.rss_mb for c in self.probes.values())

    def to_dict(self) -> dict[str, Any]:
        return {
            "budget_cpu_seconds": round(self.budget_cpu_s, 3), "budget_basis": self.budget_basis,
            "budget_rss_mb": self.budget_rss_mb, "job_cpu_capacity": self.job.cpu_capacity,
            "job_processes": len(self.job.processes), "job_threads": self.job.threads,
            "planned_cpu_seconds": round(self.planned_cpu_s, 3), "planned_rss_mb": round(self.planned_rss_mb, 1),
            "agent_cpu_seconds": round(self.agent_cpu_s, 3),
            "probes": {k: v.to_dict() for k, v in self.probes.items()}, "skipped": dict(self.skipped),
            "over_budget": self.over_budget, "speed_factor": round(self.speed, 3), "speed_basis": self.speed_basis,
            **({"startup_speed": round(self.startup_speed, 3)} if self.startup_speed is not None else {}),
        }


def _estimate(pr: Probe, spec: WatchSpec, job: JobShape) -> ProbeCost:
    """A probe's cost model, or its class's fixed figure where the model itself fails: a bug in one
    probe's estimate never stops the diagnosis."""
    try:
        return pr.estimate_cost(spec, job)
    except Exception as exc:  # noqa: BLE001 - any failure of a cost model
        return ProbeCost(pr.cost_cpu_s_fixed + pr.cost_cpu_s_per_s * spec.window_s, pr.cost_rss_mb,
                         f"its cost model failed ({type(exc).__name__}: {exc}): the class's fixed figure")


def _fit(pr: Probe, spec: WatchSpec, job: JobShape, cpu_s: float) -> ProbeCost | None:
    """pr.fit_budget, or None (not planned: does not fit) where its planner fails."""
    try:
        return pr.fit_budget(spec, job, cpu_s)
    except Exception:  # noqa: BLE001 - a planner's bug leaves that probe out, not the diagnosis
        return None


def plan(spec: WatchSpec, probes: list[Probe], job: JobShape, enforce: bool = True,
         speed: tuple[float, str] | None = None) -> Plan:
    """Fixed-cost probes first, then the adjustable ones (by priority) share what is left.

    With `enforce` False (an explicit --rate, or --probes) the probes keep their settings and the
    plan only states what they are expected to cost. Every figure is scaled by `speed` (default
    `machine_speed()`), a probe's native children's share excepted (`_speed_of`): an adjustable probe
    is fitted to its share divided by that.
    """
    total, basis = budget_cpu_s(job, spec.window_s)
    sp, sp_basis = speed if speed is not None else machine_speed()
    p = Plan(total, basis, BUDGET_RSS_MB, job, speed=sp, speed_basis=sp_basis,
             startup_speed=startup_speed() if speed is None else None)
    if enforce:
        for pr in probes:
            why = pr.adds_nothing(spec, job)
            if why:
                p.skipped[pr.name] = why
        probes = [pr for pr in probes if pr.name not in p.skipped]
    fixed = [pr for pr in probes if not pr.adjustable]
    for pr in fixed:
        p.probes[pr.name] = _scaled(_estimate(pr, spec, job), _speed_of(pr, sp))
    left = PLAN_MARGIN * total - p.planned_cpu_s
    adjustable = sorted((pr for pr in probes if pr.adjustable), key=lambda pr: pr.budget_priority)
    for i, pr in enumerate(adjustable):
        f = _speed_of(pr, sp)
        if not enforce:
            p.probes[pr.name] = _scaled(_estimate(pr, spec, job), f)
            continue
        # Each adjustable probe may take what is left, less a minimum kept for those after it.
        reserve = sum(getattr(q, "min_cost_cpu_s", 0.0) for q in adjustable[i + 1:])
        cost = _fit(pr, spec, job, max(0.0, left - reserve * sp) / f)
        if cost is None and i == 0 and hasattr(pr, "min_cost"):
            # The first adjustable probe (the training thread's stacks) is the diagnosis: it runs at
            # its minimum even when the budget is spent (short windows), and the plan says so,
            # unless that minimum is out of all proportion to the budget (a process of many threads).
            least = pr.min_cost(spec.window_s, job.threads, job.direct_children, job.busy_threads, job.ranks) * f
            if least > MAX_MINIMUM_OVER_BUDGET * total and least > MAX_MINIMUM_CORES * spec.window_s:
                p.skipped[pr.name] = (f"its least sampling of a process of {job.threads} threads would cost "
                                      f"{least:.2f} CPU-s ({least / spec.window_s:.1f} cores), over {MAX_MINIMUM_OVER_BUDGET:g}x the agent's CPU budget "
                                      f"({total:.2f} CPU-s: {basis}); `--rate N` runs it anyway")
                continue
            cost = _fit(pr, spec, job, least / f)
            if cost is not None:
                p.over_budget = f"{pr.name} kept at its minimum although the budget was spent"
        if cost is None:
            p.skipped[pr.name] = (f"does not fit the agent's CPU budget ({total:.2f} CPU-s: {basis}); "
                                  f"{max(0.0, left):.2f} CPU-s were left for it")
            continue
        cost = _scaled(cost, f)
        if cost.cpu_s > max(0.0, left) + 1e-6 and not p.over_budget:
            p.over_budget = f"{pr.name} kept at its minimum although the budget was spent"
        p.probes[pr.name] = cost
        left -= cost.cpu_s
    return p


# -- what the run really cost ---------------------------------------------------------------------

def tree_usage() -> dict[str, float]:
    """This process since it started plus every child it has reaped (and theirs), from rusage."""
    s = resource.getrusage(resource.RUSAGE_SELF)
    c = resource.getrusage(resource.RUSAGE_CHILDREN)
    # ru_maxrss keeps the peak of the process this one was forked from before its exec (a large
    # parent makes it meaningless); VmHWM is this process's own peak.
    return {"self_cpu_seconds": s.ru_utime + s.ru_stime, "children_cpu_seconds": c.ru_utime + c.ru_stime,
            "self_max_rss_mb": _status_mb("VmHWM") or s.ru_maxrss / 1024.0, "children_max_rss_mb": c.ru_maxrss / 1024.0}


def _status_mb(key: str) -> float:
    st = procfs.parse_status(procfs.try_read_text("/", f"proc/{os.getpid()}/status") or "")
    try:
        return int(st.get(key, "0 kB").split()[0]) / 1024.0
    except (ValueError, IndexError):
        return 0.0


def process_start_cpu_note() -> str:
    return ("the whole agent tree from its start (interpreter, imports, every probe and every process a probe "
            "started, rules and report), from rusage of the agent and of each child when it was reaped")


def current_rss_mb() -> float:
    return _status_mb("VmRSS")
