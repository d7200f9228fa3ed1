"""A diagnosis session: every available probe runs concurrently over one window.

Each probe runs in its own thread with its own Recorder and its own timeout. A probe that fails,
hangs or is interrupted is recorded with its reason; the others go on. On Ctrl-C the session stops
every probe (py-spy gets SIGINT so it writes what it has), and returns what was gathered.
"""
from __future__ import annotations

import os
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable

from trainprobe.probes.base import Availability, Capture, Probe, Recorder, WatchSpec
from trainprobe.probes.errors import ProbeError
from trainprobe.probes.registry import probe_classes, probe_names

Progress = Callable[[str], None]


def stderr_progress(msg: str) -> None:
    print(f"trainprobe: {msg}", file=sys.stderr, flush=True)


@dataclass
class SessionResult:
    captures: list[Capture]
    started_unix: float
    window_s: float
    observed_s: float
    interrupted: bool
    overhead: dict[str, Any] = field(default_factory=dict)
    recorders: dict[str, Recorder] = field(default_factory=dict)
    thread_cpu: dict[str, float] = field(default_factory=dict)
    plan: Any = None
    tree_rss_peak_mb: float = 0.0


def measured_overhead(recorders: dict[str, "Recorder"], thread_cpu: dict[str, float],
                      plan: Any = None, tree_rss_peak_mb: float = 0.0) -> dict[str, Any]:
    """What the agent tree cost so far: this process since it started, and every child each probe
    started (its rusage when reaped, its own children included), per probe."""
    from trainprobe.agent.cost import process_start_cpu_note, tree_usage
    u = tree_usage()
    by_probe: dict[str, Any] = {}
    tracked_cpu = 0.0
    children_rss = 0.0
    for name, rec in recorders.items():
        kids = rec.children_cost()
        tracked_cpu += kids["children_cpu_seconds"]
        children_rss += kids["children_max_rss_mb"]
        by_probe[name] = {"thread_cpu_seconds": round(thread_cpu.get(name, 0.0), 4), **kids}
    total = u["self_cpu_seconds"] + u["children_cpu_seconds"]
    out: dict[str, Any] = {
        "agent_cpu_seconds": round(total, 3),
        # The tree's peak sampled during the window, or the agent's own peak if higher (start-up, rules).
        "agent_max_rss_mb": round(max(tree_rss_peak_mb, u["self_max_rss_mb"]), 1),
        "agent_process_cpu_seconds": round(u["self_cpu_seconds"], 3),
        "children_cpu_seconds": round(u["children_cpu_seconds"], 3),
        # Reaped children no probe accounted for (started outside a Recorder): should stay near 0.
        "untracked_children_cpu_seconds": round(max(0.0, u["children_cpu_seconds"] - tracked_cpu), 3),
        "agent_process_max_rss_mb": round(u["self_max_rss_mb"], 1),
        "children_max_rss_mb_by_rusage": round(children_rss, 1),
        "basis": process_start_cpu_note() + "; RSS: the tree's resident memory sampled from /proc during the window "
                 "(this process and every live child), or the agent's own peak if higher",
        "by_probe": by_probe,
    }
    if plan is not None:
        out["plan"] = plan.to_dict()
    return out


def select_probes(only: tuple[str, ...] = (), skip: tuple[str, ...] = (), deep: bool = False) -> list[Probe]:
    """Diagnose's probes to run: `only` if given, else every default probe (every probe with `deep`).
    Preflight's probes (host, gpuhealth, gpubench) are never among them."""
    names = list(only) if only else probe_names("diagnose", default_only=not deep)
    return [cls() for cls in probe_classes("diagnose", names=[n for n in names if n not in skip])]


def run_session(spec: WatchSpec, probes: list[Probe], progress: Progress = stderr_progress,
                target_alive: Callable[[], bool] | None = None,
                planner: Callable[[list[Probe]], Any] | None = None,
                tick: Callable[[list[int]], None] | None = None) -> SessionResult:
    """Run `probes` over one window. With a `planner` (agent/cost.py), the probes that can run here
    are planned within the agent's budget before the window; those it could not fit are recorded as
    skipped with the reason, and the overhead carries the plan. `tick` is called once a turn of the
    window's loop with the probes' live children (agent/schedclass.Guard)."""
    stop = threading.Event()
    captures: dict[str, Capture] = {}
    threads: dict[str, threading.Thread] = {}
    recorders: dict[str, Recorder] = {}
    thread_cpu: dict[str, float] = {}
    started = time.time()
    t0 = time.monotonic()
    deadline = t0 + spec.window_s

    checks: dict[str, Availability] = {}
    for probe in probes:
        try:
            checks[probe.name] = probe.check(spec)
        except Exception as exc:  # noqa: BLE001 - a broken check is a skipped probe, not a crash
            checks[probe.name] = Availability.no(f"availability check failed: {exc}")
    plan = planner([p for p in probes if checks[p.name].ok]) if planner is not None else None
    for probe in probes:
        cap = Capture(probe.name, started_unix=started)
        captures[probe.name] = cap
        av = checks[probe.name]
        if av.ok and plan is not None and probe.name in plan.skipped:
            av = Availability.no(plan.skipped[probe.name])
        if not av.ok:
            cap.status, cap.reason = "skipped", av.reason
            progress(f"{probe.name}: skipped ({av.reason})")
            continue
        rec = Recorder(cap, stop)
        recorders[probe.name] = rec
        th = threading.Thread(target=_run_probe, args=(probe, spec, rec, deadline, thread_cpu),
                              name=f"probe-{probe.name}",
                              daemon=True)
        threads[probe.name] = th
    progress(f"watching PID {spec.pid} for {spec.window_s:g} s with "
             f"{', '.join(threads) or 'no probes'} ...")
    for th in threads.values():
        th.start()

    interrupted = False
    watch_end = deadline
    rss = _TreeRss(recorders)
    try:
        while time.monotonic() < deadline and any(t.is_alive() for t in threads.values()):
            time.sleep(min(0.3, max(0.0, deadline - time.monotonic())))
            rss.sample()
            if tick is not None:
                tick(_live_children(recorders))
            if target_alive is not None and not target_alive():
                progress(f"target PID {spec.pid} exited during the window; reporting what was gathered")
                stop.set()
                break
        watch_end = min(time.monotonic(), deadline)
        for name, th in threads.items():
            # The probes' children peak while they finish (py-spy writes its trace): keep reading
            # the tree's memory until each probe is done.
            end = deadline + probes_by(name, probes).timeout_s
            while th.is_alive() and time.monotonic() < end:
                th.join(timeout=min(0.1, max(0.0, end - time.monotonic())))
                rss.sample()
    except KeyboardInterrupt:
        interrupted = True
        watch_end = min(time.monotonic(), watch_end)
        progress("interrupted: stopping probes and reporting what was gathered")
        stop.set()
    # The window is the time the probes watched the target; their start-up and teardown are not.
    observed = watch_end - t0
    if interrupted or stop.is_set():
        for rec in recorders.values():
            rec.stop_all()
        for th in threads.values():
            th.join(timeout=5.0)
    for name, th in threads.items():
        cap = captures[name]
        if th.is_alive():
            recorders[name].stop_all()
            cap.status = "timeout"
            cap.reason = cap.reason or f"did not finish within {spec.window_s:g} s + its {probes_by(name, probes).timeout_s:g} s timeout"
            progress(f"{name}: timed out")
        cap.seconds = round(cap.seconds or (time.monotonic() - t0), 3)
    return SessionResult(
        captures=[captures[p.name] for p in probes], started_unix=started, window_s=spec.window_s,
        observed_s=observed, interrupted=interrupted,
        overhead=measured_overhead(recorders, thread_cpu, plan, rss.peak_mb), recorders=recorders,
        thread_cpu=thread_cpu, plan=plan, tree_rss_peak_mb=rss.peak_mb,
    )


def _live_children(recorders: dict[str, Recorder]) -> list[int]:
    """Every live child of every probe."""
    return [p for r in list(recorders.values()) for p in r.live_children()]


class _TreeRss:
    """The agent tree's resident memory (this process plus every live child of every probe), read
    from /proc every 0.3 s of the window and while the probes finish: rusage cannot give it (a child's ru_maxrss includes the
    agent's own memory, copied at fork, so peaks do not add up)."""

    def __init__(self, recorders: dict[str, Recorder]):
        self.recorders = recorders
        self.peak_mb = 0.0
        self._next = 0.0

    def sample(self) -> None:
        now = time.monotonic()
        if now < self._next:
            return
        self._next = now + 0.25     # once per turn of the window's 0.3 s loop, at most every 0.25 s while joining
        pids = [os.getpid()] + _live_children(self.recorders)
        total = 0.0
        for pid in pids:
            try:
                with open(f"/proc/{pid}/statm") as fh:
                    total += int(fh.read().split()[1]) * _PAGE_MB
            except (OSError, ValueError, IndexError):
                pass
        self.peak_mb = max(self.peak_mb, total)


_PAGE_MB = os.sysconf("SC_PAGE_SIZE") / (1024.0 * 1024.0)


def probes_by(name: str, probes: list[Probe]) -> Probe:
    return next(p for p in probes if p.name == name)


def _run_probe(probe: Probe, spec: WatchSpec, rec: Recorder, deadline: float,
               thread_cpu: dict[str, float] | None = None) -> None:
    cap = rec.capture
    m0 = time.monotonic()
    c0 = time.thread_time()
    try:
        probe.capture(spec, rec, deadline)
        if cap.status == "ok" and rec.stop.is_set() and not cap.artifacts:
            cap.status, cap.reason = "failed", "stopped before it gathered anything"
    except ProbeError as exc:
        cap.status, cap.reason = "failed", str(exc)
        cap.meta["error_kind"] = exc.kind       # permission_denied decides the exit code
    except Exception as exc:  # noqa: BLE001 - a bug in one probe never sinks the session
        last = traceback.extract_tb(exc.__traceback__)[-1]
        cap.status = "failed"
        cap.reason = f"internal error: {type(exc).__name__}: {exc} ({os.path.basename(last.filename)}:{last.lineno})"
    finally:
        # meta and reason may quote a tool's log line or a path: redacted like every artifact.
        from trainprobe.probes.parsers import redact
        cap.meta = redact.value(cap.meta)
        cap.reason = redact.text(cap.reason) if cap.reason else cap.reason
        cap.seconds = round(time.monotonic() - m0, 3)
        if thread_cpu is not None:
            # A probe's helper thread (the NVML thread) works for it: its CPU is the probe's.
            helper = cap.meta.get("helper_thread_cpu_seconds")
            extra = float(helper) if isinstance(helper, (int, float)) else 0.0
            thread_cpu[probe.name] = time.thread_time() - c0 + extra
