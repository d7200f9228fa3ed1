"""Cheap, repeated samples for `trainprobe watch`: /proc and NVML only (no py-spy, no eBPF).

Discovery: the roots of the node's torch process trees (a Python process that mapped libtorch and
whose parent did not), their ranks (the first process of a chain that carries RANK or LOCAL_RANK)
and their DataLoader workers (the other Python descendants). A process's maps are read once per
(pid, start time), so a rescan costs one stat read per process.

Per sample and trainer (a rank, or the root when it trains itself): its training thread's CPU
time, run-queue delay and context switches; the CPU time of its workers and of the whole tree.
Per GPU: NVML utilisation and the PIDs running on it. Parsing is in pure functions.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

from trainprobe.probes.parsers import envvars, procfs

RANK_KEYS = ("RANK", "LOCAL_RANK", "SLURM_JOB_ID")


@dataclass
class Tree:
    root: int
    cmdline: str
    job: str                                   # the Slurm job id, or "" outside Slurm
    trainers: list[int] = field(default_factory=list)
    workers: dict[int, list[int]] = field(default_factory=dict)    # trainer -> its worker PIDs


@dataclass
class ThreadSample:
    t: float
    cpu_s: float
    run_delay_s: float | None
    vol_ctxsw: int
    invol_ctxsw: int
    workers_cpu_s: float
    tree_cpu_s: float
    workers: int


class Discovery:
    def __init__(self, root: str = "/"):
        self.root = root
        self._torch: dict[tuple[int, int], bool] = {}     # (pid, starttime) -> python with libtorch

    def _stat(self, pid: int) -> dict[str, Any] | None:
        text = procfs.try_read_text(self.root, f"proc/{pid}/stat")
        if not text:
            return None
        try:
            return procfs.parse_stat(text)
        except (ValueError, IndexError):
            return None

    def _is_torch(self, pid: int, st: dict[str, Any]) -> bool:
        key = (pid, st.get("starttime_ticks", 0))
        if key not in self._torch:
            ok = False
            if st["comm"].startswith(("python", "pt_", "torchrun")) or "python" in st["comm"]:
                maps = procfs.try_read_text(self.root, f"proc/{pid}/maps") or ""
                ok = "libtorch" in maps
            self._torch[key] = ok
        return self._torch[key]

    def scan(self, only: set[int] | None = None) -> list[Tree]:
        stats: dict[int, dict[str, Any]] = {}
        me = os.getpid()
        if only:
            # Only these trees: no need to look at (or read the maps of) the host's other processes.
            names = {str(p) for r in only for p in [r] + [d for d, _ in procfs.descendants_of(r, self.root)]}
        else:
            names = set(os.listdir(procfs.path(self.root, "proc")))
        for name in names:
            if name.isdigit() and int(name) != me:
                st = self._stat(int(name))
                if st is not None and st["state"] not in ("Z", "X") and not (st["flags"] & procfs.PF_KTHREAD):
                    stats[int(name)] = st
        alive = {(p, st.get("starttime_ticks", 0)) for p, st in stats.items()}
        self._torch = {k: v for k, v in self._torch.items() if k in alive}
        torch = {p for p, st in stats.items() if self._is_torch(p, st)}
        kids: dict[int, list[int]] = {}
        for p in torch:
            kids.setdefault(stats[p]["ppid"], []).append(p)
        trees = []
        for r in sorted(p for p in torch if stats[p]["ppid"] not in torch):
            if only and r not in only:
                continue
            env = self._env(r)
            try:
                cmd = procfs.parse_cmdline(procfs.read_bytes(self.root, f"proc/{r}/cmdline"))
            except Exception:  # noqa: BLE001 - gone meanwhile
                continue
            tree = Tree(r, cmd, envvars.slurm_job_id(env.get("SLURM_JOB_ID")) or "")
            ranks: list[int] = []
            frontier = [(r, env)]
            while frontier:
                p, penv = frontier.pop()
                for k in kids.get(p, []):
                    kenv = self._env(k)
                    key = "RANK" if "RANK" in kenv else ("LOCAL_RANK" if "LOCAL_RANK" in kenv else None)
                    if key and kenv.get(key) != penv.get(key):
                        ranks.append(k)
                    frontier.append((k, kenv))
            tree.trainers = sorted(ranks) or [r]
            for t in tree.trainers:
                tree.workers[t] = [d for d, _ in procfs.descendants_of(t, self.root) if d in torch]
            trees.append(tree)
        return trees

    def _env(self, pid: int) -> dict[str, str]:
        try:
            return procfs.parse_environ_whitelist(procfs.read_bytes(self.root, f"proc/{pid}/environ"), RANK_KEYS)
        except Exception:  # noqa: BLE001
            return {}



def sample_trainer(tree: Tree, pid: int, root: str = "/") -> ThreadSample | None:
    base = f"proc/{pid}/task/{pid}"
    text = procfs.try_read_text(root, f"{base}/stat")
    if not text:
        return None
    st = procfs.parse_stat(text)
    status = procfs.parse_status(procfs.try_read_text(root, f"{base}/status") or "")
    sched = procfs.parse_schedstat(procfs.try_read_text(root, f"{base}/schedstat"))
    workers = tree.workers.get(pid, [])
    wcpu = sum(procfs.cpu_seconds(root, w) for w in workers)
    return ThreadSample(t=time.monotonic(), cpu_s=st["utime_s"] + st["stime_s"],
                        run_delay_s=sched["wait_s"] if sched else None,
                        vol_ctxsw=int(status.get("voluntary_ctxt_switches", 0) or 0),
                        invol_ctxsw=int(status.get("nonvoluntary_ctxt_switches", 0) or 0),
                        workers_cpu_s=wcpu, tree_cpu_s=procfs.cpu_seconds(root, pid) + wcpu, workers=len(workers))


def rates(a: ThreadSample, b: ThreadSample) -> dict[str, float | None]:
    """Pure: shares and rates between two samples of one training thread."""
    dt = b.t - a.t
    if dt <= 0:
        return {}
    cpu = max(0.0, b.cpu_s - a.cpu_s) / dt
    delay = None if a.run_delay_s is None or b.run_delay_s is None else max(0.0, b.run_delay_s - a.run_delay_s) / dt
    return {
        "loop_cpu_share": round(min(cpu, 1.0), 4),
        "loop_run_delay_share": None if delay is None else round(min(delay, 1.0), 4),
        # Off-CPU and not runnable: waiting for batches, for a collective or for the GPU.
        "loop_wait_share": round(max(0.0, 1.0 - cpu - (delay or 0.0)), 4),
        "voluntary_ctxsw_per_s": round(max(0, b.vol_ctxsw - a.vol_ctxsw) / dt, 2),
        "involuntary_ctxsw_per_s": round(max(0, b.invol_ctxsw - a.invol_ctxsw) / dt, 2),
        "workers_cpu_cores": round(max(0.0, b.workers_cpu_s - a.workers_cpu_s) / dt, 4),
        "tree_cpu_cores": round(max(0.0, b.tree_cpu_s - a.tree_cpu_s) / dt, 4),
        "workers": b.workers,
    }


class GpuSampler:
    """NVML utilisation per GPU and the PIDs on each; `error` says why there is none."""

    def __init__(self) -> None:
        self.nvml: Any = None
        self.error: str | None = None
        from trainprobe.probes.errors import ProbeError
        from trainprobe.probes.support.nvml import Nvml
        try:
            n = Nvml()
            n.open()
            self.nvml = n
        except ProbeError as exc:
            self.error = str(exc)

    def sample(self) -> dict[int, dict[str, Any]]:
        if self.nvml is None:
            return {}
        from trainprobe.probes.support.nvml import is_na
        out: dict[int, dict[str, Any]] = {}
        count = self.nvml.call("nvmlDeviceGetCount")
        if is_na(count):
            self.error = str(count)
            return {}
        for i in range(int(count)):
            h = self.nvml.call("nvmlDeviceGetHandleByIndex", i)
            if is_na(h):
                continue
            u = self.nvml.call("nvmlDeviceGetUtilizationRates", h)
            procs = self.nvml.call("nvmlDeviceGetComputeRunningProcesses", h)
            out[i] = {"busy_share": None if is_na(u) else u.gpu / 100.0,
                      "pids": [] if is_na(procs) else [int(p.pid) for p in procs]}
        return out

    def close(self) -> None:
        if self.nvml is not None:
            self.nvml.close()
