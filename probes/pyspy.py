"""py-spy probe: Python stacks of the training process and its DataLoader workers over the window.

Runs `py-spy record --nonblocking --idle --threads --subprocesses -f chrometrace` against the
target. Non-blocking sampling reads the target's memory without stopping it: blocking mode
ptrace-stops every thread (a PyTorch process has dozens) for each sample and can slow training
several-fold. `--idle` keeps threads that wait (a training loop blocked on the worker queue is
"idle" to py-spy). After the window it reads the source lines of the user-code leaf frames, so
`x = x.cuda()` or `loss.item()` can be told apart from other time. Cost: py-spy's own CPU (a few
percent of one core at 50 Hz) and no pause of the target.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from typing import Any

from probes import procfs, pystacks, redact, sourcelines
from probes.base import Availability, Capture, Probe, Recorder, WatchSpec
from probes.errors import PermissionDenied, Unavailable
from probes.target import can_ptrace, inspect

SUPPORTED_PYTHON = ((2, 3), (3, 14))
# 25 samples/s: 250 samples of the training thread in a 10 s window (shares to about +-3%), a 40 ms
# timeline (finer than NVML's 200 ms), and about 0.3 CPU-s of py-spy per window with two processes.
DEFAULT_RATE_HZ = 25


def pyspy_availability(spec: WatchSpec) -> Availability:
    """Whether py-spy can read the target: installed, a Python target, and the rights to attach."""
    if pyspy_binary() is None:
        return Availability.no("py-spy not found: `pip install py-spy` in trainprobe's environment")
    try:
        info = inspect(spec.pid, spec.root)
    except Exception as exc:  # noqa: BLE001 - any failure to read the target is the reason
        return Availability.no(str(exc))
    if not info.is_python:
        return Availability.no(f"PID {spec.pid} is not a Python process")
    try:
        ok, why = can_ptrace(info, spec.root)
    except PermissionDenied as exc:
        return Availability.no(str(exc))
    if not ok:
        return Availability.no(why or "not permitted to attach")
    return Availability.yes()


def pyspy_binary() -> str | None:
    here = os.path.join(os.path.dirname(sys.executable), "py-spy")
    if os.access(here, os.X_OK):
        return here
    return shutil.which("py-spy")


class PySpyProbe(Probe):
    name = "pyspy"
    description = "Python stacks of the training thread and DataLoader workers (py-spy, non-blocking)"
    needs = ("py-spy", "root or CAP_SYS_PTRACE (or same user with ptrace_scope 0)")
    cost = "py-spy's own CPU, about 0.3 CPU-s per 10 s window at 25 Hz; the target is never stopped"
    timeout_s = 15.0

    def check(self, spec: WatchSpec) -> Availability:
        return pyspy_availability(spec)

    def capture(self, spec: WatchSpec, rec: Recorder, deadline_monotonic: float) -> None:
        exe = pyspy_binary()
        if exe is None:
            raise Unavailable("py-spy not found")
        window = max(deadline_monotonic - time.monotonic(), 0.5)
        tmpdir = tempfile.mkdtemp(prefix="trainprobe-pyspy-")
        out = os.path.join(tmpdir, "trace.json")
        argv = [exe, "record", "--pid", str(spec.pid), "--rate", str(spec.rate_hz),
                "--duration", str(int(math.ceil(window))), "--format", "chrometrace",
                "--output", out, "--idle", "--threads", "--subprocesses"]
        if spec.native:
            argv.append("--native")   # --native needs blocking sampling: the caller asked for it
        else:
            argv.append("--nonblocking")
        launch_unix = time.time()
        log = open(os.path.join(tmpdir, "pyspy.log"), "w+")
        proc = rec.spawn(argv, stop_signal=signal.SIGINT, stdout=log, stderr=subprocess.STDOUT)
        stopped = rec.wait_window(deadline_monotonic)
        rc = rec.finish(proc, grace_s=0.1 if stopped else 1.5)
        log.seek(0)
        logtext = log.read()
        log.close()
        rec.add("pyspy.log", logtext[-20000:])
        if not os.path.exists(out):
            shutil.rmtree(tmpdir, ignore_errors=True)
            if "Permission denied" in logtext or "Operation not permitted" in logtext:
                raise PermissionDenied("py-spy could not read the target's memory: run trainprobe with sudo")
            last = [ln for ln in logtext.strip().splitlines() if ln.strip()]
            raise Unavailable(f"py-spy wrote no samples (exit {rc}): {last[-1] if last else 'no output'}")
        with open(out) as fh:
            text = fh.read()
        shutil.rmtree(tmpdir, ignore_errors=True)
        rec.add("chrometrace.json", text)
        rec.capture.meta.update({"pid": spec.pid, "rate_hz": spec.rate_hz, "launch_unix": launch_unix,
                                 "nonblocking": not spec.native, "argv": argv})
        # Source lines of user-code leaf frames, read as the target's own user could (sourcelines).
        try:
            events = json.loads(text)
        except ValueError:
            return
        lines, skipped = sourcelines.read_leaf_sources(events, spec.pid, spec.root, rec=rec)
        rec.add("source_lines.json", json.dumps(lines))
        if skipped:
            rec.add("source_skipped.json", json.dumps(skipped))

    @staticmethod
    def parse(capture: Capture) -> dict[str, Any]:
        events = json.loads(capture.artifacts["chrometrace.json"])
        source = json.loads(capture.artifacts.get("source_lines.json", "{}"))
        return analyse(pystacks.read_chrometrace(events), source, capture.meta)


def _fractions(seconds: dict[str, float], total: float, cats: tuple[str, ...]) -> dict[str, float]:
    return {c: round(seconds.get(c, 0.0) / total, 4) if total > 0 else 0.0 for c in cats}


def _top_stacks(spans_by_stack: dict[tuple, float], total: float, n: int = 5) -> list[dict[str, Any]]:
    top = sorted(spans_by_stack.items(), key=lambda kv: -kv[1])[:n]
    return [{"stack": [f.label() for f in st[-6:]], "fraction": round(s / total, 4) if total else 0.0}
            for st, s in top]


def analyse(traces: list[pystacks.ThreadTrace], source: dict[str, str], meta: dict[str, Any]) -> dict[str, Any]:
    """Pure: thread traces -> the py-spy evidence (training thread breakdown, workers, timeline).

    When the target is a launcher (torchrun) whose children train, each child is a rank: every rank
    gets its own breakdown under `ranks`, and the top-level fields describe the first rank.
    """
    main_pid = int(meta.get("pid") or (traces[0].pid if traces else 0))
    launch = float(meta.get("launch_unix") or 0.0)
    worker_pids = {t.pid for t in traces if pystacks.is_worker_trace(t)}
    by_pid: dict[int, list[pystacks.ThreadTrace]] = defaultdict(list)
    for t in traces:
        by_pid[t.pid].append(t)
    trainers = [pid for pid in by_pid if pid not in worker_pids and _busy_seconds(by_pid[pid]) > 0]
    rank_pids = sorted(pid for pid in trainers if pid != main_pid and main_pid in _ancestry(by_pid[pid]))
    out: dict[str, Any] = {
        "pid": main_pid, "rate_hz": meta.get("rate_hz"), "nonblocking": meta.get("nonblocking", True),
        "anchor_unix": launch, "threads_seen": len(traces), "processes_seen": sorted(by_pid),
    }
    main_view = _trainer_view(main_pid, by_pid, traces, worker_pids, source, launch, single=not rank_pids)
    launcher = bool(rank_pids) and (main_view is None or _training_share(main_view) < 0.1)
    if rank_pids:
        out["ranks"] = [v for v in (_trainer_view(p, by_pid, traces, worker_pids, source, launch, single=False)
                                    for p in rank_pids) if v is not None]
    out["launcher"] = launcher
    # A launcher (torchrun) does no training itself: the top-level view is the rank that waits on
    # data the most (the likely straggler); every rank is under `ranks`.
    top = max(out["ranks"], key=_data_share) if (launcher and out.get("ranks")) else main_view
    if top is None:
        out["training_thread"] = None
        return out
    out.update({k: top[k] for k in ("training_thread", "timeline", "other_threads", "workers")})
    return out


def _training_share(view: dict[str, Any]) -> float:
    bd = view["training_thread"]["breakdown"]
    return sum(v for k, v in bd.items() if k != "other")


def _data_share(view: dict[str, Any]) -> float:
    bd = view["training_thread"]["breakdown"]
    return bd.get("data_wait", 0.0) + bd.get("data_load", 0.0)


def _ancestry(traces: list[pystacks.ThreadTrace]) -> tuple[int, ...]:
    return max((t.ancestry for t in traces), key=len, default=())


def _busy_seconds(traces: list[pystacks.ThreadTrace]) -> float:
    return sum(sp.seconds for t in traces for sp in t.spans if not pystacks.is_idle_stack(sp.stack))


def _trainer_view(pid: int, by_pid: dict[int, list[pystacks.ThreadTrace]], traces: list[pystacks.ThreadTrace],
                  worker_pids: set[int], source: dict[str, str], launch: float, single: bool) -> dict[str, Any] | None:
    """The training thread of one process (the target, or one rank), its other threads and workers."""
    own = by_pid.get(pid, [])
    training = _pick_training_thread(own)
    if training is None:
        return None
    by_cat: dict[str, float] = defaultdict(float)
    by_stack: dict[str, dict[tuple, float]] = defaultdict(lambda: defaultdict(float))
    timeline: list[list[Any]] = []
    worker_startup = 0.0
    for sp in training.spans:
        cat = pystacks.classify_training(sp.stack, source)
        by_cat[cat] += sp.seconds
        by_stack[cat][sp.stack] += sp.seconds
        if any(f.name.endswith("_MultiProcessingDataLoaderIter.__init__") for f in sp.stack):
            worker_startup += sp.seconds
        if timeline and timeline[-1][2] == cat and abs(timeline[-1][1] - sp.t0) < 1e-6:
            timeline[-1][1] = sp.t1
        else:
            timeline.append([sp.t0, sp.t1, cat])
    total = sum(by_cat.values())
    busy = sum(sp.seconds for sp in training.spans if not pystacks.is_idle_stack(sp.stack))
    tt: dict[str, Any] = {
        "pid": training.pid, "tid": training.os_tid, "name": training.name,
        "seconds": round(total, 3), "busy_fraction": round(busy / total, 4) if total else 0.0,
        "breakdown": _fractions(by_cat, total, pystacks.TRAIN_CATEGORIES),
        "seconds_by_category": {c: round(by_cat.get(c, 0.0), 4) for c in pystacks.TRAIN_CATEGORIES},
        "top_stacks": {c: _top_stacks(by_stack[c], total) for c in by_stack},
        "worker_startup_seconds": round(worker_startup, 4),
        "data_transitions": _count_entries(timeline, ("data_wait", "data_load")),
        "observed_from": round(training.spans[0].t0, 4), "observed_to": round(training.spans[-1].t1, 4),
    }
    load_cats: dict[str, float] = defaultdict(float)
    for st, sec in by_stack.get("data_load", {}).items():
        load_cats[_inloop_kind(st)] += sec
    lt = sum(load_cats.values())
    tt["data_load_breakdown"] = _fractions(load_cats, lt, ("getitem", "transform", "collate", "other")) if lt else {}
    others = []
    for t in own:
        if t is training:
            continue
        b = sum(sp.seconds for sp in t.spans if not pystacks.is_idle_stack(sp.stack))
        others.append({"tid": t.os_tid, "name": t.name, "seconds": round(t.seconds, 3),
                       "busy_fraction": round(b / t.seconds, 4) if t.seconds else 0.0,
                       "top": _top_stacks(_stack_seconds(t), t.seconds, 3)})
    mine = [t for t in traces if t.pid in worker_pids and (single or pid in t.ancestry)]
    return {"pid": pid, "training_thread": tt,
            "timeline": [[round(launch + a, 4), round(launch + b, 4), c] for a, b, c in timeline],
            "other_threads": sorted(others, key=lambda o: -o["busy_fraction"]),
            "workers": _workers_view(mine)}


def _workers_view(traces: list[pystacks.ThreadTrace]) -> dict[str, Any]:
    """DataLoader workers: the main thread of each process that runs torch's _worker_loop."""
    workers = []
    w_total: dict[str, float] = defaultdict(float)
    w_stacks: dict[tuple, float] = defaultdict(float)
    for t in traces:
        if not pystacks.is_worker_trace(t):
            continue
        cats: dict[str, float] = defaultdict(float)
        for sp in t.spans:
            c = pystacks.classify_worker(sp.stack)
            cats[c] += sp.seconds
            w_total[c] += sp.seconds
            if c != "idle":
                w_stacks[sp.stack] += sp.seconds
        tot = sum(cats.values())
        workers.append({"pid": t.pid, "tid": t.os_tid, "seconds": round(tot, 3),
                        "breakdown": _fractions(cats, tot, pystacks.WORKER_CATEGORIES)})
    wsum = sum(w_total.values())
    return {
        "count": len({w["pid"] for w in workers}), "per_worker": workers,
        "breakdown": _fractions(w_total, wsum, pystacks.WORKER_CATEGORIES),
        "busy_fraction": round(1.0 - (w_total.get("idle", 0.0) / wsum), 4) if wsum else None,
        "top_stacks": _top_stacks(w_stacks, sum(w_stacks.values()) or 1.0),
    }


def _inloop_kind(stack: tuple) -> str:
    for f in stack:
        if "collate" in f.name and pystacks.is_torch(f.filename):
            return "collate"
    for i, f in enumerate(stack):
        if f.name.endswith(("__getitem__", "__getitems__")):
            return "transform" if any(pystacks._is_transform(g) for g in stack[i + 1:]) else "getitem"
    return "other"


def _stack_seconds(t: pystacks.ThreadTrace) -> dict[tuple, float]:
    d: dict[tuple, float] = defaultdict(float)
    for sp in t.spans:
        d[sp.stack] += sp.seconds
    return d


def _count_entries(timeline: list[list[Any]], cats: tuple[str, ...]) -> int:
    n, prev = 0, None
    for _a, _b, c in timeline:
        if c in cats and prev not in cats:
            n += 1
        prev = c
    return n


def split_traces(traces: list[pystacks.ThreadTrace], main_pid: int) -> tuple[
        pystacks.ThreadTrace | None, list[pystacks.ThreadTrace], list[pystacks.ThreadTrace]]:
    """(the training thread, the DataLoader workers' threads, the other threads of the main
    process): the same split `analyse` makes, for views that need the stacks themselves."""
    main_traces = [t for t in traces if t.pid == main_pid]
    training = _pick_training_thread(main_traces)
    workers = [t for t in traces if t.pid != main_pid and pystacks.is_worker_trace(t)]
    others = [t for t in main_traces if t is not training]
    return training, workers, others


def _pick_training_thread(traces: list[pystacks.ThreadTrace]) -> pystacks.ThreadTrace | None:
    """The MainThread of the main process; else the thread with the most non-idle time."""
    for t in traces:
        if t.name == "MainThread":
            return t
    if not traces:
        return None
    return max(traces, key=lambda t: sum(sp.seconds for sp in t.spans if not pystacks.is_idle_stack(sp.stack)))


def capture_from_chrometrace(text: str, pid: int, launch_unix: float = 0.0, rate_hz: int | None = None,
                             source_remap: dict[str, str] | None = None, cwd: str | None = None) -> Capture:
    """A Capture from a chrometrace that py-spy wrote elsewhere (an imported or archived profile).

    Source lines are read now, through `source_remap` (path prefix -> local prefix) when the
    script lived at another path on the machine that ran it.
    """
    events = json.loads(text)
    cap = Capture("pyspy", started_unix=launch_unix)
    cap.artifacts["chrometrace.json"] = text
    lines, skipped = sourcelines.read_leaf_sources(events, None, "/", cwd=cwd, remap=source_remap)
    cap.artifacts["chrometrace.json"] = redact.json_text(text)
    cap.artifacts["source_lines.json"] = redact.json_text(json.dumps(lines))
    if skipped:
        cap.artifacts["source_skipped.json"] = json.dumps(skipped)
    cap.meta.update({"pid": pid, "rate_hz": rate_hz, "launch_unix": launch_unix, "nonblocking": True,
                     "imported": True})
    return cap
