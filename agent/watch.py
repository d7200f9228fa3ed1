"""`trainprobe watch`: the always-on, low-cost follower of every training process on a node.

Every `interval` seconds it samples /proc (and NVML when there is a driver) for each training
process tree (probes.support.watchsample), exports the numbers through prometheus_client, and checks a
trigger condition per job. When the condition has held for `hold_s` seconds it runs one full
`diagnose` on that job in a background thread and keeps the bundle (rotated under a count and a
disk cap). A cooldown keeps one job from being diagnosed over and over.

Trigger conditions (a real condition each; GPU busy is the one that matters on a GPU node):
    gpu-busy<X    the job's GPUs (NVML) busy less than X
    loop-wait>X   the training thread off-CPU and not runnable more than X (waiting for batches,
                  collectives or the GPU)
    loop-cpu<X    the training thread on-CPU less than X
"""
from __future__ import annotations

import os
import re
import resource
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from trainprobe.probes.parsers import envvars
from trainprobe.probes.support.watchsample import Discovery, GpuSampler, ThreadSample, Tree, rates, sample_trainer

TRIGGER = re.compile(r"^(gpu-busy|loop-wait|loop-cpu)([<>])([0-9.]+)$")


def parse_trigger(text: str) -> tuple[str, str, float]:
    m = TRIGGER.match(text.replace(" ", ""))
    if not m:
        raise ValueError(f"{text!r}: a trigger is gpu-busy<X, loop-wait>X or loop-cpu<X (X a share, 0..1)")
    metric, op, x = m.group(1), m.group(2), float(m.group(3))
    if (metric == "loop-wait") != (op == ">") or not 0.0 <= x <= 1.0:
        raise ValueError(f"{text!r}: a trigger is gpu-busy<X, loop-wait>X or loop-cpu<X, X in 0..1")
    return metric, op, x


@dataclass
class JobState:
    tree: Tree
    last: dict[int, ThreadSample] = field(default_factory=dict)
    now: dict[int, dict[str, Any]] = field(default_factory=dict)     # trainer pid -> rates()
    gpu: dict[int, float | None] = field(default_factory=dict)        # gpu index -> busy share
    held_since: float | None = None
    diagnoses: int = 0
    last_diag_t: float | None = None
    last_diag_unix: float | None = None
    last_finding: str | None = None
    last_speedup: float | None = None
    last_bundle: str | None = None
    last_error: str | None = None


def rotate(bundle_dir: str, keep: int, max_bytes: int) -> list[str]:
    """Delete the oldest bundles beyond `keep` files or `max_bytes` in all. Returns what it removed."""
    # lstat: a link or a vanished file planted among the bundles is counted as itself (or skipped),
    # never followed.
    found = []
    try:
        names = [f for f in os.listdir(bundle_dir) if f.startswith("trainprobe-") and f.endswith(".tar.gz")]
    except OSError:
        return []
    for f in names:
        try:
            st = os.lstat(os.path.join(bundle_dir, f))
        except OSError:
            continue
        found.append((st.st_mtime, st.st_size, os.path.join(bundle_dir, f)))
    found.sort()
    removed = []
    total = sum(size for _t, size, _p in found)
    while found and (len(found) > keep or total > max_bytes):
        _t, size, p = found.pop(0)
        total -= size
        try:
            os.unlink(p)
        except OSError:
            continue
        removed.append(p)
    return removed


def bundle_name(stamp: str, job: str, pid: int) -> str:
    """A bundle's file name. The job id comes from the target's environment: only a safe token of it
    (no "/", no "..", bounded) goes into the name."""
    job_part = f"-job{envvars.token(job, max_len=32)}" if job else ""
    return f"trainprobe-{stamp}{job_part}-pid{int(pid)}.tar.gz"


class Watcher:
    def __init__(self, interval_s: float = 5.0, trigger: str = "gpu-busy<0.5", hold_s: float = 300.0,
                 diagnose_s: float = 10.0, cooldown_s: float = 1800.0, bundle_dir: str | None = None,
                 keep: int = 20, max_disk_mb: float = 500.0, rescan_s: float = 30.0, only: set[int] | None = None,
                 root: str = "/", progress: Callable[[str], None] = lambda m: None, diagnose: bool = True):
        self.interval_s, self.hold_s, self.diagnose_s, self.cooldown_s = interval_s, hold_s, diagnose_s, cooldown_s
        self.trigger = parse_trigger(trigger)
        self.bundle_dir, self.keep, self.max_bytes = bundle_dir, keep, int(max_disk_mb * 1024 * 1024)
        self.rescan_s, self.only, self.root, self.progress = rescan_s, only, root, progress
        self.diagnose_enabled = diagnose
        self.discovery = Discovery(root)
        self.gpus = GpuSampler()
        self.jobs: dict[int, JobState] = {}
        self.gpu_now: dict[int, dict[str, Any]] = {}
        self.lock = threading.Lock()
        self.busy = threading.Event()            # a diagnosis is running
        self._last_scan = 0.0
        self.samples = 0

    # -- sampling ---------------------------------------------------------------------------------
    def step(self) -> None:
        now = time.monotonic()
        if now - self._last_scan >= self.rescan_s or not self.jobs:
            trees = self.discovery.scan(self.only)
            self._last_scan = now
            with self.lock:
                fresh = {}
                for t in trees:
                    st = self.jobs.get(t.root) or JobState(t)
                    st.tree = t
                    fresh[t.root] = st
                self.jobs = fresh
        gpu = self.gpus.sample()
        with self.lock:
            self.gpu_now = gpu
            for st in self.jobs.values():
                for pid in st.tree.trainers:
                    s = sample_trainer(st.tree, pid, self.root)
                    if s is None:
                        continue
                    if pid in st.last:
                        st.now[pid] = rates(st.last[pid], s)
                    st.last[pid] = s
                st.gpu = {i: g["busy_share"] for i, g in gpu.items()
                          if set(g["pids"]) & ({st.tree.root} | set(st.tree.trainers))}
            self.samples += 1
        self._check_triggers(now)

    def condition(self, st: JobState) -> bool | None:
        """Whether the job meets the trigger now; None when it cannot be told (no such metric)."""
        metric, _op, x = self.trigger
        if metric == "gpu-busy":
            vals = [v for v in st.gpu.values() if v is not None]
            return (sum(vals) / len(vals) < x) if vals else None
        key = "loop_wait_share" if metric == "loop-wait" else "loop_cpu_share"
        vals = [r[key] for r in st.now.values() if r.get(key) is not None]
        if not vals:
            return None
        # The job steps at its slowest trainer's pace: one trainer meeting the condition is enough.
        return max(vals) > x if metric == "loop-wait" else min(vals) < x

    def _check_triggers(self, now: float) -> None:
        for st in list(self.jobs.values()):
            cond = self.condition(st)
            if not cond:
                st.held_since = None
                continue
            st.held_since = st.held_since or now
            cooled = st.last_diag_t is None or now - st.last_diag_t >= self.cooldown_s
            if (self.diagnose_enabled and now - st.held_since >= self.hold_s and cooled
                    and not self.busy.is_set()):
                self.busy.set()
                st.last_diag_t = now
                threading.Thread(target=self._diagnose, args=(st,), daemon=True, name="watch-diagnose").start()

    # -- diagnosis ----------------------------------------------------------------------------------
    def _diagnose(self, st: JobState) -> None:
        from trainprobe.agent import bundle, diagnosis
        from trainprobe.agent.target import UserError
        from trainprobe.reports import output
        pid = st.tree.root
        metric, op, x = self.trigger
        self.progress(f"PID {pid}: {metric}{op}{x:g} held for {self.hold_s:g} s: running a {self.diagnose_s:g} s diagnosis")
        try:
            d = diagnosis.run(pid, duration_s=self.diagnose_s, root=self.root, progress=self.progress)
            f = d.report["findings"][0] if d.report["findings"] else None
            path = None
            if self.bundle_dir:
                output.make_dir(self.bundle_dir, parents=True)
                stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
                path = os.path.join(self.bundle_dir, bundle_name(stamp, st.tree.job, pid))
                bundle.save(path, d.captures, d.context, d.report)
                for old in rotate(self.bundle_dir, self.keep, self.max_bytes):
                    self.progress(f"rotated out {old}")
            with self.lock:
                st.diagnoses += 1
                st.last_diag_unix = time.time()
                st.last_finding = f["id"] if f else "none"
                st.last_speedup = f["expected_speedup"] if f else 1.0
                st.last_bundle = path
                st.last_error = None
            self.progress(f"PID {pid}: {st.last_finding} ({st.last_speedup}x)" + (f"; bundle {path}" if path else ""))
        except (UserError, bundle.BundleError, OSError) as exc:
            with self.lock:
                st.last_error = str(exc)
            self.progress(f"PID {pid}: diagnosis failed: {exc}")
        finally:
            self.busy.clear()

    # -- the run loop -------------------------------------------------------------------------------
    def run(self, stop: threading.Event, on_sample: Callable[[], None] | None = None) -> None:
        while not stop.is_set():
            t0 = time.monotonic()
            self.step()
            if on_sample:
                on_sample()
            stop.wait(max(0.0, self.interval_s - (time.monotonic() - t0)))


def agent_cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def snapshot(w: Watcher) -> dict[str, Any]:
    """The watch document the exporter renders: plain data, taken under the lock."""
    with w.lock:
        jobs = []
        for st in w.jobs.values():
            jobs.append({
                "root": st.tree.root, "job": envvars.token(st.tree.job, max_len=32, fallback="") if st.tree.job else "",
                "cmdline": st.tree.cmdline[:200],
                "trainers": [{"pid": p, **st.now.get(p, {})} for p in st.tree.trainers],
                "gpus": dict(st.gpu),
                "condition": w.condition(st),
                "condition_held_s": (time.monotonic() - st.held_since) if st.held_since else 0.0,
                "diagnoses": st.diagnoses, "last_diagnosis_unix": st.last_diag_unix,
                "last_finding": st.last_finding, "last_expected_speedup": st.last_speedup,
                "last_bundle": st.last_bundle, "last_error": st.last_error,
            })
        metric, op, x = w.trigger
        return {"jobs": jobs, "gpus": {i: g["busy_share"] for i, g in w.gpu_now.items()},
                "gpu_error": w.gpus.error, "samples": w.samples, "agent_cpu_seconds": agent_cpu_seconds(),
                "trigger": f"{metric}{op}{x:g}", "hold_s": w.hold_s, "diagnosing": w.busy.is_set()}
