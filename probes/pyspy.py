"""py-spy probe: Python stacks of the training process and its DataLoader workers over the window,
and which thread of the training process held the GIL.

Runs `py-spy record --nonblocking --idle --threads --subprocesses -f chrometrace` against the
target. Non-blocking sampling reads the target's memory without stopping it: blocking mode
ptrace-stops every thread (a PyTorch process has dozens) for each sample and can slow training
several-fold. `--idle` keeps threads that wait (a training loop blocked on the worker queue is
"idle" to py-spy). After the window it reads the source lines of the user-code leaf frames, so
`x = x.cuda()` or `loss.item()` can be told apart from other time. Cost: py-spy's own CPU (a few
percent of one core at 50 Hz) and no pause of the target.

Beside it, a second `py-spy record --gil --nonblocking --threads -f speedscope` samples the training
process at a low rate (GIL_SAMPLES a window: 10 Hz over 10 s): py-spy keeps of each sample only the thread that held the GIL,
read from the interpreter's state, so each thread's GIL-holding share is measured, not guessed
from its frames. It unwinds one stack a sample (0.15 ms measured, whatever the thread count), so it
costs about 0.03 CPU-s per 10 s window. At the window's start and end the probe reads the training
process's per-thread CPU time and run-queue delay (/proc/PID/task/TID/{stat,schedstat}): with them
the training thread's off-CPU time is split by where its frames were (allocate_waits), and a
thread is idle when the OS says it slept, not when its frames look idle. On a free-threaded build
(python3.13t) there is no GIL and no GIL sampler runs.
"""
from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from collections import defaultdict
from typing import Any

from trainprobe.probes.parsers import procfs, pystacks, redact
from trainprobe.probes.support import sourcelines
from trainprobe.probes.base import (Availability, Capture, JobShape, Probe, ProbeCost, Recorder, WatchSpec, private_dir,
                                    remove_private_dir, which)
from trainprobe.probes.schema import PySpyEvidence
from trainprobe.probes.errors import PermissionDenied, Unavailable
from trainprobe.probes.support.target import can_ptrace, inspect

SUPPORTED_PYTHON = ((2, 3), (3, 14))
# 25 samples/s: 250 samples of the training thread in a 10 s window (shares to about +-3%), a 40 ms
# timeline (finer than NVML's 200 ms), and about 0.3 CPU-s of py-spy per window with two processes.
DEFAULT_RATE_HZ = 25

# The cost model (measured: benchmarks/bench_cost.py, docs/cost.md). One py-spy process per sampled
# PID: py-spy's start-up (attach, symbols) plus, per sample of one process, py-spy's read of its
# stacks and the agent's parse of the trace. `--subprocesses` over a forked DataLoader costs far more
# per sample (forked workers share their parent's thread ids, so every sample re-writes every frame).
PYSPY_FIXED_CPU_S = 0.02
PYSPY_RSS_MB = 14.0
SAMPLE_CPU_S = 0.00042         # per sample of one process of one thread, its own sampler, with its parse
# py-spy walks every Python thread's frames on each sample and looks up every OS thread of the
# target; a thread with no Python state (an OpenMP pool, CUDA's, torch's autograd threads) costs
# little. Measured (benchmarks/bench_pyspy_threads.py, py-spy 0.4.3, the H200 node): 0.45 ms a
# sample of a 1-thread loop, +0.011 ms per idle native thread (16 and 48 of them), +0.05-0.19 ms
# per Python thread (a multiprocessing feeder thread's few frames to 16 frames deep); a CUDA
# training process of 34 threads, 2 of them Python, 0.63 ms; one with 14 DataLoader workers (19
# threads, 17 of them Python: the main thread, one feeder thread per worker's index queue, the
# pin-memory thread) 1.39-1.50 ms. The 2-CPU VM: 0.8 ms, +0.02 and +0.45 ms at its slower speed.
SAMPLE_CPU_S_PER_THREAD = 0.00001
SAMPLE_CPU_S_PER_PYTHON_THREAD = 0.00005


def python_threads(threads: int, workers: int = 0) -> int:
    """The Python threads a training process is expected to have before py-spy has read it: its main
    thread and, with DataLoader workers, one multiprocessing feeder thread per worker's index queue
    and the pin-memory thread (at most its OS threads)."""
    return max(1, min(max(threads, 1), 1 + (workers + 1 if workers > 0 else 0)))


def sample_cpu_s(threads: int, workers: int = 0) -> float:
    """py-spy's CPU (and the parse) per sample of one process with `threads` OS threads and
    `workers` DataLoader workers (which set how many of those threads are Python's)."""
    return (SAMPLE_CPU_S + SAMPLE_CPU_S_PER_THREAD * max(threads, 1)
            + SAMPLE_CPU_S_PER_PYTHON_THREAD * (python_threads(threads, workers) - 1))
SAMPLE_CPU_S_SUBPROCESSES = 0.0008   # per sample of each process under one --subprocesses sampler
MIN_MAIN_RATE_HZ = 10          # 100 samples per 10 s: shares to +-10 points; coarser cannot rank fixes
# Whatever the window, the training thread gets at least this many samples (a share to about +-8
# points at 95%): a 4 s window at 10 Hz (40 samples, +-16 points) moved a data-loading share of one
# steady job between 0.42 and 0.79 and its expected speedup between 1.58x and 1.0x. 150 samples cost
# about 0.06 CPU-s, whatever the window.
MIN_MAIN_SAMPLES = 150
HOLDER_FILES = 12            # source files kept per GIL holder (its package: what the thread is)
MAX_PLANNED_RATE_HZ = 100      # short windows raise the rate up to this, no further


def min_main_rate(window_s: float) -> int:
    """The least rate worth a diagnosis over `window_s`: MIN_MAIN_RATE_HZ, and MIN_MAIN_SAMPLES in all."""
    return max(MIN_MAIN_RATE_HZ, min(MAX_PLANNED_RATE_HZ, math.ceil(MIN_MAIN_SAMPLES / max(window_s, 0.5))))


def default_rate(window_s: float) -> int:
    """The rate the budget plans up to: DEFAULT_RATE_HZ, or more on a window too short for MIN_MAIN_SAMPLES."""
    return max(DEFAULT_RATE_HZ, min_main_rate(window_s))
MIN_WORKER_RATE_HZ = 2
# Workers are sampled at a lower rate than the training thread: each for one slot of the window, to
# see where their time goes (their CPU is known from /proc); a sampler's start-up (0.02 CPU-s) is most
# of a worker's cost at this rate.
MAX_WORKER_RATE_HZ = 10
MAX_WORKER_SAMPLERS = 2        # concurrent per-worker samplers (RSS: PYSPY_RSS_MB each)
WORKER_SHARE = 0.4             # of the probe's CPU, for workers, when the job has workers
# The GIL sampler (`record --gil`): py-spy reads which thread holds the GIL and unwinds that one
# stack. Measured here (py-spy 0.4.3, its rusage over 3 s at 1 and 100 Hz): start-up 0.017-0.018 CPU-s, then 0.15 ms a
# sample on a 2-thread torch job and on a 21-thread process alike (the full sampler: 0.57 and 2.3 ms).
# 10 Hz gives 100 samples per 10 s window (a holder's share to about +-6 points) for 0.033 CPU-s.
GIL_SAMPLES = 100              # per window, whatever its length (a short window samples faster)
MIN_GIL_SAMPLES = 40           # the least: a holder at 10% of the window is still seen about 4 times
MAX_GIL_RATE_HZ = 50
GIL_FIXED_CPU_S = 0.018
GIL_SAMPLE_CPU_S = 0.00015
TASKS_READ_LIMIT = 1024        # threads of the training process whose CPU time is read
RANK_TRAINING_SHARE = 0.1      # a child process trains (is a rank) when this share of its main thread is in training frames


def gil_rate(window_s: float, samples: int = GIL_SAMPLES) -> int:
    """The GIL sampler's rate for `samples` over the window: 10 Hz on a 10 s window."""
    return max(1, min(MAX_GIL_RATE_HZ, math.ceil(samples / max(window_s, 0.5))))


def gil_sampler_cost(rate_hz: float, window_s: float) -> float:
    """CPU-s of the GIL sampler at `rate_hz` over `window_s` (0 when it does not run)."""
    return GIL_FIXED_CPU_S + rate_hz * max(window_s, 0.5) * GIL_SAMPLE_CPU_S if rate_hz > 0 else 0.0


def _gil_plan(threads: int, ranks: tuple[int, ...], busy: int | None = None) -> str | None:
    """Why no GIL sampler is planned, or None when one is."""
    if ranks:
        return "the target is a launcher: its ranks' GIL is not sampled"
    if threads <= 1:
        return "the training process had one thread: no other thread can hold the GIL"
    if busy is not None and busy <= 1:
        # A thread holding the GIL runs Python on a CPU: one that has not run (over a 0.1 s look and
        # over its life) cannot hold it for a share worth a finding.
        return ("no thread of the training process but one used a CPU (5% of 0.1 s, or 5% of its life): "
                "no other thread holds the GIL for long")
    return None


def plan_sampling(window_s: float, processes: tuple[int, ...], children: dict[int, int], cpu_s: float,
                  max_rate_hz: int, threads: int = 1, ranks: tuple[int, ...] = (),
                  busy: int | None = None) -> dict[str, Any] | None:
    """The cheapest sampling that fits `cpu_s`: the target at up to `max_rate_hz`; its workers at a
    lower rate, a rotating subset of MAX_WORKER_SAMPLERS at a time; None if not even the target fits.

    A launcher with ranks, or a job with grandchildren (ranks and their workers), keeps one `--subprocesses`
    sampler: it needs the process tree in the trace, at a rate the budget allows."""
    main = processes[0] if processes else 0
    workers = [p for p in processes[1:] if children.get(p) == main]
    per_window = max(window_s, 0.5)
    least = min(max_rate_hz, min_main_rate(window_s))     # a rate asked for below the minimum is kept
    tree = bool(ranks or any(children.get(p) not in (None, main) for p in processes[1:]))
    main_sample = sample_cpu_s(threads, len(workers))
    least_cost = PYSPY_FIXED_CPU_S + least * per_window * (
        len(processes) * SAMPLE_CPU_S_SUBPROCESSES if tree else main_sample)
    # The GIL sampler comes out of the budget first (it is small), at the highest rate that leaves
    # the training thread its least rate.
    gil_why = _gil_plan(threads, ranks, busy)
    if gil_why is None:
        g_rate = next((g for g in (gil_rate(window_s), gil_rate(window_s, MIN_GIL_SAMPLES))
                       if cpu_s - gil_sampler_cost(g, window_s) >= least_cost), 0)
        if not g_rate:
            gil_why = f"the budget ({cpu_s:.2f} CPU-s) leaves nothing for the GIL sampler"
    else:
        g_rate = 0
    gil_cost = gil_sampler_cost(g_rate, window_s)
    gil = {"gil_rate_hz": g_rate, "gil_skipped": gil_why}
    cpu_s -= gil_cost
    if tree:
        n = len(processes)
        rate = min(max_rate_hz, int((cpu_s - PYSPY_FIXED_CPU_S) / (per_window * n * SAMPLE_CPU_S_SUBPROCESSES)))
        if rate < least:
            # Ranks need their stacks in one trace: the least worth a diagnosis is the minimum rate
            # over the whole tree; the plan's cost then says it is over the budget.
            rate = least
        return {"mode": "subprocesses", "main_pid": main, "main_rate_hz": rate, "workers": [],
                "worker_rate_hz": rate, "worker_slots": [], **gil,
                "cpu_seconds": PYSPY_FIXED_CPU_S + rate * per_window * n * SAMPLE_CPU_S_SUBPROCESSES + gil_cost}
    main_cpu = cpu_s * (1.0 - WORKER_SHARE) if workers else cpu_s
    rate = min(max_rate_hz, int((main_cpu - PYSPY_FIXED_CPU_S) / (per_window * main_sample)))
    if rate < least:
        rate = min(max_rate_hz, int((cpu_s - PYSPY_FIXED_CPU_S) / (per_window * main_sample)))
        if rate < least:
            return None
    cost = PYSPY_FIXED_CPU_S + rate * per_window * main_sample
    left = cpu_s - cost
    cost += gil_cost
    plan: dict[str, Any] = {"mode": "per_pid", "main_pid": main, "main_rate_hz": rate, "workers": workers,
                            "worker_rate_hz": 0, "worker_slots": [], **gil}
    k = min(MAX_WORKER_SAMPLERS, len(workers))
    while k > 0:
        slots = -(-len(workers) // k)                      # ceil: every worker gets one slot
        w_rate = min(rate, MAX_WORKER_RATE_HZ,
                     int((left - slots * k * PYSPY_FIXED_CPU_S) / (per_window * k * SAMPLE_CPU_S)))
        if w_rate >= MIN_WORKER_RATE_HZ:
            plan["worker_rate_hz"] = w_rate
            plan["worker_slots"] = [workers[i * k:(i + 1) * k] for i in range(slots)]
            cost += slots * k * PYSPY_FIXED_CPU_S + w_rate * per_window * k * SAMPLE_CPU_S
            break
        k -= 1
    plan["cpu_seconds"] = cost
    return plan


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
    return which("py-spy")


class PySpyProbe(Probe):
    name = "pyspy"
    description = "Python stacks of the training thread and DataLoader workers (py-spy, non-blocking)"
    needs = ("py-spy", "root or CAP_SYS_PTRACE (or same user with ptrace_scope 0)")
    cost = ("py-spy's own CPU and the parse: about 0.02 CPU-s per sampler plus 0.42 ms per sample of one process "
            "(+0.01 ms per thread, +0.05 ms per Python thread beyond the first: 0.1-0.15 CPU-s for a training process "
            "at 25 Hz over 10 s), and the GIL sampler (0.018 CPU-s plus "
            "0.15 ms a sample: 0.033 CPU-s at 10 Hz over 10 s); the target is never stopped")
    timeout_s = 15.0
    evidence_schema = PySpyEvidence
    adjustable = True
    budget_priority = 10          # the training thread's stacks come first
    # py-spy's own process, of the probe's CPU: 0.75 on the 2-CPU VM, 0.80-0.87 on an H100 node
    # (docs/cost.md); its thread and the parse of its output are the interpreter's.
    native_share = 0.8
    min_cost_cpu_s = PYSPY_FIXED_CPU_S + MIN_MAIN_RATE_HZ * 10 * SAMPLE_CPU_S + gil_sampler_cost(gil_rate(10, MIN_GIL_SAMPLES), 10)

    def check(self, spec: WatchSpec) -> Availability:
        return pyspy_availability(spec)

    @staticmethod
    def min_cost(window_s: float, threads: int = 1, workers: int = 0, busy: int | None = None,
                 ranks: tuple[int, ...] = ()) -> float:
        """The training process alone at min_main_rate, and the GIL sampler at its least rate where one
        is planned (`_gil_plan`): the least sampling worth a diagnosis. A GIL sampler counted here that
        the plan then leaves out went to the training thread's rate instead (20 Hz for 15 on the 2-CPU
        machine's job without workers, 0.024 CPU-s over the budget's floor)."""
        gil = (gil_sampler_cost(gil_rate(window_s, MIN_GIL_SAMPLES), window_s)
               if _gil_plan(threads, ranks, busy) is None else 0.0)
        per_sample = sample_cpu_s(threads, workers)
        return PYSPY_FIXED_CPU_S + min_main_rate(window_s) * max(window_s, 0.5) * per_sample + gil + 1e-6

    def estimate_cost(self, spec: WatchSpec, job: JobShape) -> ProbeCost:
        n = max(1, len(job.processes))
        gil = _gil_plan(job.threads, job.ranks, job.busy_threads) is None
        return ProbeCost(PYSPY_FIXED_CPU_S + spec.rate_hz * spec.window_s * n * SAMPLE_CPU_S_SUBPROCESSES
                         + (gil_sampler_cost(gil_rate(spec.window_s), spec.window_s) if gil else 0.0),
                         PYSPY_RSS_MB * (1 + n / 4 + gil),
                         f"{n} process(es) at {spec.rate_hz} Hz under one sampler"
                         + (f", GIL holder at {gil_rate(spec.window_s)} Hz" if gil else ""))

    def fit_budget(self, spec: WatchSpec, job: JobShape, cpu_s: float) -> ProbeCost | None:
        plan = plan_sampling(spec.window_s, job.processes or (spec.pid,), job.children, cpu_s, spec.rate_hz,
                             job.threads, job.ranks, job.busy_threads)
        if plan is None:
            return None
        spec.options["pyspy_plan"] = plan
        k = max((len(s) for s in plan["worker_slots"]), default=0)
        what = f"target at {plan['main_rate_hz']} Hz"
        if plan["worker_slots"]:
            what += (f", {len(plan['workers'])} workers at {plan['worker_rate_hz']} Hz, {k} at a time "
                     f"in {len(plan['worker_slots'])} slot(s)")
        elif plan["mode"] == "subprocesses":
            what = f"{len(job.processes)} processes at {plan['main_rate_hz']} Hz under one sampler"
        if plan.get("gil_rate_hz"):
            what += f", GIL holder at {plan['gil_rate_hz']} Hz"
        return ProbeCost(plan["cpu_seconds"], PYSPY_RSS_MB * (1 + k + (1 if plan.get("gil_rate_hz") else 0)), what)

    def capture(self, spec: WatchSpec, rec: Recorder, deadline_monotonic: float) -> None:
        exe = pyspy_binary()
        if exe is None:
            raise Unavailable("py-spy not found")
        plan = spec.options.get("pyspy_plan")
        if plan and plan.get("mode") == "per_pid":
            return self._capture_per_pid(exe, spec, rec, deadline_monotonic, plan)
        rate = int(plan["main_rate_hz"]) if plan else spec.rate_hz
        window = max(deadline_monotonic - time.monotonic(), 0.5)
        tmpdir = private_dir("trainprobe-pyspy-")
        out = os.path.join(tmpdir, "trace.json")
        argv = [exe, "record", "--pid", str(spec.pid), "--rate", str(rate),
                "--duration", str(int(math.ceil(window))), "--format", "chrometrace",
                "--output", out, "--idle", "--threads", "--subprocesses"]
        if spec.native:
            argv.append("--native")   # --native needs blocking sampling: the caller asked for it
        else:
            argv.append("--nonblocking")
        launch_unix = time.time()
        log = open(os.path.join(tmpdir, "pyspy.log"), "w+")
        proc = rec.spawn(argv, stop_signal=signal.SIGINT, stdout=log, stderr=subprocess.STDOUT)
        gil = _GilWatch(exe, spec, plan, window, tmpdir)
        gil.start(rec)
        stopped = rec.wait_window(deadline_monotonic)
        rc = rec.finish(proc, grace_s=0.1 if stopped else 1.5)
        gil.finish(rec, stopped)
        log.seek(0)
        logtext = log.read()
        log.close()
        rec.add("pyspy.log", logtext[-20000:])
        if not os.path.exists(out):
            remove_private_dir(tmpdir)
            if "Permission denied" in logtext or "Operation not permitted" in logtext:
                raise PermissionDenied("py-spy could not read the target's memory: run trainprobe with sudo")
            last = [ln for ln in logtext.strip().splitlines() if ln.strip()]
            raise Unavailable(f"py-spy wrote no samples (exit {rc}): {last[-1] if last else 'no output'}")
        with open(out) as fh:
            text = fh.read()
        remove_private_dir(tmpdir)
        rec.add("chrometrace.json", text)
        rec.capture.meta.update({"pid": spec.pid, "rate_hz": rate, "launch_unix": launch_unix,
                                 "nonblocking": not spec.native, "argv": argv,
                                 "sampling": {"mode": "subprocesses", "main_rate_hz": rate, "worker_rate_hz": rate,
                                              "window_s": round(window, 3)}})
        # Source lines of user-code leaf frames, read as the target's own user could (sourcelines).
        try:
            events = json.loads(text)
        except ValueError:
            return
        self._add_source_lines(events, spec, rec)

    @staticmethod
    def _add_source_lines(events: list[dict[str, Any]], spec: WatchSpec, rec: Recorder) -> None:
        """Source lines of user-code leaf frames, read as the target's own user could (sourcelines)."""
        lines, skipped = sourcelines.read_leaf_sources(events, spec.pid, spec.root, rec=rec)
        rec.add("source_lines.json", json.dumps(lines))
        if skipped:
            rec.add("source_skipped.json", json.dumps(skipped))

    def _capture_per_pid(self, exe: str, spec: WatchSpec, rec: Recorder, deadline_monotonic: float,
                         plan: dict[str, Any]) -> None:
        """The target at its own rate for the whole window; its workers a few at a time, each slot of
        the window for the next few, at the workers' rate. Every sampler reads one PID."""
        tmpdir = private_dir("trainprobe-pyspy-")
        try:
            window = max(deadline_monotonic - time.monotonic(), 0.5)
            main = _Sampler(exe, spec.pid, int(plan["main_rate_hz"]), window, tmpdir, "main", spec.native)
            main.start(rec)
            gil = _GilWatch(exe, spec, plan, window, tmpdir)
            gil.start(rec)
            slots = [list(s) for s in plan.get("worker_slots") or []]
            worker_runs: list[_Sampler] = []
            slot_s = window / len(slots) if slots else 0.0
            for i, pids in enumerate(slots):
                slot_end = min(deadline_monotonic, time.monotonic() + slot_s)
                if rec.stop.is_set() or slot_end - time.monotonic() < 0.3:
                    break
                run = [_Sampler(exe, p, int(plan["worker_rate_hz"]), slot_end - time.monotonic(), tmpdir,
                                f"w{i}-{p}", spec.native) for p in pids]
                for r in run:
                    r.start(rec)
                stopped = rec.wait_window(slot_end)
                for r in run:
                    r.finish(rec, stopped)
                worker_runs.extend(run)
            stopped = rec.wait_window(deadline_monotonic)
            main.finish(rec, stopped)
            gil.finish(rec, stopped)
            if main.text is None:
                logtext = main.log
                if "Permission denied" in logtext or "Operation not permitted" in logtext:
                    raise PermissionDenied("py-spy could not read the target's memory: run trainprobe with sudo")
                last = [ln for ln in logtext.strip().splitlines() if ln.strip()]
                raise Unavailable(f"py-spy wrote no samples (exit {main.rc}): {last[-1] if last else 'no output'}")
        finally:
            remove_private_dir(tmpdir)
        rec.add("pyspy.log", main.log[-20000:])
        rec.add("chrometrace.json", main.text)
        workers = [{"pid": r.pid, "launch_unix": r.launch_unix, "seconds": round(r.seconds, 3),
                    "rate_hz": r.rate, "events": json.loads(r.text)} for r in worker_runs if r.text]
        rec.add("workers_chrometrace.json", json.dumps(workers, separators=(",", ":")))
        rec.capture.meta.update({
            "pid": spec.pid, "rate_hz": main.rate, "launch_unix": main.launch_unix, "nonblocking": not spec.native,
            "argv": main.argv,
            "sampling": {"mode": "per_pid", "main_rate_hz": main.rate, "window_s": round(main.seconds, 3),
                         "workers_known": list(plan.get("workers") or []), "worker_rate_hz": plan.get("worker_rate_hz"),
                         "worker_slot_s": round(slot_s, 3),
                         "workers_sampled": {str(r.pid): round(r.seconds, 3) for r in worker_runs if r.text}}})
        try:
            events = json.loads(main.text)
        except ValueError:
            return
        for w in workers:
            events.extend(w["events"])
        self._add_source_lines(events, spec, rec)

    @staticmethod
    def parse(capture: Capture) -> PySpyEvidence:
        events = json.loads(capture.artifacts["chrometrace.json"])
        source = json.loads(capture.artifacts.get("source_lines.json", "{}"))
        traces = pystacks.read_chrometrace(events)
        main_pid = int(capture.meta.get("pid") or 0)
        launch = float(capture.meta.get("launch_unix") or 0.0)
        for w in json.loads(capture.artifacts.get("workers_chrometrace.json", "[]")):
            shift = float(w.get("launch_unix") or launch) - launch
            for t in pystacks.read_chrometrace(w["events"]):
                for sp in t.spans:          # onto the target's time base
                    sp.t0 += shift
                    sp.t1 += shift
                t.ancestry = t.ancestry or (main_pid, t.pid)
                traces.append(t)
        gil_text = capture.artifacts.get("gil_speedscope.json")
        tasks_text = capture.artifacts.get("tasks.json")
        out = analyse(traces, source, capture.meta, gil_doc=json.loads(gil_text) if gil_text else None,
                      tasks=json.loads(tasks_text) if tasks_text else None)
        unread = read_unread(capture.artifacts.get("pyspy.log") or "")
        if unread is not None:
            out["unread"] = unread
        return out


_SAMPLES_LINE = re.compile(r"Samples: (\d+) Errors: (\d+)")


def read_unread(log: str) -> dict[str, Any] | None:
    """py-spy's closing count of the training process's sampler ("Samples: N Errors: E"): the samples
    its non-blocking reads could not read are dropped, and they fall where the loop's Python changes
    fastest (docs/probes.md)."""
    found = _SAMPLES_LINE.findall(log)
    if not found:
        return None
    n, e = (int(x) for x in found[-1])
    return {"samples": n, "errors": e, "share": round(e / (n + e), 4) if n + e else 0.0}


class _Sampler:
    """One `py-spy record` of one PID (no --subprocesses), written as chrometrace."""

    def __init__(self, exe: str, pid: int, rate: int, seconds: float, tmpdir: str, tag: str, native: bool,
                 fmt: str = "chrometrace", flags: tuple[str, ...] = ()):
        self.pid, self.rate, self.planned_s = pid, rate, seconds
        self.out = os.path.join(tmpdir, f"{tag}.json")
        self.logpath = os.path.join(tmpdir, f"{tag}.log")
        self.argv = [exe, "record", "--pid", str(pid), "--rate", str(rate),
                     "--duration", str(max(1, int(math.ceil(seconds)))), "--format", fmt,
                     "--output", self.out, "--idle", "--threads", *flags,
                     "--native" if native else "--nonblocking"]
        self.text: str | None = None
        self.log = ""
        self.rc: int | None = None
        self.launch_unix = 0.0
        self.seconds = 0.0

    def start(self, rec: Recorder) -> None:
        self._logfh = open(self.logpath, "w+")
        self.launch_unix = time.time()
        self._m0 = time.monotonic()
        self.proc = rec.spawn(self.argv, stop_signal=signal.SIGINT, stdout=self._logfh, stderr=subprocess.STDOUT)

    def finish(self, rec: Recorder, stopped: bool) -> None:
        # py-spy rounds --duration up to whole seconds: a slot ends on time with SIGINT, which makes
        # py-spy write what it has.
        self.rc = rec.finish(self.proc, grace_s=0.05 if stopped or self.planned_s % 1 else 1.5)
        self.seconds = time.monotonic() - self._m0
        self._logfh.seek(0)
        self.log = self._logfh.read()
        self._logfh.close()
        if os.path.exists(self.out):
            with open(self.out) as fh:
                self.text = fh.read()


class _GilWatch:
    """The GIL sampler and the training process's per-thread CPU time, over the main sampler's window.

    Artifacts: gil_speedscope.json (py-spy --gil), tasks.json (/proc/PID/task/*/{stat,schedstat} at
    the start and the end, with monotonic times); meta: `gil` (rate, seconds, why it did not run) and
    `python_build` (free-threaded or not)."""

    def __init__(self, exe: str, spec: WatchSpec, plan: dict[str, Any] | None, window: float, tmpdir: str):
        self.spec = spec
        self.build = python_build(spec.root, spec.pid)
        if plan:
            rate, self.reason = int(plan.get("gil_rate_hz") or 0), plan.get("gil_skipped")
        else:
            rate, self.reason = gil_rate(window), None
        if self.build["free_threaded"]:
            rate, self.reason = 0, f"free-threaded Python ({self.build['basis']}): no GIL"
        if rate and not self.reason and plan is None and len(procfs.thread_ids(spec.root, spec.pid)) <= 1:
            rate, self.reason = 0, "the training process had one thread: no other thread can hold the GIL"
        # Always non-blocking: the holder is read from the interpreter's state, no thread is stopped.
        self.sampler = _Sampler(exe, spec.pid, rate, window, tmpdir, "gil", False, "speedscope",
                                ("--gil", "--nolineno")) if rate > 0 else None
        self.tasks: dict[str, Any] = {}

    def start(self, rec: Recorder) -> None:
        self.tasks["start"] = procfs.task_snapshot(self.spec.root, self.spec.pid, TASKS_READ_LIMIT)
        if self.sampler is not None:
            self.sampler.start(rec)

    def finish(self, rec: Recorder, stopped: bool) -> None:
        s = self.sampler
        if s is not None:
            s.finish(rec, True)          # ends with the window: SIGINT makes py-spy write what it has
        self.tasks["end"] = procfs.task_snapshot(self.spec.root, self.spec.pid, TASKS_READ_LIMIT)
        if self.tasks["end"]["tasks"] or self.tasks["start"]["tasks"]:
            rec.add("tasks.json", json.dumps(self.tasks, separators=(",", ":")))
        meta: dict[str, Any] = {"rate_hz": s.rate if s else 0, "seconds": round(s.seconds, 3) if s else None,
                                "reason": self.reason}
        if s is not None:
            meta["argv"] = s.argv
            if s.text:
                rec.add("gil_speedscope.json", s.text)
            else:
                last = [ln for ln in s.log.strip().splitlines() if ln.strip()]
                meta["reason"] = f"py-spy --gil wrote no samples (exit {s.rc}): {last[-1] if last else 'no output'}"
        rec.capture.meta.update({"gil": meta, "python_build": self.build})


_FREE_THREADED = (re.compile(r"python3\.\d+t$"), re.compile(r"libpython3\.\d+t\.so"), re.compile(r"\.cpython-3\d+t-"))
_WITH_GIL = (re.compile(r"python3\.\d+$"), re.compile(r"libpython3\.\d+\.so"), re.compile(r"\.cpython-3\d+-"))


def python_build(root: str, pid: int) -> dict[str, Any]:
    """Whether the target's interpreter is a free-threaded build (no GIL), from what it runs: its
    binary's name (python3.13t), its libpython (libpython3.13t.so), the ABI tag of the extension
    modules it has loaded (.cpython-313t-...). {'free_threaded': True | False | None, 'basis': ...}."""
    try:
        exe = os.path.basename(os.readlink(procfs.path(root, f"proc/{pid}/exe")))
    except OSError:
        exe = ""
    maps = procfs.try_read_text(root, f"proc/{pid}/maps") or ""
    names = {ln.rsplit("/", 1)[-1] for ln in maps.splitlines() if "/" in ln}
    for rx in _FREE_THREADED:
        hit = next((n for n in ([exe] if exe else []) + sorted(names) if rx.search(n)), None)
        if hit:
            return {"free_threaded": True, "basis": hit}
    for rx in _WITH_GIL:
        hit = next((n for n in ([exe] if exe else []) + sorted(names) if rx.search(n)), None)
        if hit:
            return {"free_threaded": False, "basis": hit}
    return {"free_threaded": None, "basis": exe or "unknown"}


def _fractions(seconds: dict[str, float], total: float, cats: tuple[str, ...]) -> dict[str, float]:
    return {c: round(seconds.get(c, 0.0) / total, 4) if total > 0 else 0.0 for c in cats}


MODULE_SITES = 8


def _loaders(by_loader: dict[tuple[str, str], dict[str, Any]], trains: set[tuple[str, str]],
             total: float) -> list[dict[str, Any]]:
    """The DataLoaders the thread waited on or loaded from, by the frame iterating each, with their
    shares of the thread's time; `trains`: that frame's function also runs backward or the optimizer
    (the training loop's loader, not an evaluation pass's). None when no loader's function was seen
    training (a framework's fetcher serves every loop: no split is claimed)."""
    if not total:
        return []
    rows = []
    any_trains = any(k in trains for k in by_loader)
    for key, v in sorted(by_loader.items(), key=lambda kv: -(kv[1]["data_wait"] + kv[1]["data_load"])):
        rows.append({"site": v["label"], "data_wait": round(v["data_wait"] / total, 4),
                     "data_load": round(v["data_load"] / total, 4), "startup_seconds": round(v["startup"], 4),
                     "starts": v.get("starts", 0), "first_wait": round(v.get("first_wait", 0.0) / total, 4),
                     "passes": v.get("passes", 0),
                     "trains": (key in trains) if any_trains else None})
    return rows[:MODULE_SITES]


def _module_sites(by_site: dict[str, float], total: float) -> list[dict[str, Any]]:
    """Where the loop calls its modules from (the caller of the outermost nn.Module call, forward
    time only), hottest first: share of the thread's time under each call site."""
    if not total:
        return []
    rows = sorted(by_site.items(), key=lambda kv: -kv[1])[:MODULE_SITES]
    return [{"site": k, "fraction": round(v / total, 4)} for k, v in rows]


def _top_stacks(spans_by_stack: dict[tuple, float], total: float, n: int = 5) -> list[dict[str, Any]]:
    top = sorted(spans_by_stack.items(), key=lambda kv: -kv[1])[:n]
    return [{"stack": [f.label() for f in st[-6:]], "fraction": round(s / total, 4) if total else 0.0}
            for st, s in top]


def allocate_waits(shares: dict[str, float], cpu: float, run_delay: float,
                   others_gil: float | None) -> dict[str, float]:
    """Pure: the training thread's off-CPU time as shares of the window, by what it waited for.

    `shares` are its samples' frame kinds (pystacks.FRAME_KINDS, summing to 1); `cpu` and
    `run_delay` the shares of the window it ran on a CPU and waited for one (the OS's counters);
    `others_gil` the share of the window other threads of its process held the GIL (py-spy --gil),
    or None when that was not measured. The off-CPU share 1 - cpu - run_delay goes first to the
    frames that block by nature (the DataLoader, copies, syncs, collectives, I/O, deliberate waits,
    each at most its share of samples); what is left was spent off-CPU in Python, torch or native
    code. Of that, a GIL wait is only what other threads were seen holding the GIL (a thread can
    wait for the GIL only while another holds it); none at all without that measure. The rest is
    native waits (autograd's engine, a future) up to their share of samples, then unexplained.
    """
    off = max(0.0, 1.0 - cpu - run_delay)
    blocking = sum(shares.get(k, 0.0) for k in pystacks.BLOCKING_KINDS)
    scale = min(1.0, off / blocking) if blocking > 0 else 0.0
    out = {k: 0.0 for k in pystacks.WAIT_KEYS}
    for k in pystacks.BLOCKING_KINDS:
        out[k] = shares.get(k, 0.0) * scale
    rest = max(0.0, off - blocking * scale)
    gil = min(rest, max(others_gil, 0.0)) if others_gil is not None else 0.0
    out["gil"] = gil
    left = rest - gil
    out["native_other"] = min(left, shares.get("native", 0.0))
    out["unexplained"] = max(0.0, left - out["native_other"])
    return {k: round(v, 4) for k, v in out.items()}


def _ownership(gil_doc: dict[str, Any] | None, meta: dict[str, Any]) -> tuple[dict[str, Any], dict[int, float]]:
    """The GIL evidence and tid -> share of the sampler's samples in which that thread held the GIL."""
    g = meta.get("gil") or {}
    build = meta.get("python_build") or {}
    rate, secs = float(g.get("rate_hz") or 0.0), g.get("seconds")
    out: dict[str, Any] = {"measured": False, "reason": g.get("reason"), "free_threaded": build.get("free_threaded"),
                           "rate_hz": rate or None, "seconds": secs, "samples": 0, "held_share": None,
                           "training_thread_share": None, "others_share": None, "threads": []}
    if gil_doc is None or not rate or not secs:
        if not out["reason"]:
            out["reason"] = ("this capture has no GIL ownership samples (recorded before the GIL sampler)"
                             if not g else "py-spy --gil gave no samples")
        return out, {}
    n = max(1, int(round(rate * float(secs))))
    holders = pystacks.read_gil_speedscope(gil_doc)
    shares: dict[int, float] = {}
    rows = []
    for h in sorted(holders, key=lambda h: -h.samples):
        share = min(1.0, h.samples / n)
        if h.tid is not None:
            shares[h.tid] = shares.get(h.tid, 0.0) + share
        top = max(h.leaves.items(), key=lambda kv: kv[1])[0] if h.leaves else None
        # the source files on its stacks (the package a thread belongs to: a progress bar's refresh
        # thread shows rich's and its framework's files), the most sampled first
        files = [f for f, _ in sorted(h.files.items(), key=lambda kv: -kv[1])][:HOLDER_FILES]
        rows.append({"tid": h.tid, "name": h.name, "samples": h.samples, "share": round(share, 4), "frame": top,
                     "files": files})
    out.update({"measured": True, "reason": None, "samples": n, "threads": rows,
                "held_share": round(min(1.0, sum(h.samples for h in holders) / n), 4)})
    return out, shares


def _starting_workers(stack) -> bool:
    """The loop is starting a DataLoader's workers (the iterator's __init__: queues, locks, forks, the
    queues' feeder threads), not drawing the epoch's first indices from the sampler inside it: that
    happens at every epoch's start with persistent workers too (Lightning's GAN template: 0.10 s of a
    0.46 s start was RandomSampler's permutation of 60,000 indices)."""
    names = [f.name for f in stack]
    return (any(n.endswith("_MultiProcessingDataLoaderIter.__init__") for n in names)
            and not any(n.endswith("DataLoaderIter._next_index") for n in names))


def analyse(traces: list[pystacks.ThreadTrace], source: dict[str, str], meta: dict[str, Any],
            gil_doc: dict[str, Any] | None = None, tasks: dict[str, Any] | None = None) -> dict[str, Any]:
    """Pure: thread traces -> the py-spy evidence (training thread breakdown, workers, timeline),
    with the GIL sampler's holders and the training process's per-thread CPU time when captured.

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
    # A child is a rank only when it trains itself (forward, backward, optimizer, data, syncs,
    # collectives): a helper subprocess the loop talks to (a pipe server, a tokenizer) is not, and
    # a loop that spends most of its step blocked on one is not a launcher.
    rank_views = [v for v in (_trainer_view(p, by_pid, traces, worker_pids, source, launch, single=False)
                              for p in rank_pids) if v is not None and _training_share(v) >= RANK_TRAINING_SHARE]
    gil, held = _ownership(gil_doc, meta)
    cpu, _win = procfs.thread_cpu_shares(tasks)
    out: dict[str, Any] = {
        "pid": main_pid, "rate_hz": meta.get("rate_hz"), "nonblocking": meta.get("nonblocking", True),
        "anchor_unix": launch, "threads_seen": len(traces), "processes_seen": sorted(by_pid), "gil": gil,
    }
    main_view = _trainer_view(main_pid, by_pid, traces, worker_pids, source, launch, single=not rank_views,
                              gil=gil, held=held, cpu=cpu)
    launcher = bool(rank_views) and (main_view is None or _training_share(main_view) < RANK_TRAINING_SHARE)
    if rank_views:
        out["ranks"] = rank_views
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
                  worker_pids: set[int], source: dict[str, str], launch: float, single: bool,
                  gil: dict[str, Any] | None = None, held: dict[int, float] | None = None,
                  cpu: dict[int, tuple[float, float | None]] | None = None) -> dict[str, Any] | None:
    """The training thread of one process (the target, or one rank), its other threads and workers.
    `gil`, `held` and `cpu` (the GIL sampler's and the per-thread CPU time) are the target's: given
    for the target's own view only."""
    own = by_pid.get(pid, [])
    training = _pick_training_thread(own)
    if training is None:
        return None
    held, cpu = held or {}, cpu or {}
    by_cat: dict[str, float] = defaultdict(float)
    by_kind: dict[str, float] = defaultdict(float)
    by_stack: dict[str, dict[tuple, float]] = defaultdict(lambda: defaultdict(float))
    by_site: dict[str, float] = defaultdict(float)
    by_break: dict[str, float] = defaultdict(float)
    by_loader: dict[tuple[str, str], dict[str, Any]] = {}
    trains: set[tuple[str, str]] = set()     # frames of the samples in backward or the optimizer
    last_site, site_runs, site_switches = None, 0, 0
    timeline: list[list[Any]] = []
    worker_startup = 0.0
    in_closure = 0.0                         # forward/backward seconds inside an optimizer's step (closure)
    started: tuple[str, str] | None = None   # the loader whose workers the loop last started
    last_loader: tuple[str, str] | None = None   # the loader of the thread's last data sample
    # The loop loads its own batches (a complete sample in a single-process DataLoader's fetch): its
    # truncated samples in loading code are loading too (pystacks.truncated).
    cats = [pystacks.classify_training(sp.stack, source) for sp in training.spans]
    cut = [pystacks.truncated(sp.stack) for sp in training.spans]
    in_loop = any(c == "data_load" and not t for c, t in zip(cats, cut))
    truncated_s = truncated_load_s = distributed_s = 0.0
    for sp, cat, is_cut in zip(training.spans, cats, cut):
        if pystacks.in_distributed(sp.stack):
            distributed_s += sp.seconds
        by_kind[pystacks.classify_wait(sp.stack, source, cat)] += sp.seconds
        if is_cut:
            truncated_s += sp.seconds
            if in_loop and cat != "data_load" and pystacks.loading_code(sp.stack):
                cat = "data_load"
                truncated_load_s += sp.seconds
        by_cat[cat] += sp.seconds
        if not is_cut:                           # the hottest stacks are whole ones, with their callers
            by_stack[cat][sp.stack] += sp.seconds
        if cat in ("data_wait", "data_load"):
            site = pystacks.loader_site(sp.stack)
            if site is not None:
                key = (site.name, site.filename)
                by_loader.setdefault(key, {"label": site.label(), "data_wait": 0.0, "data_load": 0.0,
                                           "startup": 0.0, "first_wait": 0.0, "starts": 0, "passes": 0})
                by_loader[key][cat] += sp.seconds
                # a pass: a run of the thread's data samples at this loader, between samples at another
                by_loader[key]["passes"] += last_loader != key
                last_loader = key
                if _starting_workers(sp.stack):
                    by_loader[key]["startup"] += sp.seconds
                    by_loader[key]["starts"] += started != key
                    started = key
                elif cat == "data_wait" and started == key:
                    # the wait for the first batch of workers just started: each builds a batch from
                    # its first index on, however many there are
                    by_loader[key]["first_wait"] += sp.seconds
        else:
            started = None
        if cat in ("backward", "optimizer"):
            trains.update((f.name, f.filename) for f in sp.stack)
        if cat in ("forward", "backward") and pystacks.in_optimizer_step(sp.stack):
            in_closure += sp.seconds
        brk = pystacks.graph_break_module(sp.stack)
        if brk is not None:
            by_break[brk] += sp.seconds
        if cat == "forward":
            site = pystacks.module_call_site(sp.stack)
            if site is not None:
                by_site[site] += sp.seconds
                site_runs += 1
                site_switches += last_site is not None and site != last_site
                last_site = site
        if _starting_workers(sp.stack):
            worker_startup += sp.seconds
        if timeline and timeline[-1][2] == cat and abs(timeline[-1][1] - sp.t0) < 1e-6:
            timeline[-1][1] = sp.t1
        else:
            timeline.append([sp.t0, sp.t1, cat])
    total = sum(by_cat.values())
    model_s = by_cat["forward"] + by_cat["backward"]
    busy = sum(sp.seconds for sp in training.spans if not pystacks.is_idle_stack(sp.stack))
    tt: dict[str, Any] = {
        "pid": training.pid, "tid": training.os_tid, "name": training.name,
        "seconds": round(total, 3), "busy_fraction": round(busy / total, 4) if total else 0.0,
        "breakdown": _fractions(by_cat, total, pystacks.TRAIN_CATEGORIES),
        "seconds_by_category": {c: round(by_cat.get(c, 0.0), 4) for c in pystacks.TRAIN_CATEGORIES},
        "top_stacks": {c: _top_stacks(by_stack[c], total) for c in by_stack},
        "worker_startup_seconds": round(worker_startup, 4),
        "module_call_sites": _module_sites(by_site, total),
        # successive samples under a module call, and how often the calling site changed between
        # them: a step that calls its modules from several places alternates them all the time (a
        # GAN), a periodic evaluation or sampling phase changes site twice
        "module_call_samples": site_runs, "module_site_switches": site_switches,
        # the thread's share inside torch modules dynamo graph-breaks in by default (by kind)
        "graph_break_modules": {k: round(v / total, 4) for k, v in sorted(by_break.items())} if total else {},
        # the share of the forward/backward samples that ran inside an optimizer's step: the model
        # runs in the optimizer's closure (Lightning's automatic optimization, LBFGS)
        "model_in_optimizer_step": round(in_closure / model_s, 4) if model_s > 0 else None,
        "loaders": _loaders(by_loader, trains, total),
        "data_transitions": _count_entries(timeline, ("data_wait", "data_load")),
        "observed_from": round(training.spans[0].t0, 4), "observed_to": round(training.spans[-1].t1, 4),
        # samples py-spy read only in part (its nonblocking reads), and those counted as the loop's loading
        "truncated_fraction": round(truncated_s / total, 4) if total else 0.0,
        "truncated_loading_fraction": round(truncated_load_s / total, 4) if total else 0.0,
        # samples inside torch.distributed or a data-parallel wrapper (DDP, FSDP): ranks that step together
        "distributed_fraction": round(distributed_s / total, 4) if total else 0.0,
    }
    shares = _fractions(by_kind, total, pystacks.FRAME_KINDS)
    c, rq = cpu.get(training.os_tid, (None, None)) if training.os_tid is not None else (None, None)
    measured = bool(gil and gil.get("measured"))
    others = round(sum(v for t, v in held.items() if t != training.os_tid), 4) if measured else None
    if measured and gil is not None:
        gil["training_thread_share"] = round(held.get(training.os_tid, 0.0), 4) if training.os_tid else None
        gil["others_share"] = min(others or 0.0, 1.0)
    tt.update({"frame_kinds": shares, "cpu_fraction": None if c is None else round(c, 4),
               "run_delay_fraction": None if rq is None else round(rq, 4),
               "gil_held_share": round(held.get(training.os_tid, 0.0), 4) if measured and training.os_tid else None,
               "waits": allocate_waits(shares, c, rq or 0.0, others) if c is not None else None})
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
        oc, orq = cpu.get(t.os_tid, (None, None)) if t.os_tid is not None else (None, None)
        others.append({"tid": t.os_tid, "name": t.name, "seconds": round(t.seconds, 3),
                       "busy_fraction": round(b / t.seconds, 4) if t.seconds else 0.0,
                       "active_fraction": None if oc is None else round(min(1.0, oc + (orq or 0.0)), 4),
                       "gil_share": (round(held.get(t.os_tid, 0.0), 4) if t.os_tid is not None else None)
                       if measured else None,
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
