"""Process probe: the target's process tree, its threads and their CPU over the window.

Through psutil, for the target and its descendants: parent, state, thread count, CPU times, CPU
affinity, resident memory and command line, and each thread's CPU times. From /proc, what psutil
lacks: each thread's name, state, context switches and last CPU (/proc/PID/task/TID/{stat,status})
and run-queue delay (schedstat), Mems_allowed_list, the cgroup, the mapped libraries, and the
kernel's child lists (procfs.descendants_of). Read once at the start and once at the end of the
window; the descendants are listed every 0.5 s in between to see DataLoader workers come and go. Of a process
environment it reads only CUDA_VISIBLE_DEVICES and LOCAL_RANK. Cost: a few hundred small file
reads; no signal, no ptrace, nothing attached.
"""
from __future__ import annotations

import json
import os
import re
import time
from typing import Any

import psutil

from trainprobe.probes.parsers import procfs
from trainprobe.probes.base import (Availability, Capture, JobShape, Probe, ProbeCost, Recorder, WatchSpec,
                                    target_exists)
from trainprobe.probes.schema import ProcessEvidence
from trainprobe.probes.support import oncpu as oncpu_mod
from trainprobe.probes.support import stepcount
from trainprobe.probes.support import ranks
from trainprobe.probes.errors import ProbeError, TargetGone

# Shared objects whose presence says what the process is.
LIB_MARKERS = ("libtorch", "libcuda.so", "libcudart", "libnccl", "libpython", "libgomp", "libiomp")


def _snapshot_process(root: str, pid: int) -> dict[str, Any] | None:
    """One process's facts (psutil) and its threads' raw task files (what psutil lacks): every
    thread of a process with at most procfs.MAX_THREADS_READ, else the main thread and the lowest
    ids up to that many (the process's CPU time still counts them all)."""
    base = f"proc/{pid}"
    tids, n_tasks = procfs.task_ids(root, pid)
    try:
        proc = procfs.process(pid, root)
        with procfs.ps_errors(f"process {pid}"), proc.oneshot():
            times = proc.cpu_times()
            ps: dict[str, Any] = {
                "ppid": proc.ppid(), "comm": proc.name(), "state": procfs.state_letter(proc.status()),
                "num_threads": proc.num_threads(), "user_s": times.user, "system_s": times.system,
                # CPU of its children that exited and were reaped (the kernel's cutime + cstime):
                # DataLoader workers re-created every epoch live between the probe's readings
                "children_s": times.children_user + times.children_system,
                "cpus_allowed": procfs.format_cpulist(proc.cpu_affinity()),
                "rss_bytes": proc.memory_info().rss,
            }
            try:
                # When it started (unix time): a worker gone inside the window lived from its start
                # to its join, its epoch's length (a window shorter than an epoch sees one start)
                ps["create_time"] = round(proc.create_time(), 3)
            except (psutil.Error, OSError):
                pass
            # psutil reads every thread's stat; past the cap, the stat files read below give the
            # CPU times of the threads kept.
            if n_tasks <= procfs.MAX_THREADS_READ:
                ps["threads"] = {str(t.id): [t.user_time, t.system_time] for t in proc.threads()}
                tids = sorted(set(tids) | set(ps["threads"]), key=int)
            try:
                ps["argv"] = procfs.bounded_argv(proc.cmdline())
            except psutil.ZombieProcess:
                ps["argv"] = []
            ps["cmdline"] = " ".join(ps["argv"])
    except ProbeError:  # the process exited between listing and reading
        return None
    # Mems_allowed_list is not in psutil.
    status = procfs.parse_status(procfs.try_read_text(root, f"{base}/status") or "")
    ps["mems_allowed"] = status.get("Mems_allowed_list")
    if n_tasks > len(tids):
        ps["threads_not_read"] = n_tasks - len(tids)
    tasks: dict[str, dict[str, str | None]] = {}
    for tid in tids:
        tstat = procfs.try_read_text(root, f"{base}/task/{tid}/stat")
        if tstat is None:
            continue
        tasks[tid] = {
            "stat": tstat,
            "status": _ctxsw_lines(procfs.try_read_text(root, f"{base}/task/{tid}/status")),
            "schedstat": procfs.try_read_text(root, f"{base}/task/{tid}/schedstat"),
        }
    return {"ps": ps, "cmdline": ps["cmdline"], "argv": ps["argv"], "tasks": tasks}


class _Followed:
    """The job's processes a window follows: the first `limit` seen (the target first), so that a job
    forking short-lived children without end costs a bounded number of reads. The others are counted."""

    def __init__(self, limit: int):
        self.limit = limit
        self.pids: set[int] = set()
        self._others: set[int] = set()
        self.comms: dict[str, str] = {}

    def keep(self, tree: list[tuple[int, int]]) -> list[tuple[int, int]]:
        out = []
        for p, pp in tree:
            if p in self.pids or len(self.pids) < self.limit:
                self.pids.add(p)
                out.append((p, pp))
            elif len(self._others) < 1 << 20:
                self._others.add(p)
        return out

    def row(self, t_unix: float, kept: list[tuple[int, int]], root: str | None = None,
            target: int | None = None) -> dict[str, Any]:
        """One listing of the tree; with `root`, also each child's CPU seconds so far (one read of its
        stat): a worker that exits inside the window then still shows the CPU it spent in it, where
        the start and end snapshots alone would show none (or, seen only at the start, the CPU of its
        whole life)."""
        row: dict[str, Any] = {"t_unix": t_unix, "pids": [p for p, _ in kept]}
        if root is not None:
            cpu: dict[str, float] = {}
            for p, _ in kept:
                if p == target:
                    continue
                text = procfs.try_read_text(root, f"proc/{p}/stat")
                if not text or ")" not in text:
                    continue
                try:
                    st = procfs.parse_stat(text)
                except (ValueError, IndexError):
                    continue
                cpu[str(p)] = round(st["utime_s"] + st["stime_s"], 2)
                self.comms[str(p)] = st["comm"]   # the latest: a worker names itself after it starts
            row["cpu"] = cpu
        return row

    @property
    def not_followed(self) -> int:
        return len(self._others)


_CTXSW_KEYS = ("voluntary_ctxt_switches:", "nonvoluntary_ctxt_switches:")


def _ctxsw_lines(status: str | None) -> str | None:
    """Of a thread's status file, only the lines the parser reads (its context switches): the rest
    (1.3 kB a thread, its name included) is in its stat line or not used, and a process of many
    threads would otherwise store, and redact, megabytes of it."""
    if status is None:
        return None
    return "".join(ln + "\n" for ln in status.splitlines() if ln.startswith(_CTXSW_KEYS))


def _environ(root: str, pid: int) -> dict[str, str]:
    try:
        return procfs.parse_environ_whitelist(procfs.read_bytes(root, f"proc/{pid}/environ"))
    except Exception:  # noqa: BLE001 - unreadable environ: the variables are simply unknown
        return {}


def _libraries(root: str, pid: int, text: str | None = None) -> list[str]:
    text = text if text is not None else (procfs.try_read_text(root, f"proc/{pid}/maps") or "")
    return [lib for lib in procfs.parse_maps_libraries(text) if any(m in lib for m in LIB_MARKERS)]


def _start_oncpu(spec: WatchSpec, snap0: dict[str, Any], maps: str) -> "oncpu_mod.Sampler | None":
    """Sample the training process's threads' CPU by library where it maps an OpenMP runtime (its
    intra-op threads' spinning is what the thread model needs); None where it maps none."""
    if not oncpu_mod.openmp_ranges(maps) or spec.root not in ("", "/"):
        return None
    tids = sorted(int(t) for t in (snap0["procs"].get(str(spec.pid)) or {}).get("tasks", {}))
    try:
        return oncpu_mod.start(tids, maps, spec.window_s)
    except OSError as e:   # the library call itself failed: the samples are simply not taken
        return oncpu_mod.Sampler(reason=f"perf_event_open failed ({e})")


MAX_RANKS_SAMPLED = 8


def _rank_children(spec: WatchSpec, tree0: list[tuple[int, int]], env: dict[str, dict[str, str]],
                   torch_v: str | None) -> list[int]:
    """The target's children that are ranks: LOCAL_RANK (torchrun), or training processes the job
    started through multiprocessing's spawn (probes/support/ranks.py)."""
    mine = "LOCAL_RANK" in env.get(str(spec.pid), {})
    return [p for p, pp in tree0 if pp == spec.pid and p != spec.pid and (
        ("LOCAL_RANK" in env.get(str(p), {}) and not mine) or ranks.child_is_spawned_trainer(p, spec.root, torch_v))]


def _start_rank_oncpu(spec: WatchSpec, snap0: dict[str, Any], rank_pids: list[int],
                      rank_maps: dict[int, str]) -> list["oncpu_mod.Sampler"]:
    """CPU-clock samplers of the target's ranks that map an OpenMP runtime, each with its own maps
    (cpu.oversubscribed prices a cap across ranks from them)."""
    if spec.root not in ("", "/") or not rank_pids:
        return []
    found = rank_pids[:MAX_RANKS_SAMPLED]
    # one event per thread, oncpu.MAX_THREADS over all the ranks: each rank's lowest thread ids (its
    # main thread, then the intra-op team its first parallel op started)
    per_rank = max(4, oncpu_mod.MAX_THREADS // len(found))
    out = []
    for p in found:
        maps = rank_maps.get(p, "")
        tids = sorted(int(t) for t in (snap0["procs"].get(str(p)) or {}).get("tasks", {}))[:per_rank]
        if not tids or not oncpu_mod.openmp_ranges(maps):
            continue
        try:
            s = oncpu_mod.start(tids, maps, spec.window_s)
        except OSError:
            continue
        if s.reason:
            s.close()
            continue
        out.append(s)
    return out


def _merge_rank_oncpu(oncpu: dict[str, Any] | None, samplers: list["oncpu_mod.Sampler"]) -> dict[str, Any] | None:
    """The ranks' samples joined to the target's (thread ids are the host's: they do not collide)."""
    for rs in samplers:
        got = oncpu_mod.read(rs)
        if oncpu is None:
            oncpu = got
        else:
            oncpu["threads"].update(got["threads"])
            oncpu["lost"] += got["lost"]
    return oncpu


def _start_rank_stepcount(spec: WatchSpec, rank_pids: list[int],
                          rank_maps: dict[int, str]) -> dict[int, "stepcount.Counter"]:
    """Count each rank's backward passes on its main thread, where DDP's ranks (torchrun's, mp.spawn's,
    Lightning's) call backward: one event a rank, so a launcher's step length costs what the target's
    own count does, not an event per thread of every rank."""
    if spec.root not in ("", "/") or not rank_pids:
        return {}
    out: dict[int, stepcount.Counter] = {}
    for p in rank_pids[:MAX_RANKS_SAMPLED]:
        maps = rank_maps.get(p, "")
        if stepcount.library_path(maps) is None:
            continue
        try:
            c = stepcount.start([p], maps, p)
        except Exception:  # noqa: BLE001 - a rank gone or unreadable: its step stays untimed, the rest count
            continue
        if c.reason:
            c.close()
            continue
        out[p] = c
    return out


def _start_stepcount(spec: WatchSpec, snap0: dict[str, Any], maps: str) -> "stepcount.Counter | None":
    """Count the training process's backward passes where it maps torch (the step's length); None
    where it maps no torch."""
    if stepcount.library_path(maps) is None or spec.root not in ("", "/"):
        return None
    tids = sorted(int(t) for t in (snap0["procs"].get(str(spec.pid)) or {}).get("tasks", {}))
    try:
        return stepcount.start(tids, maps, spec.pid)
    except OSError as e:
        return stepcount.Counter(f"perf_event_open's uprobe failed ({e})")


class ProcessProbe(Probe):
    name = "process"
    description = "process tree, threads, per-thread CPU, context switches, affinity (from /proc)"
    needs = ("/proc readable for the target",)
    cost = "negligible: two /proc snapshots and a child listing (with each child's CPU) every 0.5 s"
    timeout_s = 10.0
    evidence_schema = ProcessEvidence
    # Measured per 10 s window, capture and parse (docs/cost.md, benchmarks/gpu_cost.py on the H200
    # node): every 0.5 s it reads each thread of the job, so threads set its cost: 0.040 CPU-s for a
    # CUDA process of 34 threads, 0.071-0.106 with 14 workers; 0.020 for a 3-thread job on the 2-CPU
    # VM running 1.7x slow. The CPU-clock sampler of a torch process's threads (ctypes' import, one
    # event and buffer a thread, the samples' count at the end) adds 1-5 ms a window on the VM
    # (4 threads; tests/live/test_oncpu_samples.py's job, 3 windows each way). The backward-pass
    # counter adds 2.0-2.5 ms (finding torch's autograd engine in libtorch_cpu.so's symbol table; a
    # trap of about 1.7 us a backward pass in the job, benchmarks/bench_stepcount.py).
    # The CPU-clock sampler and the backward-pass counter open one perf event a thread of the training
    # process, read and close it: 0.5 ms a thread of the target beyond the /proc reads (the H100 node,
    # the data-heavy job without workers, 34 threads, 2026-12-06: 0.054-0.064 CPU-s a window at the
    # models' speed where the per-thread /proc term alone planned 0.040; bench_cost.py's 4-thread job
    # on the VM: within its 1-5 ms).
    cost_cpu_s_fixed = 0.0175
    cost_cpu_s_per_process = 0.001
    cost_cpu_s_per_thread = 0.00065
    cost_cpu_s_per_target_thread = 0.0005

    def check(self, spec: WatchSpec) -> Availability:
        return target_exists(spec)

    def estimate_cost(self, spec: WatchSpec, job: JobShape) -> ProbeCost:
        base = super().estimate_cost(spec, job)
        threads = max(job.threads, 1)
        # the ranks' threads get the CPU-clock sampler too (_start_rank_oncpu), up to its share of events
        ranked = list(job.ranks[:MAX_RANKS_SAMPLED])
        per = max(4, oncpu_mod.MAX_THREADS // max(len(ranked), 1))
        rank_threads = sum(min(procfs.thread_count(spec.root, r) or 0, per) for r in ranked)
        # and a backward-pass counter on each rank's main thread
        events = threads + rank_threads + len(ranked)
        return ProbeCost(base.cpu_s + self.cost_cpu_s_per_target_thread * events, base.rss_mb,
                         base.basis + f", a perf event on each of the target's {threads} threads"
                         + (f" and {rank_threads} of its ranks' (and a counter on each rank's main thread)"
                            if ranked else ""))

    def _tree(self, spec: WatchSpec) -> list[tuple[int, int]]:
        return [(spec.pid, 0)] + procfs.descendants_of(spec.pid, spec.root)

    def _snapshot(self, spec: WatchSpec, tree: list[tuple[int, int]]) -> dict[str, Any]:
        procs: dict[str, Any] = {}
        t = time.time()
        for pid, _ppid in tree:
            snap = _snapshot_process(spec.root, pid)
            if snap is not None:
                procs[str(pid)] = snap
        return {"t_unix": t, "procs": procs}

    def capture(self, spec: WatchSpec, rec: Recorder, deadline_monotonic: float) -> None:
        root = spec.root
        t0 = time.time()
        follow = _Followed(procfs.MAX_PROCESSES_FOLLOWED)
        tree0 = follow.keep(self._tree(spec))
        snap0 = self._snapshot(spec, tree0)
        if str(spec.pid) not in snap0["procs"]:
            raise TargetGone(f"process {spec.pid} exited before the window started")
        env = {str(p): _environ(root, p) for p, _ in tree0}
        parents = {str(p): pp for p, pp in tree0}
        maps = procfs.try_read_text(root, f"proc/{spec.pid}/maps") or ""
        libs = _libraries(root, spec.pid, maps)
        torch_v = ranks.torch_version(libs, root)
        rank_pids = _rank_children(spec, tree0, env, torch_v)
        # each rank's maps, read once: its libraries (ranks under a launcher load CUDA, the launcher
        # does not), and for the samplers and counters of the ranks sampled
        rank_maps: dict[int, str] = {}
        for i, p in enumerate(rank_pids):
            text = procfs.try_read_text(root, f"proc/{p}/maps") or ""
            libs = sorted(set(libs) | set(_libraries(root, p, text)))
            if i < MAX_RANKS_SAMPLED:
                rank_maps[p] = text
        exe = procfs.process_fact(spec.pid, "exe", root) or None
        cgroup = procfs.parse_cgroup_v2_path(procfs.try_read_text(root, f"proc/{spec.pid}/cgroup"))
        cpu_max = procfs.try_read_text(root, f"sys/fs/cgroup/{cgroup.lstrip('/')}/cpu.max") if cgroup else None
        sampler = _start_oncpu(spec, snap0, maps)
        # The ranks' threads too (a launcher's, or the training processes the job spawned): where a
        # rank's team spins at OpenMP barriers on CPUs its siblings share (cpu.oversubscribed)
        rank_samplers = _start_rank_oncpu(spec, snap0, rank_pids, rank_maps)
        counter = None
        rank_counters: dict[int, stepcount.Counter] = {}
        try:
            counter = _start_stepcount(spec, snap0, maps)
            rank_counters = _start_rank_stepcount(spec, rank_pids, rank_maps)
            snap1, timeline, target_exited_unix = self._watch(spec, rec, deadline_monotonic, follow, tree0, t0,
                                                              env, parents)
        finally:
            try:
                oncpu = oncpu_mod.read(sampler) if sampler is not None and not sampler.reason else None
                oncpu = _merge_rank_oncpu(oncpu, rank_samplers)
            finally:
                for rs in rank_samplers:        # closed whatever happened (read closes them too)
                    rs.close()
                backward = stepcount.read(counter) if counter is not None and not counter.reason else None
                rank_backward = {str(p): stepcount.read(c) for p, c in rank_counters.items()}
        n_threads = sum(s["ps"]["num_threads"] for s in snap0["procs"].values())
        rec.note("file", f"{root.rstrip('/')}/proc/{{{','.join(sorted(snap0['procs']))}}}/"
                 "{stat,status,cmdline,environ*,task/*/{stat,status,schedstat}}", 0, t0, time.time() - t0)
        rec.add("snapshots.json", json.dumps({
            "pid": spec.pid, "start": snap0, "end": snap1, "timeline": timeline, "parents": parents,
            "environ": env, "libraries": libs, "exe": exe, "cgroup": cgroup, "cpu_max": cpu_max,
            # which torch: from 2.4 on its DataLoader workers name themselves (probes/support/ranks.py)
            "torch_version": torch_v,
            "cpus_online": procfs.try_read_text(root, "sys/devices/system/cpu/online"),
            "target_exited_unix": target_exited_unix, "threads_at_start": n_threads,
            "processes_not_followed": follow.not_followed, "comms": follow.comms,
            **({"oncpu": oncpu} if oncpu is not None else {}),
            **({"oncpu_unavailable": sampler.reason} if sampler is not None and sampler.reason else {}),
            **({"backward": backward} if backward is not None else {}),
            **({"backward_unavailable": counter.reason} if counter is not None and counter.reason else {}),
            **({"rank_backward": rank_backward} if rank_backward else {}),
        }))
        if follow.not_followed:
            rec.capture.meta["processes_not_followed"] = follow.not_followed

    def _watch(self, spec: WatchSpec, rec: Recorder, deadline_monotonic: float, follow: "_Followed",
               tree0: list[tuple[int, int]], t0: float, env: dict[str, Any],
               parents: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]], float | None]:
        """List the tree every 0.5 s until the window ends or the target exits; the end snapshot."""
        root = spec.root
        timeline: list[dict[str, Any]] = [follow.row(t0, tree0)]
        target_exited_unix = None
        while not rec.stop.is_set() and time.monotonic() < deadline_monotonic:
            rec.stop.wait(min(0.5, max(0.0, deadline_monotonic - time.monotonic())))
            tree = follow.keep(self._tree(spec) if os.path.isdir(procfs.path(root, f"proc/{spec.pid}")) else [])
            timeline.append(follow.row(time.time(), tree, root, spec.pid))
            for p, pp in tree:
                if str(p) not in env:
                    env[str(p)] = _environ(root, p)
                    parents[str(p)] = pp
            if not tree or not procfs.is_running(root, spec.pid):
                target_exited_unix = time.time()
                break
        tree1 = follow.keep(self._tree(spec) if os.path.isdir(procfs.path(root, f"proc/{spec.pid}")) else [])
        for p, pp in tree1:
            parents.setdefault(str(p), pp)
        return self._snapshot(spec, tree1), timeline, target_exited_unix

    @staticmethod
    def parse(capture: Capture) -> ProcessEvidence:
        return parse_snapshots(json.loads(capture.artifacts["snapshots.json"]))


def _proc_facts(snap: dict[str, Any]) -> dict[str, Any]:
    """One process snapshot -> its facts: psutil's values in current captures, or the raw /proc
    text that older captures (and their bundles) hold."""
    ps = snap.get("ps")
    if ps is not None:
        rss = ps.get("rss_bytes")
        return {"ppid": ps["ppid"], "state": ps["state"], "num_threads": ps["num_threads"],
                "cpu_s": ps["user_s"] + ps["system_s"], "cpus_allowed": ps.get("cpus_allowed"),
                "mems_allowed": ps.get("mems_allowed"),
                "rss_mb": None if rss is None else round(rss / 1048576.0, 1)}
    st, status = procfs.parse_stat(snap["stat"]), procfs.parse_status(snap["status"])
    return {"ppid": st["ppid"], "state": st["state"], "num_threads": st["num_threads"],
            "cpu_s": st["utime_s"] + st["stime_s"], "cpus_allowed": status.get("Cpus_allowed_list"),
            "mems_allowed": status.get("Mems_allowed_list"), "rss_mb": _kb_to_mb(status.get("VmRSS"))}


def _task_cpu_s(snap: dict[str, Any], tid: str, st: dict[str, Any]) -> float:
    """A thread's CPU seconds: psutil's per-thread times where captured, else its stat's."""
    times = (snap.get("ps") or {}).get("threads", {}).get(tid)
    return times[0] + times[1] if times is not None else st["utime_s"] + st["stime_s"]


def _thread_rows(start: dict | None, end: dict | None, window_s: float) -> list[dict[str, Any]]:
    rows = []
    s_tasks = (start or {}).get("tasks", {})
    e_tasks = (end or {}).get("tasks", {})
    for tid in sorted(set(s_tasks) | set(e_tasks), key=int):
        s, e = s_tasks.get(tid), e_tasks.get(tid)
        ref = e or s
        st = procfs.parse_stat(ref["stat"])
        status = procfs.parse_status(ref.get("status") or "")
        cpu = _task_cpu_s((end if e else start) or {}, tid, st)
        vol = int(status.get("voluntary_ctxt_switches", 0) or 0)
        invol = int(status.get("nonvoluntary_ctxt_switches", 0) or 0)
        sched = procfs.parse_schedstat(ref.get("schedstat"))
        run_delay = sched["wait_s"] if sched else None
        if s and e:
            s_status = procfs.parse_status(s.get("status") or "")
            cpu -= _task_cpu_s(start or {}, tid, procfs.parse_stat(s["stat"]))
            vol -= int(s_status.get("voluntary_ctxt_switches", 0) or 0)
            invol -= int(s_status.get("nonvoluntary_ctxt_switches", 0) or 0)
            s_sched = procfs.parse_schedstat(s.get("schedstat"))
            if sched and s_sched:
                run_delay = sched["wait_s"] - s_sched["wait_s"]
        known = bool(e) or start is None   # a thread gone before the end shows its whole life's CPU
        if not known:
            cpu, run_delay = 0.0, None
        rows.append({
            "tid": int(tid), "name": st["comm"], "state": st["state"],
            "cpu_seconds": round(max(cpu, 0.0), 4),
            "cpu_fraction": round(max(cpu, 0.0) / window_s, 4) if window_s > 0 and known else None,
            "voluntary_ctxsw": vol, "involuntary_ctxsw": invol,
            "run_delay_seconds": None if run_delay is None else round(max(run_delay, 0.0), 6),
            "last_cpu": st["processor"], "seen": "both" if (s and e) else ("start" if s else "end"),
        })
    return rows


def parse_snapshots(d: dict[str, Any]) -> dict[str, Any]:
    """Pure: the two snapshots and the child listings -> the process evidence."""
    pid = str(d["pid"])
    start, end = d["start"], d["end"]
    t_start = start["t_unix"]
    t_end = end["t_unix"] if end["procs"] else (d.get("target_exited_unix") or end["t_unix"])
    window_s = max(t_end - t_start, 1e-6)
    cpus_online = procfs.parse_cpulist(d.get("cpus_online"))
    parents = {int(k): v for k, v in d.get("parents", {}).items()}
    environ = d.get("environ", {})
    libs = d.get("libraries", [])
    torch_v = d.get("torch_version")       # None in captures before 2026-12-07: roles as before

    main_ref = end["procs"].get(pid) or start["procs"].get(pid)
    cpus_allowed = procfs.parse_cpulist(_proc_facts(main_ref)["cpus_allowed"])
    quota = procfs.parse_cpu_max(d.get("cpu_max"))
    cpus_available = float(len(cpus_allowed) or len(cpus_online) or 1)
    if quota is not None:
        cpus_available = min(cpus_available, quota)

    all_pids = sorted({int(p) for p in start["procs"]} | {int(p) for p in end["procs"]}
                      | {p for row in d.get("timeline", []) for p in row["pids"]})
    # Each child's CPU at the listings through the window (captures from 2026-12-02 on): the last
    # reading of a process that exited inside the window.
    last_cpu: dict[str, float] = {}
    for row in d.get("timeline", []):
        for k, v in (row.get("cpu") or {}).items():
            last_cpu[k] = v
    comms = d.get("comms") or {}
    processes = []
    before_window = 0.0     # CPU the target's children gone inside the window had spent before it
    for p in all_pids:
        s, e = start["procs"].get(str(p)), end["procs"].get(str(p))
        ref = e or s
        env = environ.get(str(p), {})
        if ref is None:
            comm = comms.get(str(p), "")
            role = ("dataloader_worker" if ranks.is_worker_comm(comm)
                    else _role(p, int(pid), parents, env, "", environ=environ, comm=comm, torch=torch_v))
            row = {"pid": p, "ppid": parents.get(p), "role": role, "cmdline": "", "cpu_seconds": None,
                   "threads": [], "alive_at_end": False, "seen": "listing", "env": env}
            if str(p) in last_cpu:   # born and gone inside the window: all its CPU is the window's
                row.update(cpu_seconds=last_cpu[str(p)], cpu_cores=round(last_cpu[str(p)] / window_s, 4),
                           cpu_basis="until_exit")
            processes.append(row)
            continue
        facts = _proc_facts(ref)
        cpu: float | None = facts["cpu_s"]
        if s and not e and facts["ppid"] == int(pid):
            before_window += facts["cpu_s"]
        basis = "window" if (s and e) else "born_in_window"
        if s and e:
            cpu -= _proc_facts(s)["cpu_s"]
        elif s:
            # Gone before the end: its CPU at the start snapshot is its whole life's; what it spent in
            # the window is its last listing's reading less that, else unknown.
            basis = "until_exit" if str(p) in last_cpu else "unknown"
            cpu = last_cpu[str(p)] - facts["cpu_s"] if str(p) in last_cpu else None
        threads = _thread_rows(s, e, window_s)
        processes.append({
            "pid": p, "ppid": facts["ppid"],
            "role": _role(p, int(pid), parents, env, ref["cmdline"], main_ref["cmdline"], environ,
                          comm=comms.get(str(p)) or _comm(ref), torch=torch_v),
            "cmdline": ref["cmdline"], "argv": ref.get("argv"), "state": facts["state"], "num_threads": facts["num_threads"],
            "cpu_seconds": None if cpu is None else round(max(cpu, 0.0), 4),
            "cpu_cores": None if cpu is None else round(max(cpu, 0.0) / window_s, 4),
            "cpu_basis": basis,
            "cpus_allowed": facts["cpus_allowed"], "mems_allowed": facts["mems_allowed"],
            "rss_mb": facts["rss_mb"], "threads": threads,
            "alive_at_end": e is not None, "seen": "both" if (s and e) else ("start" if s else "end"),
            "env": env,
        })

    # Each rank's backward passes (its main thread's), where they were counted
    for p_, raw in (d.get("rank_backward") or {}).items():
        row_ = next((pr for pr in processes if str(pr["pid"]) == p_ and pr["role"] == "rank"), None)
        if row_ is not None:
            row_["backward"] = _backward_calls(raw)
    main = next(pr for pr in processes if pr["pid"] == int(pid))
    # The target's children reaped in the window: what the readings of short-lived workers miss. The
    # kernel's cutime + cstime holds a reaped child's whole life, so the CPU that the children seen
    # at the start had spent before it is taken off (workers of the epoch before, joined inside the
    # window: pytorch/examples' ImageNet script's two workers had spent 55 CPU-s before a 4.9 s window,
    # which read as 12 cores). Captures before 2026-12-03 lack it.
    ms, me_ = start["procs"].get(pid), end["procs"].get(pid)
    reaped = None
    if ms and me_ and (ms.get("ps") or {}).get("children_s") is not None \
            and (me_.get("ps") or {}).get("children_s") is not None:
        reaped = max(0.0, me_["ps"]["children_s"] - ms["ps"]["children_s"] - before_window)
    workers = [pr for pr in processes if pr["role"] == "dataloader_worker"]
    # Worker churn: PIDs that appeared after the first listing or vanished before the last.
    timeline = d.get("timeline", [])
    first = set(timeline[0]["pids"]) if timeline else set()
    last = set(timeline[-1]["pids"]) if timeline else set()
    worker_pids = {w["pid"] for w in workers}
    appeared = sorted((set().union(*[set(r["pids"]) for r in timeline]) - first) & worker_pids) if timeline else []
    vanished = sorted((first - last) & worker_pids)
    # How long the workers gone inside the window had lived, start to join (their epoch; captures from
    # 2026-12-07 on): each one's start time to the middle of the listings about its exit.
    lives = []
    for p in vanished:
        born = ((start["procs"].get(str(p)) or {}).get("ps") or {}).get("create_time")
        seen = [i for i, r in enumerate(timeline) if p in r["pids"]]
        if born is None or not seen or seen[-1] + 1 >= len(timeline):
            continue
        gone = (timeline[seen[-1]]["t_unix"] + timeline[seen[-1] + 1]["t_unix"]) / 2.0
        lives.append(gone - float(born))
    churn: dict[str, Any] = {"appeared": appeared, "vanished": vanished}
    if lives:
        churn["vanished_lifetime_s"] = round(sorted(lives)[len(lives) // 2], 3)

    main_tid = int(pid)
    py_threads = [t for t in main["threads"] if t["tid"] != main_tid]
    busy_other = [t for t in py_threads if (t["cpu_fraction"] or 0) > 0.05]
    return {
        "pid": int(pid),
        "window_s": round(window_s, 3),
        "target_exited": bool(d.get("target_exited_unix")) or not end["procs"].get(pid),
        "cpus_online": len(cpus_online),
        "cpus_allowed": len(cpus_allowed) or len(cpus_online),
        "cpu_quota_cores": quota,
        "cpus_available": round(cpus_available, 2),
        "libraries": libs,
        "uses_torch": any("libtorch" in x for x in libs),
        "uses_cuda": any(("libcuda.so" in x or "libcudart" in x) for x in libs),
        "python": _python_version(libs, d.get("exe") or main["cmdline"]),
        "main": {k: main.get(k) for k in ("pid", "cmdline", "argv", "state", "num_threads", "cpu_seconds", "cpu_cores",
                                          "cpus_allowed", "mems_allowed", "rss_mb")},
        "main_thread": next((t for t in main["threads"] if t["tid"] == main_tid), None),
        "busy_threads_in_main": len(busy_other) + 1,
        "processes": processes,
        "workers": [{"pid": w["pid"], "cpu_cores": w.get("cpu_cores"), "alive_at_end": w["alive_at_end"]}
                    for w in workers],
        "worker_churn": churn,
        "reaped_children_cpu_s": None if reaped is None else round(reaped, 4),
        "reaped_children_cores": None if reaped is None else round(reaped / window_s, 4),
        "threads_at_start": d.get("threads_at_start"),
        "total_cpu_cores": round(sum((pr.get("cpu_seconds") or 0.0) for pr in processes) / window_s, 4),
        **_oncpu_evidence(d),
        **_backward_evidence(d),
    }


def _backward_evidence(d: dict[str, Any]) -> dict[str, Any]:
    raw = d.get("backward")
    if raw is None:
        return {"backward_unavailable": d["backward_unavailable"]} if d.get("backward_unavailable") else {}
    return {"backward": _backward_calls(raw)}


def _backward_calls(raw: dict[str, Any]) -> dict[str, Any]:
    calls = {tid: int(n) for tid, n in (raw.get("calls") or {}).items()}
    seconds = float(raw.get("seconds") or 0.0)
    total = sum(calls.values())
    return {"calls": total, "seconds": seconds, "per_s": round(total / seconds, 2) if seconds > 0 else 0.0,
            "threads": {tid: n for tid, n in calls.items() if n}}


def _oncpu_evidence(d: dict[str, Any]) -> dict[str, Any]:
    raw = d.get("oncpu")
    if raw is None:
        return {"oncpu_unavailable": d["oncpu_unavailable"]} if d.get("oncpu_unavailable") else {}
    threads = {tid: {"samples": int(v[0]), "kernel": int(v[1]), "openmp": int(v[2])}
               for tid, v in (raw.get("threads") or {}).items()}
    return {"oncpu": {"threads": threads, "period_ms": float(raw.get("period_ms") or 0.0),
                      "lost": int(raw.get("lost") or 0), "user_only": bool(raw.get("user_only")),
                      "openmp_runtime": list(raw.get("openmp_runtime") or [])}}


def _kb_to_mb(v: str | None) -> float | None:
    if not v:
        return None
    try:
        return round(int(v.split()[0]) / 1024.0, 1)
    except (ValueError, IndexError):
        return None


def _comm(snap: dict[str, Any]) -> str | None:
    """A process snapshot's comm (psutil's name, or the raw stat's in older captures)."""
    ps = snap.get("ps")
    if ps is not None:
        return ps.get("comm")
    try:
        return procfs.parse_stat(snap["stat"])["comm"]
    except (KeyError, ValueError, IndexError):
        return None


def _role(pid: int, main_pid: int, parents: dict[int, int], env: dict[str, str], cmdline: str,
          main_cmdline: str = "", environ: dict[str, dict[str, str]] | None = None,
          comm: str | None = None, torch: str | None = None) -> str:
    if pid == main_pid:
        return "main"
    # A worker that names itself is one before anything its environment says: a rank started by
    # multiprocessing's spawn may set LOCAL_RANK in os.environ after it started (Lightning's
    # ddp_spawn), which /proc shows in the workers it forks but not in its own start-up environment.
    if ranks.is_worker_comm(comm):
        return "dataloader_worker"
    parent_env = (environ or {}).get(str(parents.get(pid)), {})
    # DataLoader workers inherit their rank's LOCAL_RANK: a rank is the first process that has it.
    if "LOCAL_RANK" in env and parent_env.get("LOCAL_RANK") != env["LOCAL_RANK"]:
        return "rank"
    if ranks.is_helper(cmdline):
        return "child"
    # A child the job started through multiprocessing's spawn that does not name itself a DataLoader
    # worker, under a torch whose workers do: a training process (torch.multiprocessing.spawn, hogwild).
    if ranks.spawned_trainer(cmdline, comm, torch):
        return "rank"
    exe = cmdline.split(" ", 1)[0].rsplit("/", 1)[-1]
    if exe.startswith("python") or "multiprocessing" in cmdline or (main_cmdline and cmdline == main_cmdline):
        # A Python child of the training process: DataLoader workers are the common case; the
        # py-spy evidence confirms them by their _worker_loop frames.
        return "dataloader_worker"
    return "child"


def _python_version(libs: list[str], exe_or_cmdline: str) -> str | None:
    for lib in libs:
        base = lib.rsplit("/", 1)[-1]
        if base.startswith("libpython"):
            v = base[len("libpython"):].split(".so")[0]
            return v or None
    exe = exe_or_cmdline.split(" ", 1)[0].rsplit("/", 1)[-1]
    m = re.match(r"python(\d+\.\d+)", exe)
    return m.group(1) if m else None
