"""contention probe: CPU time that processes outside the job take on the job's CPUs over the window.

A job slowed by other work on its CPUs shows it only as run-queue wait in its own threads; the
processes that took the CPUs are not part of its tree, so no other probe names them. This probe
reads, at the start and the end of the window:
  - every process on the host, one `/proc/PID/stat` read each (comm, state, parent, flags,
    utime + stime, start time, field 39: the CPU it last ran on), at most MAX_PROCESSES of them;
  - the job's CPUs: the union of its processes' affinity (`sched_getaffinity`, or
    `Cpus_allowed_list` in a captured tree), its cgroup's `cpu.max` and `cpuset.cpus.effective`;
  - each thread of the job: `/proc/PID/task/TID/schedstat` (on-CPU and run-queue wait, in ns)
    and its stat (name, last CPU);
  - `/proc/stat`'s per-CPU lines (busy, idle, irq, softirq, steal).
Half a second in (a quarter of a short window) it scans once more to see which outside processes
are busy: those whose affinity only partly overlaps the job's CPUs, and the job's busy threads,
then have their last CPU read every TICK_S, so their CPU time can be placed on the job's CPUs or
elsewhere. At the end the busiest outside processes are read in full through psutil (user,
command line, redacted, nice, cgroup): at most MAX_DETAILED of them.

What it does not count as a competitor: the job's tree (the target and its descendants) and the
agent's own tree (trainprobe and the processes its probes start: py-spy, perf). Kernel threads
count, by name (`[ksoftirqd/0]`). A process's CPU time is placed on the job's CPUs exactly when its
affinity lies inside them (or outside them), else by the share of its sampled last CPUs that were
the job's (`sampled`), else by the share of its allowed CPUs that are the job's (`overlap`).

Cost: one small read per process per scan (os.read: 20-50 us each with its parse, so 20-50 ms
for 1000 processes; psutil's per-process handle costs about 8x that, which is why the scans read
/proc directly and psutil is kept for the few competitors read in full), plus a read per tracked
process or thread every TICK_S: about 0.03 CPU-s a window on a host of 100 processes, kept in the
evidence (`capture_cpu_seconds`). Nothing attaches to any process.
"""
from __future__ import annotations

import json
import os
import time
from typing import Any

from trainprobe.probes.base import (Availability, Capture, JobShape, Probe, ProbeCost, Recorder, WatchSpec,
                                   expected_job_threads, target_exists)
from trainprobe.probes.errors import ProbeError, TargetGone
from trainprobe.probes.parsers import procfs, redact
from trainprobe.probes.schema import ContentionEvidence

MAX_PROCESSES = 4000     # processes read per scan; a host with more is read in part, and says so
MAX_TRACKED = 48         # outside processes and job threads whose last CPU is sampled every tick
MAX_AFFINITY_READS = 512  # outside processes whose affinity is read at the end (the busiest first)
MAX_DETAILED = 10        # competitors read in full (user, command line, nice, cgroup)
MAX_ARGS, MAX_ARG_CHARS = 32, 200   # of a competitor's command line, kept (after redaction)
MAX_LISTED = 20          # competitors kept in the evidence
MAX_JOB_THREADS = 2048   # threads of the job read at each end of the window
TICK_S = 0.5

ATTRIBUTIONS = ("inside", "outside", "sampled", "overlap")


# -- reading ----------------------------------------------------------------------------------------

def _read_small(path: str) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return os.read(fd, 4096)
    except OSError:
        return None
    finally:
        os.close(fd)


def stat_row(text: str) -> list[Any] | None:
    """/proc/PID/stat -> [ppid, comm, state, flags, cpu_s, starttime_ticks, processor], or None."""
    try:
        st = procfs.parse_stat(text)
    except ProbeError:
        return None
    return [st["ppid"], st["comm"], st["state"], st["flags"], round(st["utime_s"] + st["stime_s"], 3),
            st["starttime_ticks"], st["processor"]]


def scan_processes(root: str, limit: int = MAX_PROCESSES) -> dict[str, Any]:
    """Every process's stat row (at most `limit`), and how many /proc listed."""
    base = procfs.path(root, "proc")
    try:
        names = [n for n in os.listdir(base) if n.isdigit()]
    except OSError:
        names = []
    rows: dict[int, list[Any]] = {}
    for n in names[:limit]:
        raw = _read_small(os.path.join(base, n, "stat"))
        if raw:
            row = stat_row(raw.decode(errors="replace"))
            if row is not None:
                rows[int(n)] = row
    return {"rows": rows, "listed": len(names), "capped": len(names) > limit}


def tree_of(rows: dict[int, list[Any]], top: int | None) -> set[int]:
    """`top` and every process whose parent chain reaches it, from one scan's rows."""
    if top is None or top not in rows:
        return set() if top is None else {top}
    kids: dict[int, list[int]] = {}
    for pid, row in rows.items():
        kids.setdefault(int(row[0]), []).append(pid)
    out, frontier = {top}, [top]
    while frontier:
        p = frontier.pop()
        for k in kids.get(p, []):
            if k not in out:
                out.add(k)
                frontier.append(k)
    return out


def affinity(root: str, pid: int) -> str | None:
    """A process's allowed CPUs as a cpulist: the system call on the live host, else its status."""
    if root == "/" and hasattr(os, "sched_getaffinity"):
        try:
            return procfs.format_cpulist(sorted(os.sched_getaffinity(pid)))
        except OSError:
            return None
    status = procfs.parse_status(procfs.try_read_text(root, f"proc/{pid}/status") or "")
    return status.get("Cpus_allowed_list")


def job_threads(root: str, pids: list[int], limit: int = MAX_JOB_THREADS) -> dict[str, list[Any]]:
    """tid -> [pid, name, run_ns, wait_ns, last_cpu] for each thread of the job's processes."""
    out: dict[str, list[Any]] = {}
    for pid in pids:
        try:
            tids = os.listdir(procfs.path(root, f"proc/{pid}/task"))
        except OSError:
            continue
        for tid in tids:
            if len(out) >= limit:
                return out
            sched = _read_small(procfs.path(root, f"proc/{pid}/task/{tid}/schedstat"))
            stat = _read_small(procfs.path(root, f"proc/{pid}/task/{tid}/stat"))
            if not sched or not stat:
                continue
            parts = sched.split()
            row = stat_row(stat.decode(errors="replace"))
            if len(parts) < 2 or row is None:
                continue
            out[tid] = [pid, row[1], int(parts[0]), int(parts[1]), row[6]]
    return out


def _last_cpu(path: str) -> int | None:
    raw = _read_small(path)
    row = stat_row(raw.decode(errors="replace")) if raw else None
    return None if row is None else row[6]


def _detail(root: str, pid: int) -> dict[str, Any]:
    """Who a competitor is, through psutil: user, command line (redacted), nice; and its cgroup."""
    out: dict[str, Any] = {"user": None, "uid": None, "argv": [], "nice": None, "cgroup": None}
    try:
        proc = procfs.process(pid, root)
        with procfs.ps_errors(f"process {pid}"), proc.oneshot():
            out["uid"] = proc.uids().real
            out["user"] = proc.username()
            out["nice"] = proc.nice()
            # Redacted whole, then shortened: a competitor's command is for a reader to know it by.
            args = [a for a in proc.cmdline() if a][:MAX_ARGS]
            out["argv"] = [a if len(a) <= MAX_ARG_CHARS else a[:MAX_ARG_CHARS] + "..." for a in redact.argv(args)]
    except Exception:  # noqa: BLE001 - a process gone or unreadable keeps what was read
        pass
    out["cgroup"] = procfs.parse_cgroup_v2_path(procfs.try_read_text(root, f"proc/{pid}/cgroup"))
    return out


# -- the probe -------------------------------------------------------------------------------------

class ContentionProbe(Probe):
    name = "contention"
    description = "CPU time other processes take on the job's CPUs: who, how much, the job's run-queue wait"
    needs = ("/proc readable",)
    cost = ("three /proc scans of one small read per process (20-50 ms per 1000 processes) and a read "
            "per tracked process every 0.5 s; about 0.03 CPU-s a window on a small host")
    timeout_s = 10.0
    evidence_schema = ContentionEvidence
    # Measured on the 2-CPU development VM, loaded (about 115 processes): capture and parse took
    # 0.023-0.054 CPU-s for a 4 s or 10 s window, 0.03 typical; the scans are 20-50 us a process
    # (benchmarks/bench_contended.py prints this host's figure). A host with more processes pays
    # its scans on top (estimate_cost). At the models' speed (agent/cost.py: the VM ran 1.8x slower
    # when 0.025 was measured again, benchmarks/bench_cost.py) that is 0.014 for a 10 s window.
    cost_cpu_s_fixed = 0.009
    cost_cpu_s_per_s = 0.0005
    COST_PER_HOST_PROCESS_S = 3 * 30e-6       # three scans
    # Its three scans read every thread of the job (run-queue delay per thread): 0.05 CPU-s for a
    # 34-thread CUDA process and 0.06-0.09 with 14 workers on the H200 node (benchmarks/gpu_cost.py).
    COST_PER_JOB_THREAD_S = 0.0007

    def check(self, spec: WatchSpec) -> Availability:
        return target_exists(spec)

    def estimate_cost(self, spec: WatchSpec, job: JobShape) -> ProbeCost:
        try:
            n = min(MAX_PROCESSES, sum(1 for e in os.listdir(procfs.path(spec.root, "proc")) if e.isdigit()))
        except OSError:
            n = 0
        threads = expected_job_threads(job)
        extra = max(0.0, n - 150) * self.COST_PER_HOST_PROCESS_S + self.COST_PER_JOB_THREAD_S * threads
        return ProbeCost(self.cost_cpu_s_fixed + self.cost_cpu_s_per_s * spec.window_s + extra, 0.0,
                         f"measured model, {n} processes on the host, about {threads} threads in the job")

    def capture(self, spec: WatchSpec, rec: Recorder, deadline_monotonic: float) -> None:
        root, pid = spec.root, spec.pid
        agent_pid = os.getpid() if root == "/" else None
        c0 = time.thread_time()
        # Each reading keeps its own instant: on a loaded host this thread can be held off a CPU
        # between two reads, and a share must be taken over the interval its own readings span.
        job_start = [pid] + [p for p, _ in procfs.descendants_of(pid, root)]
        tt0 = time.monotonic()
        threads0 = job_threads(root, job_start)
        ts0 = time.monotonic()
        stat0 = procfs.try_read_text(root, "proc/stat") or ""
        t0 = time.monotonic()
        scan0 = scan_processes(root)
        if pid not in scan0["rows"]:
            raise TargetGone(f"process {pid} exited before the window started")
        job0 = tree_of(scan0["rows"], pid)
        job_aff = {str(p): affinity(root, p) for p in sorted(job0)}
        job_cpus = sorted({c for a in job_aff.values() for c in procfs.parse_cpulist(a)})
        cgroup = procfs.parse_cgroup_v2_path(procfs.try_read_text(root, f"proc/{pid}/cgroup"))
        cg_dir = f"sys/fs/cgroup/{cgroup.lstrip('/')}" if cgroup else None
        cpu_max = procfs.try_read_text(root, f"{cg_dir}/cpu.max") if cg_dir else None
        cpuset = procfs.try_read_text(root, f"{cg_dir}/cpuset.cpus.effective") if cg_dir else None
        scan_cpu = [time.thread_time() - c0]

        # Who is busy: a second scan early in the window; those whose affinity straddles the
        # job's CPUs, and the job's busy threads, get their last CPU sampled every tick.
        ticks: list[dict[str, Any]] = []
        tracked_procs: list[int] = []
        tracked_threads: list[tuple[int, str]] = []
        detect_at = t0 + min(TICK_S, max(0.05, (deadline_monotonic - t0) / 4))
        rec.stop.wait(max(0.0, detect_at - time.monotonic()))
        c1 = time.thread_time()
        scan_d = scan_processes(root)
        agent_d = tree_of(scan_d["rows"], agent_pid)
        job_d = tree_of(scan_d["rows"], pid)
        job_set = set(job_cpus)
        busy = sorted(((row[4] - scan0["rows"][p][4], p) for p, row in scan_d["rows"].items()
                       if p in scan0["rows"] and p not in job_d and p not in agent_d
                       and row[4] > scan0["rows"][p][4]), reverse=True)
        for _d, p in busy:
            if len(tracked_procs) >= MAX_TRACKED:
                break
            allowed = set(procfs.parse_cpulist(affinity(root, p)))
            if allowed & job_set and not allowed <= job_set:
                tracked_procs.append(p)
        for tid, row in sorted(threads0.items(), key=lambda kv: -kv[1][2]):
            if len(tracked_threads) < MAX_TRACKED:
                tracked_threads.append((row[0], tid))
        scan_cpu.append(time.thread_time() - c1)

        while not rec.stop.is_set() and time.monotonic() < deadline_monotonic:
            rec.stop.wait(min(TICK_S, max(0.0, deadline_monotonic - time.monotonic())))
            if time.monotonic() >= deadline_monotonic or rec.stop.is_set():
                break
            tick: dict[str, Any] = {"t": round(time.monotonic() - t0, 3), "procs": {}, "threads": {}}
            for p in tracked_procs:
                cpu = _last_cpu(procfs.path(root, f"proc/{p}/stat"))
                if cpu is not None:
                    tick["procs"][str(p)] = cpu
            for p, tid in tracked_threads:
                cpu = _last_cpu(procfs.path(root, f"proc/{p}/task/{tid}/stat"))
                if cpu is not None:
                    tick["threads"][tid] = cpu
            ticks.append(tick)

        c2 = time.thread_time()
        job_end = [pid] + [p for p, _ in procfs.descendants_of(pid, root)] \
            if os.path.isdir(procfs.path(root, f"proc/{pid}")) else []
        tt1 = time.monotonic()
        threads1 = job_threads(root, job_end)
        ts1 = time.monotonic()
        stat1 = procfs.try_read_text(root, "proc/stat") or ""
        t1 = time.monotonic()
        scan1 = scan_processes(root)
        job1 = tree_of(scan1["rows"], pid) if pid in scan1["rows"] else set()
        agent = (agent_d | tree_of(scan1["rows"], agent_pid)) if agent_pid else set()
        job = job0 | job_d | job1 | set(job_start) | set(job_end)
        # Rows kept: the processes whose CPU time moved over the window (and the job's and the
        # agent's), so a bundle holds tens of rows, not the host's thousand.
        moved = {p for p, row in scan1["rows"].items()
                 if (p in scan0["rows"] and row[4] > scan0["rows"][p][4] and row[5] == scan0["rows"][p][5])
                 or (p not in scan0["rows"] and row[4] > 0)}
        keep = moved | (job & set(scan1["rows"])) | (agent & set(scan1["rows"]))
        outside = sorted((p for p in moved if p not in job and p not in agent),
                         key=lambda p: -(scan1["rows"][p][4] - (scan0["rows"].get(p) or [0, 0, 0, 0, 0.0])[4]))
        aff = {str(p): affinity(root, p) for p in outside[:MAX_AFFINITY_READS]}
        for p in job | agent:
            if p in scan1["rows"] and str(p) not in aff:
                aff[str(p)] = affinity(root, p)
        ranked = sorted(outside[:MAX_AFFINITY_READS],
                        key=lambda p: -_estimate_on_job(scan0["rows"].get(p), scan1["rows"][p],
                                                        aff.get(str(p)), job_set))
        details = {str(p): _detail(root, p) for p in [pid, *ranked[:MAX_DETAILED]]}
        scan_cpu.append(time.thread_time() - c2)
        data = {
            "pid": pid, "agent_pid": agent_pid, "window_s": round(t1 - t0, 6), "detect_s": round(detect_at - t0, 3),
            "threads_window_s": round(tt1 - tt0, 6), "stat_window_s": round(ts1 - ts0, 6),
            "job_pids": sorted(job), "agent_pids": sorted(agent), "job_affinity": job_aff,
            "cpu_max": cpu_max, "cpuset": cpuset.strip() if cpuset else None, "cgroup": cgroup,
            "cpus_online": procfs.try_read_text(root, "sys/devices/system/cpu/online"),
            "start": {"rows": {str(p): r for p, r in scan0["rows"].items() if p in keep},
                      "listed": scan0["listed"], "capped": scan0["capped"]},
            "end": {"rows": {str(p): r for p, r in scan1["rows"].items() if p in keep},
                    "listed": scan1["listed"], "capped": scan1["capped"]},
            "exited": len([p for p in scan0["rows"] if p not in scan1["rows"] and p not in job and p not in agent]),
            "threads_start": threads0, "threads_end": threads1, "ticks": ticks,
            "tracked_processes": tracked_procs, "affinity": aff, "details": details,
            "scan_cpu_seconds": [round(x, 6) for x in scan_cpu],
        }
        rec.add("proc_stat.start", _cpu_lines(stat0))
        rec.add("proc_stat.end", _cpu_lines(stat1))
        rec.add("contention.json", json.dumps(data))
        rec.note("file", f"{root.rstrip('/')}/proc/*/stat ({scan0['listed']} processes, 3 scans), "
                 "/proc/stat, the job's task/*/{stat,schedstat}", 0, time.time() - (t1 - t0), t1 - t0)

    @staticmethod
    def parse(capture: Capture) -> ContentionEvidence:
        return parse_contention(json.loads(capture.artifacts["contention.json"]),
                                capture.artifacts.get("proc_stat.start", ""), capture.artifacts.get("proc_stat.end", ""))


def _cpu_lines(stat: str) -> str:
    return "\n".join(ln for ln in stat.splitlines() if ln.startswith("cpu")) + "\n"


# -- pure parsing ------------------------------------------------------------------------------------

def _estimate_on_job(row0: list[Any] | None, row1: list[Any], aff: str | None, job: set[int]) -> float:
    """CPU seconds of one outside process placed on the job's CPUs, by affinity overlap only
    (the capture's ranking; the parser refines it with the sampled last CPUs)."""
    cpu = row1[4] - (row0[4] if row0 and row0[5] == row1[5] else 0.0)
    allowed = set(procfs.parse_cpulist(aff)) if aff else set()
    if not allowed:
        return cpu * (1.0 if row1[6] in job else 0.0)
    return cpu * len(allowed & job) / len(allowed)


def _place(cpu_s: float, allowed: set[int], job: set[int], samples: list[int]) -> tuple[float, str, float]:
    """(seconds on the job's CPUs, how that was decided, the weight) for one process."""
    if allowed and allowed <= job:
        return cpu_s, "inside", 1.0
    if allowed and not allowed & job:
        return 0.0, "outside", 0.0
    if samples:
        w = sum(1 for c in samples if c in job) / len(samples)
        return cpu_s * w, "sampled", w
    w = len(allowed & job) / len(allowed) if allowed else 0.0
    return cpu_s * w, "overlap", w


def parse_contention(d: dict[str, Any], stat0: str, stat1: str) -> dict[str, Any]:
    """Pure: the scans, samples and /proc/stat lines -> the window's contention evidence."""
    pid = int(d["pid"])
    win = max(float(d["window_s"]), 1e-6)
    t_win = max(float(d.get("threads_window_s") or win), 1e-6)     # the job's threads' readings
    s_win = max(float(d.get("stat_window_s") or win), 1e-6)        # /proc/stat's
    online = procfs.parse_cpulist(d.get("cpus_online")) or sorted(procfs.per_cpu_times(stat1))
    job_aff = d.get("job_affinity") or {}
    job_cpus = sorted({c for a in job_aff.values() for c in procfs.parse_cpulist(a)}) or online
    job = set(job_cpus)
    quota = procfs.parse_cpu_max(d.get("cpu_max"))
    budget = float(len(job_cpus))
    basis = f"{len(job_cpus)} CPUs in the job's affinity"
    if quota is not None and quota < budget:
        budget, basis = quota, f"cgroup quota of {quota:g} CPUs ({basis})"
    job_pids = {int(p) for p in d.get("job_pids", [])}
    agent_pids = {int(p) for p in d.get("agent_pids", [])}
    rows0 = {int(p): r for p, r in d["start"]["rows"].items()}
    rows1 = {int(p): r for p, r in d["end"]["rows"].items()}
    ticks = d.get("ticks", [])

    # The job's threads: on-CPU and run-queue time from schedstat, where they ran from the samples.
    th0, th1 = d.get("threads_start", {}), d.get("threads_end", {})
    threads = []
    for tid in sorted(set(th0) | set(th1), key=int):
        a, b = th0.get(tid), th1.get(tid)
        ref = b or a
        run_ns = b[2] - (a[2] if a else 0) if b else 0
        wait_ns = b[3] - (a[3] if a else 0) if b else 0
        cpus = [r[4] for r in (a, b) if r and r[4] is not None]
        cpus += [t["threads"][tid] for t in ticks if tid in t.get("threads", {})]
        threads.append({"pid": int(ref[0]), "tid": int(tid), "name": ref[1], "main": int(tid) == int(ref[0]),
                        "target": int(ref[0]) == pid, "cpu_seconds": round(max(run_ns, 0) / 1e9, 6),
                        "runq_seconds": round(max(wait_ns, 0) / 1e9, 6),
                        "cpu_share": round(min(1.0, max(run_ns, 0) / 1e9 / t_win), 4),
                        "runq_share": round(min(1.0, max(wait_ns, 0) / 1e9 / t_win), 4),
                        "last_cpus": sorted(set(cpus)), "seen": "both" if a and b else ("start" if a else "end")})
    job_cpu_s = sum(t["cpu_seconds"] for t in threads)
    training = next((t for t in threads if t["tid"] == pid), None)
    worker_mains = [t for t in threads if t["main"] and not t["target"]
                    and t["cpu_share"] + t["runq_share"] >= 0.10]

    # Where the job ran, CPU by CPU: each thread's time spread over the CPUs it was seen on.
    job_on: dict[int, float] = {}
    for t in threads:
        where = [c for c in t["last_cpus"] if c in job] or job_cpus
        for c in where:
            job_on[c] = job_on.get(c, 0.0) + t["cpu_seconds"] / len(where)

    # Every process outside the job whose CPU time moved, placed on the job's CPUs or not.
    aff = d.get("affinity", {})
    details = d.get("details", {})
    samples: dict[int, list[int]] = {}
    for t in ticks:
        for p, c in t.get("procs", {}).items():
            samples.setdefault(int(p), []).append(int(c))
    comp, agent_on_job, others_total = [], 0.0, 0.0
    target_row = rows1.get(pid) or rows0.get(pid)
    target_argv = (details.get(str(pid)) or {}).get("argv")
    for p in sorted(rows1):
        r1 = rows1[p]
        r0 = rows0.get(p)
        same = r0 is not None and r0[5] == r1[5]
        cpu = r1[4] - (r0[4] if same else 0.0)
        if cpu <= 0 or p in job_pids:
            continue
        allowed = set(procfs.parse_cpulist(aff.get(str(p)))) if aff.get(str(p)) else set()
        sampled = ([c for c in (r0[6] if same else None, r1[6]) if c is not None] + samples.get(p, [])
                   if p in samples else [])
        on_job, how, w = _place(cpu, allowed, job, sampled)
        if not allowed and how == "overlap":
            on_job, how, w = (cpu, "sampled", 1.0) if r1[6] in job else (0.0, "sampled", 0.0)
        if p in agent_pids:
            agent_on_job += on_job
            continue
        others_total += on_job
        if on_job <= 0:
            continue
        det = details.get(str(p)) or {}
        kthread = bool(int(r1[3]) & procfs.PF_KTHREAD)
        argv = det.get("argv") or []
        comp.append({
            "pid": p, "ppid": int(r1[0]), "comm": r1[1], "kernel_thread": kthread,
            "cmdline": " ".join(argv) if argv else f"[{r1[1]}]",
            "user": det.get("user"), "uid": det.get("uid"), "nice": det.get("nice"), "cgroup": det.get("cgroup"),
            "cpus_allowed": aff.get(str(p)), "cpu_seconds": round(cpu, 3),
            "cpu_seconds_on_job_cpus": round(on_job, 3),
            "share_of_job_cpus": round(on_job / (win * max(1, len(job_cpus))), 4),
            "attribution": how, "weight": round(w, 3), "started_in_window": not same,
            # Another rank of the same launch looks like this: the target's parent and its command.
            "sibling_of_target": bool(target_row) and int(r1[0]) == int(target_row[0]) and int(r1[0]) > 1
                                 and bool(argv) and argv == target_argv,
        })
    comp.sort(key=lambda c: -c["cpu_seconds_on_job_cpus"])

    # The exact total from /proc/stat: what ran on the job's CPUs that was not the job or the agent.
    c0, c1 = procfs.per_cpu_times(stat0), procfs.per_cpu_times(stat1)
    per_cpu: dict[int, dict[str, float]] = {}
    for c in sorted(set(c0) & set(c1)):
        dt = {k: max(0.0, c1[c][k] - c0[c][k]) for k in ("run", "idle", "irq", "steal")}
        mine = job_on.get(c, 0.0) * s_win / t_win
        per_cpu[c] = {"run_s": round(dt["run"], 3), "idle_s": round(dt["idle"], 3), "irq_s": round(dt["irq"], 3),
                      "steal_s": round(dt["steal"], 3), "job_s": round(mine, 3),
                      "others_s": round(max(0.0, dt["run"] + dt["irq"] - mine), 3)}
    on_job_cpus = [per_cpu[c] for c in job_cpus if c in per_cpu]
    others_exact = None
    if on_job_cpus:
        # Over the process scans' window, like the competitors' times: each reading's own interval
        # scaled to it.
        ran = sum(x["run_s"] + x["irq_s"] for x in on_job_cpus) * win / s_win
        others_exact = round(max(0.0, ran - job_cpu_s * win / t_win - agent_on_job), 3)
    listed = comp[:MAX_LISTED]
    return {
        "pid": pid, "window_s": round(win, 3), "source": "procfs",
        "job_pids": sorted(job_pids), "job_cpus": procfs.format_cpulist(job_cpus), "job_cpu_count": len(job_cpus),
        "cpu_quota_cores": quota, "job_cpu_budget": round(budget, 3), "job_cpu_budget_basis": basis,
        "cpuset_cpus": d.get("cpuset"), "cgroup": d.get("cgroup"),
        "cpus_online": procfs.format_cpulist(online),
        "job_threads": threads, "job_cpu_seconds": round(job_cpu_s * win / t_win, 3),
        "job_runnable_mean": round(sum(t["cpu_share"] + t["runq_share"] for t in threads), 3),
        "training_thread_runq_share": training["runq_share"] if training else None,
        "training_thread_cpu_share": training["cpu_share"] if training else None,
        "workers_runq_share_mean": (round(sum(t["runq_share"] for t in worker_mains) / len(worker_mains), 4)
                                    if worker_mains else None),
        "per_cpu": per_cpu,
        "others_cpu_seconds_on_job_cpus": others_exact,
        "competitors_cpu_seconds_on_job_cpus": round(others_total, 3),
        "irq_seconds_on_job_cpus": round(sum(x["irq_s"] for x in on_job_cpus), 3),
        "steal_seconds_on_job_cpus": round(sum(x["steal_s"] for x in on_job_cpus), 3),
        "agent_cpu_seconds_on_job_cpus": round(agent_on_job, 3),
        "competitors": listed, "competitors_total": len(comp),
        "processes_scanned": int(d["end"]["listed"]), "scan_capped": bool(d["start"]["capped"] or d["end"]["capped"]),
        "max_processes": MAX_PROCESSES,
        "exited_during_window": int(d.get("exited", 0)),
        "ticks": len(ticks), "tracked_processes": len(d.get("tracked_processes", [])),
        "capture_cpu_seconds": round(sum(d.get("scan_cpu_seconds", [])), 4),
    }
