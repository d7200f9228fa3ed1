"""The agent's CPU scheduling class, chosen from the node's free CPUs (`diagnose --priority auto`).

In SCHED_IDLE the agent and its probe children run only on a CPU no other thread wants, so they never
preempt the job (docs/cost.md: on the H100 job without workers, 5 involuntary switches of the loop a
step at normal priority, 0.7 in SCHED_IDLE). On a node whose CPUs the job fills, an idle-class agent
gets its samples late or not at all. `auto` reads the node's idle time (/proc/stat, the CPUs the agent
may run on) over the agent's own start-up and takes SCHED_IDLE only where at least AUTO_FREE_CPUS of
them were idle, not counting the agent's own use; else normal. Where the job's use grows after that
and the agent's threads and probe children wait LATE_S for a CPU in one turn of the window's loop
(their /proc/PID/task/*/schedstat), auto puts them back at normal priority (`Guard`). A sleeping
SCHED_IDLE thread that wakes beside a CPU-bound one waits only a few ms (measured on this kernel:
4-12 ms a wake-up), so it is the agent's work, not its wake-ups, that shows the wait.

Linux sets the class per thread, and a thread or child inherits it at creation: the choice is applied
before the diagnosis starts any thread or probe child."""
from __future__ import annotations

import os
import resource
import threading
import time
from dataclasses import dataclass

from trainprobe.probes.parsers import procfs

AUTO_FREE_CPUS = 1.0        # idle CPUs, on average over the reading, for SCHED_IDLE
MIN_GAP_S = 0.25            # the two readings at least this far apart (/proc/stat counts 10 ms ticks a CPU)
LATE_S = 0.05               # auto's idle agent waited this long for a CPU in one turn of the window: back to normal
LEVELS = ("auto", "normal", "low", "idle")
LOW_NICE = 10


@dataclass(frozen=True)
class CpuReading:
    """Idle and total CPU-seconds of the CPUs the agent may run on, when, and the agent's own CPU then."""
    mono: float
    idle: float
    total: float
    cpus: int
    self_cpu_s: float


def _self_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def read_cpus(stat_text: str | None = None, allowed: set[int] | None = None) -> CpuReading | None:
    """One reading of /proc/stat's per-CPU lines (procfs.per_cpu_times: idle is idle + iowait; steal
    is busy, the CPU is not this guest's), in CPU-seconds. None where it cannot be read."""
    try:
        stat_text = procfs.try_read_text("/", "proc/stat") if stat_text is None else stat_text
        allowed = os.sched_getaffinity(0) if allowed is None else allowed
    except OSError:
        return None
    cpus = [t for c, t in procfs.per_cpu_times(stat_text or "").items() if c in allowed]
    if not cpus:
        return None
    return CpuReading(time.monotonic(), sum(t["idle"] for t in cpus),
                      sum(t["run"] + t["idle"] + t["irq"] + t["steal"] for t in cpus), len(cpus), _self_cpu_s())


def free_cpus(before: CpuReading, after: CpuReading) -> float | None:
    """CPUs idle on average between the readings, the agent's own CPU time counted as idle (it is the
    agent's to give). None where the readings are too close or do not match."""
    spent = after.total - before.total
    if before.cpus != after.cpus or spent <= 0:
        return None
    idle_share = (after.idle - before.idle) / spent
    wall = after.mono - before.mono
    own = max(0.0, after.self_cpu_s - before.self_cpu_s) / wall if wall > 0 else 0.0
    return round(min(float(after.cpus), idle_share * after.cpus + own), 2)


def apply(level: str) -> str | None:
    """Put the calling thread (and every thread and child started after it) in `level`'s class; None
    when done, else why not."""
    try:
        if level == "idle":
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        elif level == "low":
            os.setpriority(os.PRIO_PROCESS, 0, max(LOW_NICE, os.getpriority(os.PRIO_PROCESS, 0)))
    except (OSError, AttributeError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


CAP_SYS_NICE = 23


def _cap_eff() -> int:
    """This process's effective capabilities (/proc/self/status)."""
    with open("/proc/self/status") as f:
        return next((int(line.split()[1], 16) for line in f if line.startswith("CapEff:")), 0)


def can_return() -> str | None:
    """None where this process may leave SCHED_IDLE again (the Guard's way back), else why not: an
    unprivileged thread may return to SCHED_OTHER only where RLIMIT_NICE allows its nice value
    (sched(7)); root and CAP_SYS_NICE always may."""
    try:
        if os.geteuid() == 0:
            return None
        if _cap_eff() >> CAP_SYS_NICE & 1:
            return None
        soft = resource.getrlimit(resource.RLIMIT_NICE)[0]
        nice = os.getpriority(os.PRIO_PROCESS, 0)
        if soft == resource.RLIM_INFINITY or nice >= 20 - soft:
            return None
        return (f"not root and RLIMIT_NICE {soft} does not let the agent leave SCHED_IDLE again "
                f"(it would need {20 - nice})")
    except (OSError, ValueError):
        return "whether the agent could leave SCHED_IDLE again could not be read"


def choose(free: float | None, back: str | None = None) -> tuple[str, str]:
    """auto's class for `free` idle CPUs, and why; `back`: why the agent could not leave SCHED_IDLE
    again (can_return), which keeps it at normal priority."""
    if free is None:
        return "normal", "the node's idle CPUs could not be read"
    if back is not None and free >= AUTO_FREE_CPUS:
        return "normal", f"{free:.2f} CPUs were idle at start-up, but {back}: the agent runs at normal priority"
    if free >= AUTO_FREE_CPUS:
        return "idle", (f"{free:.2f} CPUs were idle at start-up: the agent runs in SCHED_IDLE, on CPUs the job "
                        f"does not want, and preempts none of its threads")
    return "normal", (f"{free:.2f} CPUs were idle at start-up (SCHED_IDLE wants {AUTO_FREE_CPUS:g}): an idle-class "
                      f"agent would get its samples late, so it runs at normal priority")


class Chooser:
    """Reads the node when made (the CLI's start) and settles the class once (`settle`), before the
    diagnosis starts any thread; later windows of the same command keep it."""

    def __init__(self, level: str):
        self.level = level
        self.before = read_cpus() if level == "auto" else None
        self.decision: dict | None = None

    def settle(self) -> dict:
        if self.decision is not None:
            return self.decision
        level, why, free = self.level, None, None
        if level == "auto":
            if self.before is not None:
                wait = MIN_GAP_S - (time.monotonic() - self.before.mono)
                if wait > 0:
                    time.sleep(wait)
                after = read_cpus()
                free = free_cpus(self.before, after) if after is not None else None
            level, why = choose(free, can_return() if free is not None and free >= AUTO_FREE_CPUS else None)
        error = None
        if level != "normal":
            if threading.active_count() > 1:
                error = "threads already running"
            else:
                error = apply(level)
        self.decision = {"asked": self.level, "class": "normal" if error else level,
                         "free_cpus": free, "why": why}
        if error:
            self.decision["not_set"] = f"{level} not set ({error})"
        return self.decision


def run_delay_s(pid: int | str) -> float | None:
    """Time the threads of `pid` spent runnable but waiting for a CPU (its /proc/PID/task/*/schedstat,
    summed); None where none could be read."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    waits = [ss["wait_s"] for ss in (procfs.parse_schedstat(procfs.try_read_text("/", f"proc/{pid}/task/{t}/schedstat"))
                                     for t in tids) if ss]
    return sum(waits) if waits else None


def promote(pids: list[int]) -> int:
    """Every thread of `pids` back to SCHED_OTHER; how many were moved."""
    moved = 0
    for pid in pids:
        try:
            tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
        except (OSError, ValueError):
            continue
        for tid in tids:
            try:
                if os.sched_getscheduler(tid) == os.SCHED_IDLE:
                    os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))
                    moved += 1
            except OSError:
                pass
    return moved


class Guard:
    """auto's SCHED_IDLE, undone where the agent starves: called once a turn of the window's loop with
    the probes' live children. The agent's threads and its children together waiting LATE_S for a CPU
    in one turn (0.3 s) mean the job took the CPUs it left at start-up."""

    def __init__(self, decision: dict):
        self.decision = decision
        self.active = decision.get("asked") == "auto" and decision.get("class") == "idle"
        self.last: dict[int | str, float] = {}

    def _waits(self, child_pids: list[int]) -> dict[int | str, float]:
        out: dict[int | str, float] = {}
        for pid in ["self", *child_pids]:
            w = run_delay_s(pid)
            if w is not None:
                out[pid] = w
        return out

    def tick(self, child_pids: list[int]) -> None:
        if not self.active:
            return
        now = self._waits(child_pids)
        # a child first seen this turn counts from its first reading
        waited = sum(w - self.last.get(pid, w) for pid, w in now.items())
        self.last = now
        if waited >= LATE_S:
            moved = promote([os.getpid(), *child_pids])
            self.active = False
            self.decision["class"] = "normal"
            self.decision["promoted"] = (f"the agent and its probes waited {waited * 1e3:.0f} ms for a CPU in one turn "
                                         f"of the window: the job's use grew; {moved} threads back at normal priority")
