"""GIL probe: who holds the GIL while the training thread waits for it.

At a low rate (default 10 Hz) it runs `py-spy dump --json --nonblocking` on the training process
and, right after each dump, reads /proc/PID/task/*/syscall (which system call each thread is
blocked in). py-spy reports for every Python thread whether it holds the GIL (`owns_gil`) and
whether the OS has it running (`active`). A sample counts as "the training thread waits for the
GIL" when, at the same moment:
  - another thread of the process holds the GIL,
  - the training thread does not hold it and is not running,
  - it is blocked in futex (how CPython's take_gil waits), and
  - its innermost Python frame is not a deliberate wait (queue get, lock acquire, sleep, select),
    which would also block in futex but with the GIL released on purpose.
The holders seen in those samples name the thread to fix. The scheduler probe, when it runs,
corroborates it independently: which thread woke the training thread up.

Cost: each dump reads the target's memory without stopping it (non-blocking) and costs py-spy
about 10-20 ms of CPU; at 10 Hz that is 10-20% of one core for the window; nothing is attached
between dumps.
"""
from __future__ import annotations

import json
import platform
import time
from typing import Any

from trainprobe.probes.parsers import procfs
from trainprobe.probes.base import Availability, Capture, JobShape, Probe, ProbeCost, Recorder, WatchSpec
from trainprobe.probes.schema import GilEvidence
from trainprobe.probes.errors import PermissionDenied, TargetGone, Unavailable
from trainprobe.probes.pyspy import pyspy_availability, pyspy_binary
from trainprobe.probes.syscalls import SYSCALLS

DEFAULT_RATE_HZ = 10.0
KEEP_FRAMES = 12                 # innermost frames kept per thread and sample
# Innermost Python frames that wait on purpose (the GIL is released by design there).
DELIBERATE_WAITS = (".wait", ".get", "get", "poll", "select", "_poll", ".acquire", "acquire", "sleep", "_recv",
                    "recv_bytes", "recv", "_wait_for_tstate_lock", ".join", "accept", "readinto", "read")


class GilProbe(Probe):
    name = "gil"
    description = "GIL ownership per thread over time (py-spy dump --json --nonblocking at a low rate)"
    needs = ("py-spy", "root or CAP_SYS_PTRACE (or same user with ptrace_scope 0)")
    cost = "about 10-20 ms of py-spy CPU per sample (10 Hz default); the target is never stopped"
    timeout_s = 15.0
    evidence_schema = GilEvidence
    default_enabled = False      # 10-20% of one core while it samples: opt in with --deep
    # Its cost follows its rate: the session gives it what py-spy left of the budget (docs/cost.md).
    adjustable = True
    budget_priority = 20
    dump_cpu_s = 0.015           # one `py-spy dump` (start, attach, read every thread) and its parse
    min_rate_hz = 1.0            # 10 dumps per 10 s: fewer cannot tell a GIL holder from chance
    min_cost_cpu_s = 0.15        # min_rate_hz over a 10 s window: kept aside when py-spy is planned

    def estimate_cost(self, spec: WatchSpec, job: JobShape) -> ProbeCost:
        rate = float(spec.options.get("gil_rate_hz", DEFAULT_RATE_HZ))
        return ProbeCost(rate * spec.window_s * self.dump_cpu_s, 14.0, f"{rate:g} dumps/s")

    def fit_budget(self, spec: WatchSpec, job: JobShape, cpu_s: float) -> ProbeCost | None:
        rate = min(float(spec.options.get("gil_rate_hz", DEFAULT_RATE_HZ)),
                   cpu_s / (max(spec.window_s, 0.5) * self.dump_cpu_s))
        if rate < self.min_rate_hz:
            return None
        spec.options["gil_rate_hz"] = round(rate, 2)
        return self.estimate_cost(spec, job)

    def check(self, spec: WatchSpec) -> Availability:
        return pyspy_availability(spec)

    def capture(self, spec: WatchSpec, rec: Recorder, deadline_monotonic: float) -> None:
        exe = pyspy_binary()
        if exe is None:
            raise Unavailable("py-spy not found")
        rate = float(spec.options.get("gil_rate_hz", DEFAULT_RATE_HZ))
        period = 1.0 / max(rate, 0.1)
        argv = [exe, "dump", "--pid", str(spec.pid), "--json", "--nonblocking"]
        lines: list[str] = []
        errors: list[str] = []
        n_runs = 0
        next_t = time.monotonic()
        while not rec.stop.is_set() and time.monotonic() < deadline_monotonic:
            t0 = time.time()
            m0 = time.monotonic()
            r = _dump(argv, rec)
            n_runs += 1
            sysc = _task_syscalls(spec.root, spec.pid)
            if r is None or r.rc != 0:
                msg = (r.stderr.strip().splitlines() or ["no output"])[-1] if r is not None else "timed out"
                errors.append(msg)
                if not procfs.try_read_text(spec.root, f"proc/{spec.pid}/stat"):
                    break
                if "Permission denied" in msg or "Operation not permitted" in msg:
                    raise PermissionDenied("py-spy could not read the target's memory: run trainprobe with sudo")
            else:
                try:
                    dump = json.loads(r.stdout)
                except ValueError:
                    errors.append("unparseable py-spy output")
                    dump = None
                if dump is not None:
                    lines.append(json.dumps({"t_unix": round(t0, 4), "seconds": round(time.monotonic() - m0, 4),
                                             "threads": _trim(dump), "syscall": sysc}))
            next_t += period
            delay = next_t - time.monotonic()
            if delay < 0:
                next_t = time.monotonic()
            else:
                rec.stop.wait(min(delay, max(0.0, deadline_monotonic - time.monotonic())))
        if not lines:
            if errors:
                raise Unavailable(f"py-spy dump gave no sample: {errors[-1]}")
            raise TargetGone(f"process {spec.pid} exited before the GIL probe took a sample")
        rec.add("gil_samples.jsonl", "\n".join(lines))
        rec.capture.meta.update({"pid": spec.pid, "rate_hz": rate, "arch": platform.machine(), "dumps": n_runs,
                                 "errors": errors[-5:]})

    @staticmethod
    def parse(capture: Capture) -> GilEvidence:
        samples = [json.loads(ln) for ln in capture.artifacts["gil_samples.jsonl"].splitlines() if ln.strip()]
        return analyse(samples, capture.meta)


def _dump(argv: list[str], rec: Recorder) -> Any:
    try:
        r = rec.run(argv, timeout_s=5.0)
    except Unavailable:
        raise
    except Exception as exc:  # noqa: BLE001 - py-spy missing or not executable
        raise Unavailable(f"cannot run py-spy: {exc}") from None
    return None if r.timed_out else r


def _task_syscalls(root: str, pid: int) -> dict[str, str]:
    """tid -> the first field of /proc/PID/task/TID/syscall (a number, 'running', or '-1')."""
    import os
    out: dict[str, str] = {}
    try:
        tids = os.listdir(procfs.path(root, f"proc/{pid}/task"))
    except OSError:
        return out
    for tid in tids:
        text = procfs.try_read_text(root, f"proc/{pid}/task/{tid}/syscall")
        if text:
            out[tid] = text.split(None, 1)[0]
    return out


def _trim(dump: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for t in dump:
        frames = [{k: f.get(k) for k in ("name", "filename", "short_filename", "line")}
                  for f in (t.get("frames") or [])[:KEEP_FRAMES]]
        out.append({"pid": t.get("pid"), "thread_id": t.get("thread_id"), "os_thread_id": t.get("os_thread_id"),
                    "thread_name": t.get("thread_name"), "active": bool(t.get("active")),
                    "owns_gil": bool(t.get("owns_gil")), "frames": frames})
    return out


# -- pure parsing ------------------------------------------------------------------------------------

def _label(frames: list[dict[str, Any]]) -> str | None:
    if not frames:
        return None
    f = frames[0]
    return f"{f.get('name')} ({f.get('short_filename') or f.get('filename')}:{f.get('line')})"


def is_deliberate_wait(frames: list[dict[str, Any]]) -> bool:
    """The innermost Python frame is a wait the code chose (the GIL is released on purpose)."""
    if not frames:
        return True
    name = str(frames[0].get("name") or "")
    return name.endswith(DELIBERATE_WAITS)


def _tid_of(t: dict[str, Any]) -> int | None:
    v = t.get("os_thread_id")
    return int(v) if v is not None else None


def analyse(samples: list[dict[str, Any]], meta: dict[str, Any]) -> dict[str, Any]:
    """Pure: py-spy dumps with the threads' blocking syscalls -> GIL evidence."""
    pid = int(meta.get("pid") or 0)
    futex = SYSCALLS.get(str(meta.get("arch") or "x86_64"), {}).get("futex", 202)
    threads: dict[int, dict[str, Any]] = {}
    n_main = 0
    waits = 0
    waits_unconfirmed = 0
    holders_in_wait: dict[int, int] = {}
    holder_frames: dict[int, dict[str, int]] = {}
    gil_held_samples = 0
    for s in samples:
        tl = s.get("threads") or []
        holder = next((t for t in tl if t.get("owns_gil")), None)
        if holder is not None:
            gil_held_samples += 1
        for t in tl:
            tid = _tid_of(t)
            if tid is None:
                continue
            row = threads.setdefault(tid, {"tid": tid, "name": t.get("thread_name"), "samples": 0, "gil": 0,
                                           "active": 0, "frames": {}})
            row["samples"] += 1
            row["gil"] += 1 if t.get("owns_gil") else 0
            row["active"] += 1 if t.get("active") else 0
            lab = _label(t.get("frames") or [])
            if lab:
                row["frames"][lab] = row["frames"].get(lab, 0) + 1
        main = next((t for t in tl if _tid_of(t) == pid), None) or \
            next((t for t in tl if t.get("thread_name") == "MainThread"), None)
        if main is None:
            continue
        n_main += 1
        if holder is None or holder is main or main.get("owns_gil") or main.get("active"):
            continue
        if is_deliberate_wait(main.get("frames") or []):
            continue
        sysc = (s.get("syscall") or {}).get(str(_tid_of(main)))
        if sysc is not None and sysc not in (str(futex), "running"):
            continue                          # blocked in another syscall (I/O): not the GIL
        htid = _tid_of(holder)
        if sysc is None:
            waits_unconfirmed += 1
        waits += 1
        if htid is not None:
            holders_in_wait[htid] = holders_in_wait.get(htid, 0) + 1
            lab = _label(holder.get("frames") or [])
            if lab:
                holder_frames.setdefault(htid, {})
                holder_frames[htid][lab] = holder_frames[htid].get(lab, 0) + 1
    n = len(samples)
    rows = []
    for tid, r in sorted(threads.items()):
        top = sorted(r["frames"].items(), key=lambda kv: -kv[1])[:3]
        rows.append({"tid": tid, "name": r["name"], "samples": r["samples"],
                     "gil_share": round(r["gil"] / r["samples"], 4) if r["samples"] else 0.0,
                     "active_share": round(r["active"] / r["samples"], 4) if r["samples"] else 0.0,
                     "top_frames": [{"frame": k, "share": round(v / r["samples"], 4)} for k, v in top]})
    training = next((r for r in rows if r["tid"] == pid), None) or next(
        (r for r in rows if r["name"] == "MainThread"), None)
    top_holder = None
    if holders_in_wait:
        htid, cnt = max(holders_in_wait.items(), key=lambda kv: kv[1])
        hrow = next((r for r in rows if r["tid"] == htid), {})
        frames = sorted(holder_frames.get(htid, {}).items(), key=lambda kv: -kv[1])
        top_holder = {"tid": htid, "name": hrow.get("name"), "share_of_waits": round(cnt / waits, 4),
                      "gil_share": hrow.get("gil_share"), "frame": frames[0][0] if frames else None}
    return {
        "pid": pid, "samples": n, "rate_hz": meta.get("rate_hz"),
        "training_thread": training,
        "training_samples": n_main,
        "gil_wait_share": round(waits / n_main, 4) if n_main else None,
        "gil_wait_samples": waits,
        "gil_wait_unconfirmed_samples": waits_unconfirmed,
        "gil_held_share": round(gil_held_samples / n, 4) if n else None,
        "holder": top_holder,
        "holders": [{"tid": t, "name": next((r["name"] for r in rows if r["tid"] == t), None), "samples": c}
                    for t, c in sorted(holders_in_wait.items(), key=lambda kv: -kv[1])],
        "threads": rows,
    }
