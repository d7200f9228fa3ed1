"""Process probe: the target's process tree, its threads and their CPU over the window.

Reads /proc/PID/{stat,status,cmdline,cgroup,maps} of the target and its descendants and
/proc/PID/task/TID/{stat,status,schedstat} of every thread, once at the start and once at the end
of the window, and lists the descendants every 0.5 s in between to see DataLoader workers come and
go. Of a process environment it reads only CUDA_VISIBLE_DEVICES and LOCAL_RANK. Cost: a few hundred
small file reads; no signal, no ptrace, nothing attached.
"""
from __future__ import annotations

import json
import os
import re
import time
from typing import Any

from probes import procfs
from probes.base import Availability, Capture, Probe, Recorder, WatchSpec
from probes.errors import TargetGone

# Shared objects whose presence says what the process is.
LIB_MARKERS = ("libtorch", "libcuda.so", "libcudart", "libnccl", "libpython", "libgomp", "libiomp")


def _snapshot_process(root: str, pid: int) -> dict[str, Any] | None:
    base = f"proc/{pid}"
    try:
        stat = procfs.read_text(root, f"{base}/stat")
        status = procfs.read_text(root, f"{base}/status")
    except Exception:  # noqa: BLE001 - the process exited between listing and reading
        return None
    argv = procfs.parse_argv(procfs.read_bytes(root, f"{base}/cmdline")) if os.path.exists(
        procfs.path(root, f"{base}/cmdline")) else []
    cmdline = " ".join(argv)
    tasks: dict[str, dict[str, str | None]] = {}
    try:
        tids = os.listdir(procfs.path(root, f"{base}/task"))
    except OSError:
        tids = []
    for tid in tids:
        tstat = procfs.try_read_text(root, f"{base}/task/{tid}/stat")
        if tstat is None:
            continue
        tasks[tid] = {
            "stat": tstat,
            "status": procfs.try_read_text(root, f"{base}/task/{tid}/status"),
            "schedstat": procfs.try_read_text(root, f"{base}/task/{tid}/schedstat"),
        }
    return {"stat": stat, "status": status, "cmdline": cmdline, "argv": argv, "tasks": tasks}


def _environ(root: str, pid: int) -> dict[str, str]:
    try:
        return procfs.parse_environ_whitelist(procfs.read_bytes(root, f"proc/{pid}/environ"))
    except Exception:  # noqa: BLE001 - unreadable environ: the variables are simply unknown
        return {}


def _libraries(root: str, pid: int) -> list[str]:
    text = procfs.try_read_text(root, f"proc/{pid}/maps") or ""
    return [lib for lib in procfs.parse_maps_libraries(text) if any(m in lib for m in LIB_MARKERS)]


class ProcessProbe(Probe):
    name = "process"
    description = "process tree, threads, per-thread CPU, context switches, affinity (from /proc)"
    needs = ("/proc readable for the target",)
    cost = "negligible: two /proc snapshots and a child listing every 0.5 s"
    timeout_s = 10.0
    cost_cpu_s_fixed = 0.015       # measured per 10 s window, capture and parse (docs/cost.md)
    cost_cpu_s_per_process = 0.003

    def check(self, spec: WatchSpec) -> Availability:
        if not os.path.isdir(procfs.path(spec.root, f"proc/{spec.pid}")):
            return Availability.no(f"process {spec.pid} does not exist")
        return Availability.yes()

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
        tree0 = self._tree(spec)
        snap0 = self._snapshot(spec, tree0)
        if str(spec.pid) not in snap0["procs"]:
            raise TargetGone(f"process {spec.pid} exited before the window started")
        env = {str(p): _environ(root, p) for p, _ in tree0}
        parents = {str(p): pp for p, pp in tree0}
        libs = _libraries(root, spec.pid)
        for p, _ in tree0:   # ranks under a launcher load CUDA, the launcher does not
            if p != spec.pid and "LOCAL_RANK" in env.get(str(p), {}):
                libs = sorted(set(libs) | set(_libraries(root, p)))
        try:
            exe = os.readlink(procfs.path(root, f"proc/{spec.pid}/exe"))
        except OSError:
            exe = None
        cgroup = procfs.parse_cgroup_v2_path(procfs.try_read_text(root, f"proc/{spec.pid}/cgroup"))
        cpu_max = procfs.try_read_text(root, f"sys/fs/cgroup/{cgroup.lstrip('/')}/cpu.max") if cgroup else None
        timeline: list[dict[str, Any]] = [{"t_unix": t0, "pids": [p for p, _ in tree0]}]
        target_exited_unix = None
        while not rec.stop.is_set() and time.monotonic() < deadline_monotonic:
            rec.stop.wait(min(0.5, max(0.0, deadline_monotonic - time.monotonic())))
            tree = self._tree(spec) if os.path.isdir(procfs.path(root, f"proc/{spec.pid}")) else []
            alive = [p for p, _ in tree]
            timeline.append({"t_unix": time.time(), "pids": alive})
            for p, pp in tree:
                if str(p) not in env:
                    env[str(p)] = _environ(root, p)
                    parents[str(p)] = pp
            if not alive or _is_zombie(root, spec.pid):
                target_exited_unix = time.time()
                break
        tree1 = self._tree(spec) if os.path.isdir(procfs.path(root, f"proc/{spec.pid}")) else []
        for p, pp in tree1:
            parents.setdefault(str(p), pp)
        snap1 = self._snapshot(spec, tree1)
        n_threads = sum(len(s["tasks"]) for s in snap0["procs"].values())
        rec.note("file", f"{root.rstrip('/')}/proc/{{{','.join(sorted(snap0['procs']))}}}/"
                 "{stat,status,cmdline,environ*,task/*/{stat,status,schedstat}}", 0, t0, time.time() - t0)
        rec.add("snapshots.json", json.dumps({
            "pid": spec.pid, "start": snap0, "end": snap1, "timeline": timeline, "parents": parents,
            "environ": env, "libraries": libs, "exe": exe, "cgroup": cgroup, "cpu_max": cpu_max,
            "cpus_online": procfs.try_read_text(root, "sys/devices/system/cpu/online"),
            "target_exited_unix": target_exited_unix, "threads_at_start": n_threads,
        }))

    @staticmethod
    def parse(capture: Capture) -> dict[str, Any]:
        return parse_snapshots(json.loads(capture.artifacts["snapshots.json"]))


def _is_zombie(root: str, pid: int) -> bool:
    text = procfs.try_read_text(root, f"proc/{pid}/stat")
    return text is None or procfs.parse_stat(text)["state"] in ("Z", "X")


def _thread_rows(start: dict | None, end: dict | None, window_s: float) -> list[dict[str, Any]]:
    rows = []
    s_tasks = (start or {}).get("tasks", {})
    e_tasks = (end or {}).get("tasks", {})
    for tid in sorted(set(s_tasks) | set(e_tasks), key=int):
        s, e = s_tasks.get(tid), e_tasks.get(tid)
        ref = e or s
        st = procfs.parse_stat(ref["stat"])
        status = procfs.parse_status(ref.get("status") or "")
        cpu = st["utime_s"] + st["stime_s"]
        vol = int(status.get("voluntary_ctxt_switches", 0) or 0)
        invol = int(status.get("nonvoluntary_ctxt_switches", 0) or 0)
        sched = procfs.parse_schedstat(ref.get("schedstat"))
        run_delay = sched["wait_s"] if sched else None
        if s and e:
            s_st = procfs.parse_stat(s["stat"])
            s_status = procfs.parse_status(s.get("status") or "")
            cpu -= s_st["utime_s"] + s_st["stime_s"]
            vol -= int(s_status.get("voluntary_ctxt_switches", 0) or 0)
            invol -= int(s_status.get("nonvoluntary_ctxt_switches", 0) or 0)
            s_sched = procfs.parse_schedstat(s.get("schedstat"))
            if sched and s_sched:
                run_delay = sched["wait_s"] - s_sched["wait_s"]
        rows.append({
            "tid": int(tid), "name": st["comm"], "state": st["state"],
            "cpu_seconds": round(max(cpu, 0.0), 4),
            "cpu_fraction": round(max(cpu, 0.0) / window_s, 4) if window_s > 0 else None,
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

    main_ref = end["procs"].get(pid) or start["procs"].get(pid)
    main_status = procfs.parse_status(main_ref["status"])
    cpus_allowed = procfs.parse_cpulist(main_status.get("Cpus_allowed_list"))
    quota = procfs.parse_cpu_max(d.get("cpu_max"))
    cpus_available = float(len(cpus_allowed) or len(cpus_online) or 1)
    if quota is not None:
        cpus_available = min(cpus_available, quota)

    all_pids = sorted({int(p) for p in start["procs"]} | {int(p) for p in end["procs"]}
                      | {p for row in d.get("timeline", []) for p in row["pids"]})
    processes = []
    for p in all_pids:
        s, e = start["procs"].get(str(p)), end["procs"].get(str(p))
        ref = e or s
        env = environ.get(str(p), {})
        if ref is None:
            processes.append({"pid": p, "ppid": parents.get(p), "role": _role(p, int(pid), parents, env, "", environ=environ),
                              "cmdline": "", "cpu_seconds": None, "threads": [], "alive_at_end": False,
                              "seen": "listing", "env": env})
            continue
        st = procfs.parse_stat(ref["stat"])
        status = procfs.parse_status(ref["status"])
        cpu = st["utime_s"] + st["stime_s"]
        if s and e:
            s_st = procfs.parse_stat(s["stat"])
            cpu -= s_st["utime_s"] + s_st["stime_s"]
        threads = _thread_rows(s, e, window_s)
        processes.append({
            "pid": p, "ppid": st["ppid"], "role": _role(p, int(pid), parents, env, ref["cmdline"], main_ref["cmdline"], environ),
            "cmdline": ref["cmdline"], "argv": ref.get("argv"), "state": st["state"], "num_threads": st["num_threads"],
            "cpu_seconds": round(max(cpu, 0.0), 4),
            "cpu_cores": round(max(cpu, 0.0) / window_s, 4),
            "cpus_allowed": status.get("Cpus_allowed_list"), "mems_allowed": status.get("Mems_allowed_list"),
            "rss_mb": _kb_to_mb(status.get("VmRSS")), "threads": threads,
            "alive_at_end": e is not None, "seen": "both" if (s and e) else ("start" if s else "end"),
            "env": env,
        })

    main = next(pr for pr in processes if pr["pid"] == int(pid))
    workers = [pr for pr in processes if pr["role"] == "dataloader_worker"]
    # Worker churn: PIDs that appeared after the first listing or vanished before the last.
    timeline = d.get("timeline", [])
    first = set(timeline[0]["pids"]) if timeline else set()
    last = set(timeline[-1]["pids"]) if timeline else set()
    worker_pids = {w["pid"] for w in workers}
    appeared = sorted((set().union(*[set(r["pids"]) for r in timeline]) - first) & worker_pids) if timeline else []
    vanished = sorted((first - last) & worker_pids)

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
        "worker_churn": {"appeared": appeared, "vanished": vanished},
        "threads_at_start": d.get("threads_at_start"),
        "total_cpu_cores": round(sum((pr.get("cpu_seconds") or 0.0) for pr in processes) / window_s, 4),
    }


def _kb_to_mb(v: str | None) -> float | None:
    if not v:
        return None
    try:
        return round(int(v.split()[0]) / 1024.0, 1)
    except (ValueError, IndexError):
        return None


def _role(pid: int, main_pid: int, parents: dict[int, int], env: dict[str, str], cmdline: str,
          main_cmdline: str = "", environ: dict[str, dict[str, str]] | None = None) -> str:
    if pid == main_pid:
        return "main"
    parent_env = (environ or {}).get(str(parents.get(pid)), {})
    # DataLoader workers inherit their rank's LOCAL_RANK: a rank is the first process that has it.
    if "LOCAL_RANK" in env and parent_env.get("LOCAL_RANK") != env["LOCAL_RANK"]:
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
