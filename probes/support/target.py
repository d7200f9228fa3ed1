"""Facts about a candidate target process (psutil), and discovery of training processes.

Raises the probes.errors taxonomy; the agent turns those into exit codes and one-line messages.
/proc is read directly only for what psutil lacks: the kernel-thread flag, the mapped libraries,
the whitelisted environment keys, and whether /proc/PID/mem opens.
"""
from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass, field

import psutil

from trainprobe.probes.parsers import procfs, redact
from trainprobe.probes.errors import BadInput, PermissionDenied, ProbeError, TargetGone


@dataclass
class ProcessInfo:
    pid: int
    comm: str
    state: str
    ppid: int
    uid: int
    cmdline: str
    exe: str | None
    kernel_thread: bool
    is_python: bool
    uses_torch: bool
    uses_cuda: bool
    cpu_seconds: float
    children: list[int] = field(default_factory=list)

    @property
    def zombie(self) -> bool:
        return self.state in ("Z", "X")


_PY_EXE = re.compile(r"^python(\d+(\.\d+)*)?[a-z]?$")


def inspect(pid: int, root: str = "/") -> ProcessInfo:
    """Read what trainprobe needs to know about `pid` before attaching to it."""
    if pid <= 0:
        raise BadInput(f"{pid} is not a valid PID")
    try:
        proc = procfs.process(pid, root)
        with procfs.ps_errors(f"process {pid}"), proc.oneshot():
            comm, state, ppid = proc.name(), procfs.state_letter(proc.status()), proc.ppid()
            uid = proc.uids().real
            times = proc.cpu_times()
        # The kernel-thread flag is not in psutil: field 9 of /proc/PID/stat.
        flags = procfs.parse_stat(procfs.read_text(root, f"proc/{pid}/stat"))["flags"]
    except TargetGone:
        raise BadInput(f"no process with PID {pid}") from None
    kernel_thread = bool(flags & procfs.PF_KTHREAD)
    cmdline = ""
    try:
        cmdline = " ".join(redact.argv(a for a in proc.cmdline() if a))
    except psutil.Error:  # zombies and kernel threads have none
        pass
    exe = None
    try:
        exe = proc.exe() or None
    except psutil.Error:
        pass
    maps = procfs.try_read_text(root, f"proc/{pid}/maps") or ""
    libs = procfs.parse_maps_libraries(maps) if maps else []
    exe_base = (exe or cmdline.split(" ", 1)[0]).rsplit("/", 1)[-1].replace(" (deleted)", "")
    is_python = bool(_PY_EXE.match(exe_base)) or any("/libpython" in x for x in libs)
    kids: list[int] = []
    try:
        kids = procfs.children_of(pid, root)
    except ProbeError:
        pass
    return ProcessInfo(
        pid=pid, comm=comm, state=state, ppid=ppid, uid=uid, cmdline=cmdline, exe=exe,
        kernel_thread=kernel_thread, is_python=is_python,
        uses_torch=any("libtorch" in x for x in libs),
        uses_cuda=any(("libcuda.so" in x or "libcudart" in x) for x in libs),
        cpu_seconds=times.user + times.system, children=kids,
    )


CAP_SYS_PTRACE = 19


def has_capability(cap: int, root: str = "/") -> bool:
    """Whether trainprobe itself holds capability `cap` (its bit number) in its effective set."""
    status = procfs.parse_status(procfs.try_read_text(root, "proc/self/status") or "")
    try:
        return bool(int(status.get("CapEff", "0"), 16) >> cap & 1)
    except ValueError:
        return False


def can_ptrace(info: ProcessInfo, root: str = "/") -> tuple[bool, str | None]:
    """Whether this user may attach to the target (py-spy reads its memory through ptrace rules).

    Root, or CAP_SYS_PTRACE in the effective set (`setpriv --ambient-caps +sys_ptrace ...`), may
    read any process; others only their own, as kernel.yama.ptrace_scope allows."""
    if os.geteuid() == 0 or has_capability(CAP_SYS_PTRACE, root):
        return True, None
    if info.uid != os.geteuid():
        return False, (f"PID {info.pid} belongs to uid {info.uid}; reading its memory needs root or "
                       "CAP_SYS_PTRACE: run trainprobe with sudo")
    scope_text = procfs.try_read_text(root, "proc/sys/kernel/yama/ptrace_scope")
    scope = int(scope_text.strip()) if scope_text and scope_text.strip().isdigit() else 0
    if scope >= 2:
        return False, (f"kernel.yama.ptrace_scope is {scope}: attaching needs root "
                       "(or `sysctl kernel.yama.ptrace_scope=1` for non-descendants of your shell)")
    if scope == 1:
        # Only descendants may be traced without CAP_SYS_PTRACE.
        p = info.ppid
        me = os.getpid()
        while p > 1:
            if p == me:
                return True, None
            p = procfs.process_fact(p, "ppid", root)
            if p is None:
                break
        return False, (f"kernel.yama.ptrace_scope is 1 and PID {info.pid} is not a child of trainprobe: "
                       "run with sudo, or `sudo sysctl kernel.yama.ptrace_scope=0`")
    try:
        with open(procfs.path(root, f"proc/{info.pid}/mem"), "rb"):
            pass
    except PermissionError:
        raise PermissionDenied(f"cannot open /proc/{info.pid}/mem: run trainprobe with sudo") from None
    except OSError:
        pass
    return True, None


@dataclass
class Candidate:
    pid: int
    cmdline: str
    cpu_cores: float
    tree_size: int


def find_training_processes(root: str = "/", sample_s: float = 0.5) -> list[Candidate]:
    """Python processes that loaded torch and whose parent did not: the roots of training jobs.

    CPU use is that of the whole process tree (ranks and workers), measured over `sample_s`.
    """
    infos: dict[int, ProcessInfo] = {}
    procfs.process(os.getpid(), root)      # points psutil at the root
    for pid in psutil.pids():
        if pid == os.getpid():
            continue
        try:
            info = inspect(pid, root)
        except Exception:  # noqa: BLE001 - processes come and go while we look
            continue
        if info.is_python and info.uses_torch and not info.zombie:
            infos[info.pid] = info
    roots = [i for i in infos.values() if i.ppid not in infos]

    def tree_cpu(pid: int) -> tuple[float, int]:
        total, n = 0.0, 0
        for p in [pid] + [d for d, _ in procfs.descendants_of(pid, root)]:
            times = procfs.process_fact(p, "cpu_times", root)
            if times is None:
                continue
            total += times.user + times.system
            n += 1
        return total, n

    before = {r.pid: tree_cpu(r.pid)[0] for r in roots}
    t0 = time.monotonic()
    time.sleep(sample_s)
    dt = max(time.monotonic() - t0, 1e-3)
    out = []
    for r in roots:
        after, n = tree_cpu(r.pid)
        out.append(Candidate(r.pid, r.cmdline, round((after - before[r.pid]) / dt, 2), n))
    out.sort(key=lambda c: -c.cpu_cores)
    return out


def is_alive(pid: int, root: str = "/") -> bool:
    """True while the process exists and is not a zombie."""
    return procfs.is_running(root, pid)


def launcher_of(pid: int, root: str = "/") -> int | None:
    """If `pid` is one rank of a multi-rank job, the launcher's PID; else None. A rank is a process with
    LOCAL_RANK whose Python parent has other such children (torchrun), or a training process the job
    started through multiprocessing's spawn (torch.multiprocessing.spawn, mp.Process: no LOCAL_RANK)
    whose parent started another (probes/support/ranks.py). Reads only LOCAL_RANK of the environment."""
    from trainprobe.probes.support import ranks
    if ranks.is_worker_comm(_comm(pid, root)):
        return None       # a DataLoader worker inherits its rank's LOCAL_RANK: it is no rank itself
    try:
        env = procfs.parse_environ_whitelist(procfs.read_bytes(root, f"proc/{pid}/environ"), ("LOCAL_RANK",))
    except Exception:  # noqa: BLE001 - unreadable environ: not known to be a rank
        return None
    spawned = "LOCAL_RANK" not in env and ranks.child_is_spawned_trainer(pid, root)
    if "LOCAL_RANK" not in env and not spawned:
        return None
    try:
        parent = inspect(inspect(pid, root).ppid, root)
    except Exception:  # noqa: BLE001
        return None
    if not parent.is_python:
        return None
    siblings = 0
    for kid in parent.children:
        if spawned:
            siblings += ranks.child_is_spawned_trainer(kid, root)
            continue
        if ranks.is_worker_comm(_comm(kid, root)):
            continue
        try:
            kenv = procfs.parse_environ_whitelist(procfs.read_bytes(root, f"proc/{kid}/environ"), ("LOCAL_RANK",))
        except Exception:  # noqa: BLE001
            continue
        siblings += "LOCAL_RANK" in kenv
    return parent.pid if siblings >= 2 else None


def _comm(pid: int, root: str = "/") -> str | None:
    try:
        return procfs.read_text(root, f"proc/{pid}/comm").strip()
    except Exception:  # noqa: BLE001 - gone or unreadable: no name
        return None


def trainer_of_worker(pid: int, root: str = "/") -> int | None:
    """If `pid` is one of torch's DataLoader worker processes (named pt_data_worker from torch 2.4 on),
    the PID of the Python process that started it: the training process a diagnosis watches, with
    its workers. Else None (an older torch's workers carry no name of their own)."""
    from trainprobe.probes.support import ranks
    if not ranks.is_worker_comm(_comm(pid, root)):
        return None
    try:
        parent = inspect(inspect(pid, root).ppid, root)
    except Exception:  # noqa: BLE001 - parent gone or unreadable
        return None
    return parent.pid if parent.is_python and not ranks.is_worker_comm(parent.comm) else None
