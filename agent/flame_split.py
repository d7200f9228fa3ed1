"""What a flame graph's time was: on a CPU, waiting for a CPU, or off-CPU.

py-spy (non-blocking, --idle) samples every thread whatever it is doing, so a thread parked in a
wait and a thread that is runnable but has no CPU look as wide as one that computes. Two facts
tell them apart, each where it was measured:

- per stack, from the frames: a stack whose leaf is a blocking call (a wait, a poll, a queue get,
  a sleep: probes.parsers.pystacks.is_idle_stack) was waiting off-CPU; `waiting_part` is that part
  of a profile, drawn blue.
- per thread, from the kernel: /proc/PID/task/TID/schedstat gives each thread's time on a CPU and
  its time runnable in a run queue over the window (the process probe's `cpu_seconds` and
  `run_delay_seconds`); the rest of its wall time it was off-CPU. `thread_split` turns that into
  one bar per thread. The run-queue wait cannot be placed on stacks (py-spy does not see it), so
  it is shown per thread only.
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping

from trainprobe.probes.parsers import pystacks

MAX_THREADS = 8


def _leaf_name(stack: str) -> str:
    leaf = stack.rsplit(";", 1)[-1]
    i = leaf.rfind(" (")
    return leaf[:i] if i > 0 and leaf.endswith(")") else leaf


def waiting_part(profile: Mapping[str, int]) -> dict[str, int]:
    """The stacks of `profile` whose leaf frame is a blocking call, with their counts."""
    out: dict[str, int] = {}
    for stack, n in profile.items():
        if n > 0 and stack and pystacks.is_idle_stack((pystacks.Frame(_leaf_name(stack), "", 0),)):
            out[stack] = n
    return out


def thread_split(process_evidence: Mapping[str, Any] | None, traces: Iterable[pystacks.ThreadTrace],
                 pids: Iterable[int]) -> list[dict[str, Any]]:
    """Per thread py-spy sampled in `pids`: its wall time over the window split into on a CPU,
    waiting for a CPU (run queue) and off-CPU, from the process probe's schedstat deltas. Threads
    the process probe did not read twice (started or ended inside the window) are left out; the
    busiest MAX_THREADS come first."""
    if not process_evidence:
        return []
    window = float(process_evidence.get("window_s") or 0.0)
    if window <= 0:
        return []
    want = set(pids)
    seen_tids = {t.os_tid for t in traces if t.os_tid is not None and t.pid in want}
    names = {t.os_tid: t.name for t in traces if t.os_tid is not None}
    rows = []
    for proc in process_evidence.get("processes") or []:
        if proc.get("pid") not in want:
            continue
        for th in proc.get("threads") or []:
            if th.get("seen") != "both" or th.get("tid") not in seen_tids or th.get("run_delay_seconds") is None:
                continue
            on = max(float(th.get("cpu_seconds") or 0.0), 0.0)
            rq = max(float(th["run_delay_seconds"]), 0.0)
            on, rq = min(on, window), min(rq, max(window - on, 0.0))
            name = names.get(th["tid"]) or th.get("name") or "thread"
            rows.append({"name": f"{name} (PID {proc['pid']}, TID {th['tid']})", "tid": th["tid"], "wall_s": window,
                         "on_cpu_s": round(on, 4), "runqueue_s": round(rq, 4),
                         "off_cpu_s": round(max(window - on - rq, 0.0), 4)})
    rows.sort(key=lambda r: -(r["on_cpu_s"] + r["runqueue_s"]))
    return rows[:MAX_THREADS]
