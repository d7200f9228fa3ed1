"""Run-queue wait of the job's threads: the share of the window each was runnable but not running.

Three probes measure it; the best one present is used:
    sched        eBPF on the scheduler's tracepoints (--deep): exact, with a histogram;
    contention   /proc/PID/task/TID/schedstat read at the same two instants as the other
                 processes' CPU time (the kernel's own run_delay counter, in ns);
    process      the same schedstat counter, read by the process probe.
A thread waiting for a CPU is shown by py-spy inside the frame it was in (forward, backward), so
py-spy's "in compute" share counts that wait as compute; compute.bound and cpu.contended subtract it.
"""
from __future__ import annotations

from typing import Any

from trainprobe.agent.evidence import Evidence

HOW = {"sched": "eBPF run-queue delay", "contention": "schedstat run_delay",
       "process": "schedstat run_delay (process probe)"}


def thread_waits(ev: Evidence) -> tuple[list[dict[str, Any]], str] | None:
    """Per thread of the job: {pid, tid, name, main, target, cpu, r}, and the source of r; None when
    no probe read the job's threads."""
    sched = {t["tid"]: t for t in (ev.get("sched") or {}).get("threads", [])}
    con = ev.get("contention") or {}
    proc = ev.get("process") or {}
    rows: list[dict[str, Any]] = []
    if con.get("job_threads"):
        for t in con["job_threads"]:
            rows.append({"pid": t["pid"], "tid": t["tid"], "name": t["name"], "main": t["main"],
                         "target": t["target"], "cpu": t["cpu_share"], "r": t["runq_share"]})
        source = "contention"
    elif proc.get("processes"):
        win = float(proc.get("window_s") or 0.0) or 1e-6
        for p in proc["processes"]:
            for t in p.get("threads", []):
                r = t.get("run_delay_seconds")
                rows.append({"pid": p["pid"], "tid": t["tid"], "name": t.get("name"), "main": t["tid"] == p["pid"],
                             "target": p["pid"] == proc.get("pid"), "cpu": float(t.get("cpu_fraction") or 0.0),
                             "r": min(1.0, float(r) / win) if r is not None else 0.0})
        source = "process"
    else:
        return None
    if sched:
        for row in rows:
            s = sched.get(row["tid"])
            if s is not None:
                row["r"] = float(s["runq_share"])
        source = "sched"
    return rows, source


def training_wait(ev: Evidence) -> dict[str, Any] | None:
    """{'r', 'cpu', 'source', 'how'} of the training thread (the target's main thread), or None."""
    got = thread_waits(ev)
    if got is None:
        return None
    rows, source = got
    pid = (ev.get("contention") or {}).get("pid") or (ev.get("process") or {}).get("pid")
    t = next((x for x in rows if x["tid"] == pid), None)
    if t is None:
        return None
    return {"r": round(t["r"], 4), "cpu": round(t["cpu"], 4), "source": source, "how": HOW[source]}
