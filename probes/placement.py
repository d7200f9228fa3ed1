"""Placement probe: where the training job's processes may run, where they did run, and where
their memory sits, for the target, its DataLoader workers and, under torchrun, every rank.

Reads, under a root (default "/"), for the target and each descendant:
  proc/PID/status       Cpus_allowed_list and Mems_allowed_list (at first sight and at the end)
  proc/PID/cmdline      the argv (to build the exact `numactl ... <argv>` line)
  proc/PID/environ      CUDA_VISIBLE_DEVICES and LOCAL_RANK only (procfs.parse_environ_whitelist):
                        no other variable is kept, stored or printed
  proc/PID/task/*/stat  utime, stime and the CPU last run on (field 39) of every thread, sampled
                        about 8 times over the window, to see which CPUs the threads ran on
  proc/PID/numa_maps    once at the end: resident pages per NUMA node of every mapping
  proc/uptime           the clock of each sample
  sys/devices/system/node/node*/cpulist   which node each CPU belongs to
and, when the target is a torchrun rank, the cmdline of its parent (the launcher).

At most procfs.MAX_PROCESSES_FOLLOWED processes are followed (the first seen) and, of each, at
most procfs.MAX_THREADS_READ threads (the main thread and the lowest ids), whatever the job's shape.

Cost: a few thousand small /proc reads over the window, and one read of numa_maps per process, for
which the kernel walks the process's page tables (15-30 ms per GB resident measured on the
development VM; the target is not stopped). A process above 64 GB resident (option
`numa_maps_max_rss_gb`) keeps its CPU placement but not its pages per node. Nothing is attached.
"""
from __future__ import annotations

import json
import os
import re
import time
from typing import Any

from trainprobe.probes.parsers import envvars, procfs
from trainprobe.probes.support import ranks
from trainprobe.probes.base import Availability, Capture, Probe, Recorder, WatchSpec, target_exists
from trainprobe.probes.schema import PlacementEvidence
from trainprobe.probes.errors import TargetGone, parser

NODE_DIR = "sys/devices/system/node"
SAMPLES = 8                    # thread samples over the window (at least start and end)
MIN_INTERVAL_S = 0.2
NUMA_MAPS_MAX_CHARS = 4 << 20  # a process with more mappings than this keeps its first 4 MiB of lines
NUMA_MAPS_MAX_RSS_GB = 64.0    # above this resident size, numa_maps is not read (its walk takes ~1-2 s)
LAUNCHER_MARKERS = ("torchrun", "torch.distributed.run", "torch.distributed.launch")
CUDA_LIB_MARKERS = ("libcuda.so", "libcudart", "libnvidia-ml")


# -- pure parsers --------------------------------------------------------------------------------

def stat_fields(text: str) -> tuple[int, int, int | None, int, str, str] | None:
    """(utime_ticks, stime_ticks, processor, ppid, state, comm) from a stat line; None if unreadable."""
    try:
        lpar, rpar = text.index("("), text.rindex(")")
        rest = text[rpar + 2:].split()
        processor = int(rest[36]) if len(rest) > 36 else None
        return int(rest[11]), int(rest[12]), processor, int(rest[1]), rest[0], text[lpar + 1:rpar]
    except (ValueError, IndexError):
        return None


@parser("placement parse_numa_maps")
def parse_numa_maps(text: str) -> dict[str, Any]:
    """Resident bytes per NUMA node: all mappings, and the process's data (anonymous memory and
    shared memory such as DataLoader batches in /dev/shm), leaving out mapped program files and
    libraries, whose page-cache pages sit wherever they were first read."""
    total: dict[int, int] = {}
    data: dict[int, int] = {}
    policies: dict[str, int] = {}
    cuda = False
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 2:
            continue
        page_kb = 4
        file = None
        pages: dict[int, int] = {}
        for tok in parts[1:]:
            if tok.startswith("kernelpagesize_kB="):
                try:
                    page_kb = int(tok.split("=", 1)[1])
                except ValueError:
                    pass
            elif tok.startswith("file="):
                file = tok[5:]
            else:
                m = re.fullmatch(r"N(\d+)=(\d+)", tok)
                if m:
                    pages[int(m.group(1))] = pages.get(int(m.group(1)), 0) + int(m.group(2))
        policy = parts[1]
        policies[policy] = policies.get(policy, 0) + 1
        if file and any(marker in file for marker in CUDA_LIB_MARKERS):
            cuda = True
        is_data = file is None or file.startswith(("/dev/shm/", "/memfd:", "/dev/zero", "/SYSV"))
        for node, n in pages.items():
            b = n * page_kb * 1024
            total[node] = total.get(node, 0) + b
            if is_data:
                data[node] = data.get(node, 0) + b
    return {"bytes_by_node": {str(k): v for k, v in sorted(total.items())},
            "data_bytes_by_node": {str(k): v for k, v in sorted(data.items())},
            "policies": policies, "maps_cuda": cuda}


def _vm_rss_kb(status_text: str) -> int | None:
    v = procfs.parse_status(status_text).get("VmRSS")
    try:
        return int(v.split()[0]) if v else None
    except (ValueError, IndexError):
        return None


def _uptime(text: str | None) -> float | None:
    try:
        return float((text or "").split()[0])
    except (ValueError, IndexError):
        return None


# -- the sampler: reads under a root, keeps raw text ---------------------------------------------

class Sampler:
    """Follows the target's process tree over several samples and keeps what placement needs.

    Each call to `sample` reads one moment (it may be given a different root: the fixture tests
    replay two captured moments of one machine this way); `finish` reads the end state.
    """

    def __init__(self, pid: int, root: str = "/", numa_maps_max_rss_gb: float = NUMA_MAPS_MAX_RSS_GB,
                 numa_maps_one_node: bool = False):
        self.pid = pid
        self.root = root
        self.numa_maps_max_rss_gb = numa_maps_max_rss_gb
        self.numa_maps_one_node = numa_maps_one_node
        self.procs: dict[str, dict[str, Any]] = {}
        self.samples: list[dict[str, Any]] = []
        self.nodes: dict[str, str | None] = {}
        self.launcher: dict[str, Any] | None = None
        self.reads = 0
        self.not_followed: set[int] = set()
        # the torch the target maps (its package's version.py): from 2.4 on DataLoader workers name
        # themselves, so a spawned child that does not is a training process (probes/support/ranks.py)
        self.torch_version: str | None = None
        self._torch_read = False

    def _tree(self, root: str) -> list[tuple[int, int]]:
        if not os.path.isdir(procfs.path(root, f"proc/{self.pid}")):
            return []
        tree = [(self.pid, 0)] + procfs.descendants_of(self.pid, root)
        # The first MAX_PROCESSES_FOLLOWED processes seen are followed; a job forking without end
        # is not read without end (the others are counted).
        kept, new = [], 0
        for p, pp in tree:
            if str(p) in self.procs:
                kept.append((p, pp))
            elif len(self.procs) + new < procfs.MAX_PROCESSES_FOLLOWED:
                kept.append((p, pp))
                new += 1
            else:
                self.not_followed.add(p)
        return kept

    def _first_sight(self, root: str, pid: int) -> None:
        base = f"proc/{pid}"
        try:
            raw = procfs.read_bytes(root, f"{base}/cmdline")
            argv = procfs.parse_argv(raw)
        except Exception:  # noqa: BLE001 - gone, or a kernel thread
            argv = []
        try:
            env = procfs.parse_environ_whitelist(procfs.read_bytes(root, f"{base}/environ"))
        except Exception:  # noqa: BLE001 - unreadable: the variables are unknown
            env = {}
        self.reads += 3
        self.procs[str(pid)] = {"argv": argv, "env": env, "stat": procfs.try_read_text(root, f"{base}/stat"),
                                "status_start": procfs.try_read_text(root, f"{base}/status")}

    def sample(self, root: str | None = None) -> None:
        root = root or self.root
        if not self.nodes:
            for name in (os.listdir(procfs.path(root, NODE_DIR)) if os.path.isdir(procfs.path(root, NODE_DIR)) else []):
                if re.fullmatch(r"node\d+", name):
                    self.nodes[name[4:]] = procfs.try_read_text(root, f"{NODE_DIR}/{name}/cpulist")
        tree = self._tree(root)
        if not self._torch_read and tree:
            self._torch_read = True
            maps = procfs.try_read_text(root, f"proc/{self.pid}/maps") or ""
            self.reads += 1
            self.torch_version = ranks.torch_version(procfs.parse_maps_libraries(maps), root)
        snap: dict[str, Any] = {"t_unix": time.time(), "uptime": _uptime(procfs.try_read_text(root, "proc/uptime")),
                                "pids": {}}
        for pid, _ppid in tree:
            if str(pid) not in self.procs:
                self._first_sight(root, pid)
            tasks: dict[str, str] = {}
            # The main thread and the lowest ids, at most procfs.MAX_THREADS_READ of them.
            tids, n_tasks = procfs.task_ids(root, pid)
            if not n_tasks:
                continue
            for tid in tids:
                text = procfs.try_read_text(root, f"proc/{pid}/task/{tid}/stat")
                self.reads += 1
                f = stat_fields(text) if text else None
                if f is None:
                    continue
                # Only fields 14, 15 and 39 (utime, stime, processor) of the thread's stat line.
                tasks[tid] = f"{f[0]} {f[1]} {'' if f[2] is None else f[2]}".strip()
            snap["pids"][str(pid)] = tasks
        self.samples.append(snap)
        if self.launcher is None and str(self.pid) in self.procs and "LOCAL_RANK" in self.procs[str(self.pid)]["env"]:
            st = stat_fields(self.procs[str(self.pid)]["stat"] or "")
            if st and st[3] > 1:
                raw = procfs.try_read_text(root, f"proc/{st[3]}/cmdline") or ""
                self.launcher = {"pid": st[3], "argv": procfs.parse_argv(raw)}

    def finish(self, root: str | None = None) -> None:
        root = root or self.root
        for pid, rec in self.procs.items():
            rec["status_end"] = procfs.try_read_text(root, f"proc/{pid}/status")
            self.reads += 1
            if len(self.nodes) <= 1 and not self.numa_maps_one_node:
                # One NUMA node: every page is on it, and the walk costs the most on the largest
                # (CUDA) processes: 1.5 CPU-s for 15 processes measured on a GPU node. The option
                # numa_maps_one_node reads them anyway.
                rec["numa_maps"] = None
                rec["numa_maps_skipped"] = "one NUMA node: every page is on it (numa_maps not read)"
                continue
            rss_kb = _vm_rss_kb(rec["status_end"] or rec["status_start"] or "")
            if rss_kb is not None and rss_kb > self.numa_maps_max_rss_gb * (1 << 20):
                # The kernel walks every page table to print numa_maps (~15-30 ms per GB measured).
                rec["numa_maps"] = None
                rec["numa_maps_skipped"] = (f"resident {rss_kb / (1 << 20):.0f} GB > {self.numa_maps_max_rss_gb:g} GB "
                                            "(option numa_maps_max_rss_gb): pages per node not read")
                continue
            text = procfs.try_read_text(root, f"proc/{pid}/numa_maps")
            self.reads += 1
            if text is not None and len(text) > NUMA_MAPS_MAX_CHARS:
                text = text[:text.rfind("\n", 0, NUMA_MAPS_MAX_CHARS) + 1]
                rec["numa_maps_truncated"] = True
            rec["numa_maps"] = text

    def artifact(self) -> dict[str, Any]:
        return {"pid": self.pid, "procs": self.procs, "samples": self.samples, "nodes": self.nodes,
                "launcher": self.launcher, "clk_tck": procfs.CLK_TCK, "reads": self.reads,
                "torch_version": self.torch_version,
                "processes_not_followed": len(self.not_followed)}


def capture_from_roots(pid: int, roots: list[str]) -> Capture:
    """A placement Capture from moments of one machine captured as separate trees (first to last)."""
    s = Sampler(pid, roots[0])
    for r in roots:
        s.sample(r)
    s.finish(roots[-1])
    return Capture("placement", artifacts={"placement.json": json.dumps(s.artifact())})


# -- the pure parser -----------------------------------------------------------------------------

def _cpus(text: str | None) -> list[int]:
    try:
        return procfs.parse_cpulist((text or "").replace("\x00", "").strip())
    except ValueError:
        return []


def _role(pid: str, d: dict[str, Any], parents: dict[str, str | None]) -> str:
    if int(pid) == d["pid"]:
        return "main"
    st = stat_fields(d["procs"][pid].get("stat") or "")
    if st and ranks.is_worker_comm(st[5]):
        # a named DataLoader worker, whatever LOCAL_RANK its rank set in os.environ before forking it
        return "dataloader_worker"
    env = d["procs"][pid]["env"]
    parent = parents.get(pid)
    parent_env = d["procs"].get(parent or "", {}).get("env", {})
    # DataLoader workers inherit LOCAL_RANK from their rank: a rank is the first process that has it.
    if "LOCAL_RANK" in env and parent_env.get("LOCAL_RANK") != env["LOCAL_RANK"]:
        return "rank"
    argv = d["procs"][pid]["argv"]
    cmdline = " ".join(argv or [])
    if ranks.is_helper(cmdline):
        return "child"
    # a training process the job spawned (torch.multiprocessing.spawn, mp.Process under spawn), where
    # the torch it runs names its workers (captures from 2026-12-07 on record the version)
    if st and ranks.spawned_trainer(cmdline, st[5], d.get("torch_version")):
        return "rank"
    exe = (argv[0] if argv else "").rsplit("/", 1)[-1]
    parent_argv = d["procs"].get(parent or "", {}).get("argv")
    if exe.startswith("python") or (parent_argv and argv == parent_argv) or any("multiprocessing" in a for a in argv):
        return "dataloader_worker"
    return "child"


@parser("placement parse_placement")
def parse_placement(d: dict[str, Any]) -> dict[str, Any]:
    """Pure: the sampler's record -> the `placement` evidence."""
    clk = float(d.get("clk_tck") or procfs.CLK_TCK)
    samples = d["samples"]
    cpu_node: dict[int, int] = {}
    nodes = {}
    for n, text in sorted(d.get("nodes", {}).items(), key=lambda kv: int(kv[0])):
        cpus = _cpus(text)
        nodes[int(n)] = procfs.format_cpulist(cpus)
        for c in cpus:
            cpu_node[c] = int(n)

    ups = [s.get("uptime") for s in samples]
    if len(samples) >= 2 and ups[0] is not None and ups[-1] is not None and ups[-1] > ups[0]:
        window_s = ups[-1] - ups[0]
    elif len(samples) >= 2:
        window_s = max(samples[-1]["t_unix"] - samples[0]["t_unix"], 1e-6)
    else:
        window_s = 0.0

    parents: dict[str, str | None] = {}
    for pid, rec in d["procs"].items():
        st = stat_fields(rec.get("stat") or "")
        parents[pid] = str(st[3]) if st else None

    processes = []
    for pid in sorted(d["procs"], key=int):
        rec = d["procs"][pid]
        by_cpu: dict[int, float] = {}
        seen_cpus: set[int] = set()
        threads: dict[str, float] = {}
        prev: dict[str, tuple[int, int | None]] = {}
        for s in samples:
            tasks = s["pids"].get(pid)
            if tasks is None:
                continue
            for tid, fields in tasks.items():
                parts = fields.split()
                ticks = int(parts[0]) + int(parts[1])
                cpu = int(parts[2]) if len(parts) > 2 else None
                if cpu is not None:
                    seen_cpus.add(cpu)
                if tid in prev:
                    p_ticks, p_cpu = prev[tid]
                    dt = max(ticks - p_ticks, 0) / clk
                    if dt > 0:
                        threads[tid] = threads.get(tid, 0.0) + dt
                        # The thread ran somewhere between the two samples: where it was seen at
                        # either end, half each when they differ.
                        ends = [c for c in (p_cpu, cpu) if c is not None]
                        for c in ends:
                            by_cpu[c] = by_cpu.get(c, 0.0) + dt / len(ends)
                prev[tid] = (ticks, cpu)
        status = procfs.parse_status(rec.get("status_end") or rec.get("status_start") or "")
        allowed = _cpus(status.get("Cpus_allowed_list"))
        mems = _cpus(status.get("Mems_allowed_list"))
        by_node: dict[int, float] = {}
        unknown_cpu_s = 0.0
        for c, secs in by_cpu.items():
            if c in cpu_node:
                by_node[cpu_node[c]] = by_node.get(cpu_node[c], 0.0) + secs
            else:
                unknown_cpu_s += secs
        mem = parse_numa_maps(rec["numa_maps"]) if rec.get("numa_maps") else None
        st = stat_fields(rec.get("stat") or "")
        main_tid_s = threads.get(pid, 0.0)
        processes.append({
            "pid": int(pid), "ppid": int(parents[pid]) if parents.get(pid) else None,
            "role": _role(pid, d, parents), "comm": st[5] if st else None,
            "argv": rec["argv"],
            "local_rank": _int(rec["env"].get("LOCAL_RANK")),
            "cuda_visible_devices": envvars.cuda_visible_devices(rec["env"].get("CUDA_VISIBLE_DEVICES")),
            "cpus_allowed": procfs.format_cpulist(allowed) or None,
            "mems_allowed": procfs.format_cpulist(mems) or None,
            "nodes_allowed": sorted({cpu_node[c] for c in allowed if c in cpu_node}),
            "cpu_seconds": round(sum(threads.values()), 4),
            "main_thread_cpu_seconds": round(main_tid_s, 4),
            "main_thread_busy": round(main_tid_s / window_s, 4) if window_s > 0 else None,
            "cpu_seconds_by_cpu": {str(c): round(v, 4) for c, v in sorted(by_cpu.items())},
            "cpu_seconds_by_node": {str(n): round(v, 4) for n, v in sorted(by_node.items())},
            "cpu_seconds_unknown_node": round(unknown_cpu_s, 4),
            "cpus_ran_on": procfs.format_cpulist([c for c, v in by_cpu.items() if v > 0]) or None,
            "cpus_seen": procfs.format_cpulist(sorted(seen_cpus)) or None,
            "threads_sampled": len({t for s in samples for t in s["pids"].get(pid, {})}),
            "memory": mem,
            "numa_maps_truncated": bool(rec.get("numa_maps_truncated")),
            "numa_maps_skipped": rec.get("numa_maps_skipped"),
            "uses_cuda": bool(mem and mem["maps_cuda"]),
        })

    # Each process belongs to the nearest rank above it (itself included), or to the main process.
    by_pid = {p["pid"]: p for p in processes}
    for p in processes:
        owner = p
        while owner["role"] not in ("rank", "main") and owner["ppid"] in by_pid:
            owner = by_pid[owner["ppid"]]
        p["rank_pid"] = owner["pid"]

    main = by_pid.get(d["pid"])
    ranks = [p for p in processes if p["role"] == "rank"]
    target_is_rank = bool(main and main["local_rank"] is not None)
    if target_is_rank and main:
        ranks = [main] + ranks
    launcher = None
    if ranks and not target_is_rank and main:
        launcher = {"pid": main["pid"], "argv": main["argv"], "is_target": True}
    elif target_is_rank and d.get("launcher"):
        launcher = {"pid": d["launcher"]["pid"], "argv": d["launcher"]["argv"], "is_target": False}
    if launcher is not None:
        launcher["torchrun"] = any(any(m in a for m in LAUNCHER_MARKERS) for a in launcher["argv"][:3])
    units = ranks if ranks else ([main] if main else [])
    return {
        "pid": d["pid"],
        "window_s": round(window_s, 3),
        "samples": len(samples),
        "nodes": {str(k): v for k, v in nodes.items()},
        "processes": processes,
        "ranks": [{"pid": r["pid"], "local_rank": r["local_rank"], "cuda_visible_devices": r["cuda_visible_devices"],
                   "members": [p["pid"] for p in processes if p["rank_pid"] == r["pid"]]} for r in units],
        "launcher": launcher,
        "target_is_rank": target_is_rank,
        "reads": d.get("reads"),
    }


def _int(v: str | None) -> int | None:
    return envvars.rank(v)


class PlacementProbe(Probe):
    name = "placement"
    description = "where the job's processes may run, did run, and keep their memory (affinity, CPUs, NUMA pages)"
    needs = ("/proc readable for the target",)
    cost = "small: thread stat sampled ~8 times, numa_maps read once per process"
    timeout_s = 15.0
    evidence_schema = PlacementEvidence
    # Measured per 10 s window, capture and parse (docs/cost.md): it samples every thread's stat, so
    # threads set its cost: 0.006 for a 3-thread job on the 2-CPU VM, 0.021 (4 workers), 0.037 (8);
    # on the H200 node 0.030 for a 34-thread CUDA process, 0.072-0.078 with 14 workers
    # (benchmarks/gpu_cost.py, at 1.3x the models' speed).
    cost_cpu_s_fixed = 0.006
    cost_cpu_s_per_process = 0.0015
    cost_cpu_s_per_thread = 0.00045

    def check(self, spec: WatchSpec) -> Availability:
        return target_exists(spec)

    def capture(self, spec: WatchSpec, rec: Recorder, deadline_monotonic: float) -> None:
        t0, m0 = time.time(), time.monotonic()
        s = Sampler(spec.pid, spec.root,
                    float(spec.options.get("numa_maps_max_rss_gb", NUMA_MAPS_MAX_RSS_GB)),
                    bool(spec.options.get("numa_maps_one_node", False)))
        s.sample()
        if str(spec.pid) not in s.procs:
            raise TargetGone(f"process {spec.pid} exited before the window started")
        interval = max(MIN_INTERVAL_S, (deadline_monotonic - m0) / max(SAMPLES - 1, 1))
        while not rec.stop.is_set() and time.monotonic() < deadline_monotonic - 1e-3:
            if rec.wait_window(min(deadline_monotonic, time.monotonic() + interval)):
                break
            if not os.path.isdir(procfs.path(spec.root, f"proc/{spec.pid}")):
                break
            s.sample()
        s.finish()
        root = spec.root.rstrip("/")
        rec.note("file", f"{root}/proc/{{{','.join(sorted(s.procs))}}}/{{status,cmdline,environ*,numa_maps,"
                 f"task/*/stat}} x{len(s.samples)} samples", 0, t0, time.time() - t0)
        rec.add("placement.json", json.dumps(s.artifact()))
        rec.capture.meta["overhead"] = {"proc_reads": s.reads, "samples": len(s.samples)}
        if s.not_followed:
            rec.capture.meta["processes_not_followed"] = len(s.not_followed)

    @staticmethod
    def parse(capture: Capture) -> PlacementEvidence:
        return parse_placement(json.loads(capture.artifacts["placement.json"]))
