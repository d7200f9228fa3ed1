"""A Slurm job's processes on this node, found by the job (not by guessing), from /proc.

Slurm puts SLURM_JOB_ID and SLURMD_NODENAME in the environment of every task it starts, and
every process a task starts inherits them (with proctrack/linuxproc that environment is the
only record of which job a process belongs to; with proctrack/cgroup the job's cgroup holds the
same set). Only the keys in JOB_KEYS are read from a process's environment; nothing else leaves
parse_environ_whitelist.

Several slurmd may share one host (a test cluster, or Slurm's multiple-slurmd build), so a
process is this node's only if its SLURMD_NODENAME is this node's name.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from trainprobe.probes.parsers import envvars, procfs

JOB_KEYS = ("SLURM_JOB_ID", "SLURMD_NODENAME", "SLURM_PROCID", "SLURM_NODEID", "SLURM_LOCALID",
            "RANK", "LOCAL_RANK")


@dataclass
class JobProcess:
    pid: int
    ppid: int
    comm: str
    cmdline: str
    env: dict[str, str]
    is_python: bool = False
    uses_torch: bool = False


@dataclass
class JobTarget:
    """One training process tree of the job on this node: a rank, or a launcher (torchrun) and its ranks."""
    pid: int
    cmdline: str
    ranks: list[dict[str, Any]] = field(default_factory=list)   # {"pid", "rank", "local_rank", "procid"}

    def to_dict(self) -> dict[str, Any]:
        return {"pid": self.pid, "cmdline": self.cmdline, "ranks": self.ranks}


def _int(v: str | None) -> int | None:
    return envvars.rank(v)


def job_processes(job_id: str, node: str | None, root: str = "/", exclude: set[int] | None = None) -> list[JobProcess]:
    """Every process of job `job_id` on node `node` (None: any node, one slurmd per host)."""
    exclude = exclude or set()
    out: list[JobProcess] = []
    for name in os.listdir(procfs.path(root, "proc")):
        if not name.isdigit() or int(name) in exclude:
            continue
        pid = int(name)
        try:
            env = procfs.parse_environ_whitelist(procfs.read_bytes(root, f"proc/{pid}/environ"), JOB_KEYS)
        except Exception:  # noqa: BLE001 - gone, or not ours to read: not known to be the job's
            continue
        if env.get("SLURM_JOB_ID") != str(job_id):
            continue
        if node is not None and env.get("SLURMD_NODENAME", node) != node:
            continue
        text = procfs.try_read_text(root, f"proc/{pid}/stat")
        if not text:
            continue
        st = procfs.parse_stat(text)
        if st["state"] in ("Z", "X"):
            continue
        try:
            cmdline = procfs.parse_cmdline(procfs.read_bytes(root, f"proc/{pid}/cmdline"))
        except Exception:  # noqa: BLE001
            cmdline = ""
        maps = procfs.try_read_text(root, f"proc/{pid}/maps") or ""
        libs = procfs.parse_maps_libraries(maps) if maps else []
        exe = cmdline.split(" ", 1)[0].rsplit("/", 1)[-1]
        out.append(JobProcess(pid, st["ppid"], st["comm"], cmdline, env,
                              is_python=exe.startswith("python") or any("/libpython" in x for x in libs),
                              uses_torch=any("libtorch" in x for x in libs)))
    return out


def training_targets(procs: list[JobProcess]) -> list[JobTarget]:
    """Pure: the roots of the job's torch process trees on this node, each with its ranks.

    A root is a Python process that loaded torch whose parent did not (a torchrun launcher, or a
    rank started by srun directly). A rank is the first process of a tree that carries RANK or
    LOCAL_RANK (DataLoader workers inherit their rank's variables: a worker is not a rank)."""
    torch = {p.pid: p for p in procs if p.is_python and p.uses_torch}
    by_pid = {p.pid: p for p in procs}
    roots = [p for p in torch.values() if p.ppid not in torch]

    def root_of(p: JobProcess) -> int | None:
        seen = 0
        while p.ppid in torch and seen < 64:
            p, seen = torch[p.ppid], seen + 1
        return p.pid if p.pid in torch else None

    targets = {r.pid: JobTarget(r.pid, r.cmdline) for r in sorted(roots, key=lambda r: r.pid)}
    for p in sorted(torch.values(), key=lambda p: p.pid):
        key = "RANK" if "RANK" in p.env else ("LOCAL_RANK" if "LOCAL_RANK" in p.env else None)
        if key is None:
            continue
        parent = by_pid.get(p.ppid)
        if parent is not None and parent.env.get(key) == p.env.get(key) and parent.pid in torch:
            continue        # a worker of a rank
        r = root_of(p)
        if r in targets:
            targets[r].ranks.append({"pid": p.pid, "rank": _int(p.env.get("RANK")),
                                     "local_rank": _int(p.env.get("LOCAL_RANK")),
                                     "procid": _int(p.env.get("SLURM_PROCID"))})
    out = list(targets.values())
    for t in out:
        if not t.ranks:
            root = torch[t.pid]
            t.ranks.append({"pid": t.pid, "rank": _int(root.env.get("RANK") or root.env.get("SLURM_PROCID")),
                            "local_rank": _int(root.env.get("LOCAL_RANK") or root.env.get("SLURM_LOCALID")),
                            "procid": _int(root.env.get("SLURM_PROCID"))})
    return out


def slurmd_alive(node: str | None, root: str = "/") -> bool | None:
    """Whether this node's slurmd runs: the slurmd started with `-N node`, else the host's only
    slurmd. None when it cannot be told (no slurmd process visible, e.g. in a container)."""
    named, plain = [], []
    for name in os.listdir(procfs.path(root, "proc")):
        if not name.isdigit():
            continue
        text = procfs.try_read_text(root, f"proc/{name}/stat")
        if not text:
            continue
        try:
            st = procfs.parse_stat(text)
        except (ValueError, IndexError):
            continue
        if st["comm"] != "slurmd" or st["state"] in ("Z", "X"):
            continue
        try:
            argv = procfs.read_bytes(root, f"proc/{name}/cmdline").split(b"\0")
        except Exception:  # noqa: BLE001
            continue
        args = [a.decode(errors="replace") for a in argv if a]
        if "-N" in args and args.index("-N") + 1 < len(args):
            named.append(args[args.index("-N") + 1])
        else:
            plain.append(name)
    if named:
        return node in named if node is not None else True
    return True if plain else None
