"""Readers and pure parsers for /proc and /sys. Every reader takes a root (default "/").

Process facts (parents, states, threads, CPU times, context switches, affinity, memory) come
from psutil, through `process()` and the helpers below, with psutil's exceptions translated into
the probes.errors taxonomy. /proc is read directly only for what psutil lacks: per-thread names,
states, context switches and last CPU, schedstat, numa_maps, wchan, syscall, the cgroup, the
mapped libraries, the whitelisted environment keys, and the kernel's own child lists (psutil
finds children by reading every process's stat file, which costs too much to repeat every 0.25 s
on a busy node; it stays the fallback where the kernel keeps no child list). Parsers take text and return values;
readers join a root and a path, read, and translate OSErrors into the taxonomy.
"""
from __future__ import annotations

import os
import time
from contextlib import contextmanager
from typing import Any, Iterable, Iterator

import psutil

from trainprobe.probes.parsers import envvars, redact
from trainprobe.probes.errors import ProbeError, parser, translate_oserror, translate_psutil_error

CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

# The only environment variables trainprobe ever reads from another process. Nothing else from a
# process environment may appear in any output.
ENV_WHITELIST = ("CUDA_VISIBLE_DEVICES", "LOCAL_RANK")


MAX_CPUS = 1 << 16           # a cpulist naming more CPUs than this is not from a kernel

# The target chooses its shape; these bound what one run reads and keeps of it (docs/security.md).
# A process's threads read in detail (stat, status, schedstat): the main thread and the lowest
# thread ids, up to this many. A large PyTorch process has a few hundred threads; a process with
# 10,000 would otherwise cost 30,000 reads per snapshot and a report of 10,000 rows. The process's
# own CPU time still counts every thread.
MAX_THREADS_READ = 512
# Processes of one job a probe follows (first sight, environment, snapshots): a job forking
# short-lived children as fast as it can is followed this far, and its other children counted.
MAX_PROCESSES_FOLLOWED = 256
# A command line kept of the target: its first arguments, whole, up to this many characters (the
# rest said as a count). The kernel allows a megabyte or more; a report carries a line, not that.
MAX_ARGV_CHARS = 8192


def path(root: str, *parts: str) -> str:
    return os.path.join(root, *[p.lstrip("/") for p in parts])


def read_text(root: str, rel: str) -> str:
    p = path(root, rel)
    try:
        with open(p, "r", errors="replace") as fh:
            return fh.read()
    except OSError as exc:
        raise translate_oserror(exc, p) from None


def read_bytes(root: str, rel: str) -> bytes:
    p = path(root, rel)
    try:
        with open(p, "rb") as fh:
            return fh.read()
    except OSError as exc:
        raise translate_oserror(exc, p) from None


def try_read_text(root: str, rel: str) -> str | None:
    try:
        return read_text(root, rel)
    except Exception:  # noqa: BLE001 - optional files: absence is a value
        return None


# -- pure parsers -------------------------------------------------------------------------------

@parser("/proc parse_cpulist")
def parse_cpulist(text: str | None) -> list[int]:
    """'0-3,8,10-11' -> [0, 1, 2, 3, 8, 10, 11]. Empty or None -> []."""
    cpus: list[int] = []
    if not text:
        return cpus
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            lo, hi = part.split("-", 1)
            if int(hi) - int(lo) > MAX_CPUS or int(hi) > MAX_CPUS:
                raise ValueError(f"CPU range {part} is larger than any machine's")
            cpus.extend(range(int(lo), int(hi) + 1))
        else:
            cpus.append(int(part))
    return cpus


def format_cpulist(cpus: list[int]) -> str:
    """[0, 1, 2, 3, 8] -> '0-3,8'."""
    out: list[str] = []
    s = sorted(set(cpus))
    i = 0
    while i < len(s):
        j = i
        while j + 1 < len(s) and s[j + 1] == s[j] + 1:
            j += 1
        out.append(str(s[i]) if i == j else f"{s[i]}-{s[j]}")
        i = j + 1
    return ",".join(out)


@parser("/proc parse_stat")
def parse_stat(text: str) -> dict[str, Any]:
    """/proc/PID/stat or /proc/PID/task/TID/stat. The comm field may hold spaces and parentheses."""
    lpar, rpar = text.index("("), text.rindex(")")
    comm = text[lpar + 1:rpar]
    rest = text[rpar + 2:].split()
    # rest[0] is field 3 (state); field n is rest[n - 3]
    def f(n: int) -> int:
        return int(rest[n - 3])
    return {
        "pid": int(text[:lpar].strip()), "comm": comm, "state": rest[0], "ppid": f(4),
        "flags": f(9), "minflt": f(10), "majflt": f(12),
        "utime_s": f(14) / CLK_TCK, "stime_s": f(15) / CLK_TCK,
        "num_threads": f(20), "starttime_ticks": f(22),
        "processor": f(39) if len(rest) > 36 else None,
    }


PF_KTHREAD = 0x00200000


def is_running(root: str, pid: int) -> bool:
    """Whether a process exists and is not a zombie (or dead): one read of /proc/PID/stat, for the
    checks repeated through a window (psutil's handle costs several reads)."""
    text = try_read_text(root, f"proc/{pid}/stat")
    if not text or ")" not in text:
        return False
    rest = text[text.rindex(")") + 1:].split()
    return bool(rest) and rest[0] not in ("Z", "X", "x")


def cpu_seconds(root: str, pid: int) -> float:
    """A process's user + system CPU seconds from /proc/PID/stat; 0.0 once it is gone."""
    text = try_read_text(root, f"proc/{pid}/stat")
    if not text:
        return 0.0
    st = parse_stat(text)
    return st["utime_s"] + st["stime_s"]


@parser("/proc parse_status")
def parse_status(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in text.splitlines():
        if ":" in line:
            k, v = line.split(":", 1)
            out[k.strip()] = v.strip()
    return out


def per_cpu_times(text: str) -> dict[int, dict[str, float]]:
    """/proc/stat's cpuN lines -> per CPU, seconds of user+nice+system (busy), idle+iowait, irq+softirq, steal."""
    out: dict[int, dict[str, float]] = {}
    tck = float(CLK_TCK)
    for line in text.splitlines():
        f = line.split()
        if not f or not f[0].startswith("cpu") or f[0] == "cpu" or not f[0][3:].isdigit():
            continue
        v = [int(x) for x in f[1:]] + [0] * 10
        user, nice, system, idle, iowait, irq, softirq, steal, guest, guest_nice = v[:10]
        # guest time is already inside user (the kernel adds it there): not counted twice.
        out[int(f[0][3:])] = {"run": (user + nice + system) / tck, "idle": (idle + iowait) / tck,
                              "irq": (irq + softirq) / tck, "steal": steal / tck}
    return out


@parser("/proc parse_schedstat")
def parse_schedstat(text: str | None) -> dict[str, float] | None:
    """/proc/PID/task/TID/schedstat: on-CPU ns, run-queue wait ns, timeslices."""
    if not text:
        return None
    parts = text.split()
    if len(parts) < 3:
        return None
    return {"run_s": int(parts[0]) / 1e9, "wait_s": int(parts[1]) / 1e9, "timeslices": int(parts[2])}


def bounded_argv(args: Iterable[str], max_chars: int = MAX_ARGV_CHARS) -> list[str]:
    """An argv as trainprobe keeps it: credentials redacted (probes.parsers.redact), and only its
    first arguments up to `max_chars` characters. Arguments are kept whole or not at all, and
    redacted whole, so no part of a secret survives a cut; what is left out is said in one last
    element, `...[N more arguments, M characters not shown]`."""
    kept: list[str] = []
    used = 0
    more_args = more_chars = 0
    for a in args:
        if not a:
            continue
        if more_args or (used + len(a) > max_chars and kept):
            more_args += 1
            more_chars += len(a)
            continue
        kept.append(a)
        used += len(a) + 1
    out = redact.argv(kept)
    if out and len(out[0]) > max_chars:          # one argument longer than the whole allowance
        more_chars += len(out[0]) - max_chars
        out[0] = out[0][:max_chars]              # redacted before the cut: no secret is split
    if more_args or more_chars:
        out.append(f"...[{more_args} more arguments, {more_chars} characters not shown]")
    return out


@parser("/proc parse_argv")
def parse_argv(raw: bytes | str) -> list[str]:
    """/proc/PID/cmdline -> the argv list, redacted and bounded (bounded_argv)."""
    if isinstance(raw, str):
        raw = raw.encode()
    return bounded_argv(a.decode(errors="replace") for a in raw.split(b"\0") if a)


def parse_cmdline(raw: bytes | str) -> str:
    """/proc/PID/cmdline -> one line, with credentials redacted (probes.parsers.redact)."""
    return " ".join(parse_argv(raw))


@parser("/proc parse_environ_whitelist")
def parse_environ_whitelist(raw: bytes, names: tuple[str, ...] = ENV_WHITELIST) -> dict[str, str]:
    """Keep only whitelisted variables: nothing else from the environment leaves this function."""
    keep = {n.encode() for n in names}
    out: dict[str, str] = {}
    for item in raw.split(b"\0"):
        k, sep, v = item.partition(b"=")
        if sep and k in keep:
            out[k.decode()] = envvars.normalize(k.decode(), v.decode(errors="replace"))   # bounded, validated
    return out


@parser("/proc parse_maps_libraries")
def parse_maps_libraries(text: str) -> list[str]:
    """Distinct shared-object paths mapped by a process."""
    libs: set[str] = set()
    for line in text.splitlines():
        if ".so" not in line:      # thread stacks and anonymous memory: most lines of a large process
            continue
        parts = line.split(None, 5)
        if len(parts) == 6 and ".so" in parts[5]:
            libs.add(parts[5].strip())
    return sorted(libs)


@parser("/proc parse_cpu_max")
def parse_cpu_max(text: str | None) -> float | None:
    """cgroup v2 cpu.max ('max 100000' or '200000 100000') -> cores, or None if unlimited."""
    if not text:
        return None
    parts = text.split()
    if len(parts) != 2 or parts[0] == "max":
        return None
    return int(parts[0]) / int(parts[1])


@parser("/proc parse_cgroup_v2_path")
def parse_cgroup_v2_path(text: str | None) -> str | None:
    if not text:
        return None
    for line in text.splitlines():
        if line.startswith("0::"):
            return line[3:].strip()
    return None


# -- processes, through psutil -------------------------------------------------------------------

# psutil's own names for the states /proc/PID/stat prints as one letter.
PSUTIL_STATE = {
    psutil.STATUS_RUNNING: "R", psutil.STATUS_SLEEPING: "S", psutil.STATUS_DISK_SLEEP: "D",
    psutil.STATUS_STOPPED: "T", psutil.STATUS_TRACING_STOP: "t", psutil.STATUS_ZOMBIE: "Z",
    psutil.STATUS_DEAD: "X", psutil.STATUS_WAKING: "W", psutil.STATUS_PARKED: "P", psutil.STATUS_IDLE: "I",
}


def _use_root(root: str) -> None:
    # psutil reads one /proc per interpreter; trainprobe uses one root per run.
    want = path(root, "proc") if root not in ("", "/") else "/proc"
    if psutil.PROCFS_PATH != want:
        psutil.PROCFS_PATH = want


def process(pid: int, root: str = "/") -> psutil.Process:
    """psutil's handle on a process; a missing one raises TargetGone (the taxonomy, not psutil's)."""
    _use_root(root)
    try:
        return psutil.Process(pid)
    except (psutil.Error, OSError) as exc:   # OSError: a root that is no whole /proc
        raise translate_psutil_error(exc, f"process {pid}") from None


@contextmanager
def ps_errors(what: str) -> Iterator[None]:
    """Translate psutil's exceptions raised inside the block into the taxonomy."""
    try:
        yield
    except (psutil.Error, OSError) as exc:
        raise translate_psutil_error(exc, what) from None


def process_fact(pid: int, fact: str, root: str = "/") -> Any:
    """One psutil fact of a process ('ppid', 'status', 'cpu_times', 'exe'), or None when the process
    is gone or unreadable."""
    try:
        with ps_errors(f"process {pid}"):
            return getattr(process(pid, root), fact)()
    except ProbeError:
        return None


def state_letter(status: str) -> str:
    """psutil's status ('sleeping') -> the letter of /proc/PID/stat ('S')."""
    return PSUTIL_STATE.get(status, "?")


def thread_count(root: str, pid: int) -> int | None:
    """How many threads a process has, without listing them: procfs counts a process's threads in
    the link count of its task directory (2 + threads; a captured tree's directory counts its
    subdirectories the same way). None when it is gone or the count is not kept (a file system
    that always says 1)."""
    try:
        n = os.stat(path(root, f"proc/{pid}/task")).st_nlink - 2
    except OSError:
        return None
    return n if n > 0 else None


def task_ids(root: str, pid: int, limit: int = MAX_THREADS_READ) -> tuple[list[str], int]:
    """The thread ids of a process to read in detail, and how many threads it has: the main thread
    and the first ids listed after it, at most `limit` (MAX_THREADS_READ); the listing is read only
    that far (procfs lists a process's threads leader first). ([], 0) when it is gone."""
    tids: list[str] = []
    try:
        with os.scandir(path(root, f"proc/{pid}/task")) as it:
            for entry in it:
                tids.append(entry.name)
                if len(tids) > limit:
                    break
    except OSError:
        return [], 0
    if len(tids) <= limit:
        return sorted(tids, key=_tid_key), len(tids)
    total = thread_count(root, pid) or len(tids)
    rest = sorted((t for t in tids if t != str(pid)), key=_tid_key)
    head = [str(pid)] if os.path.isdir(path(root, f"proc/{pid}/task/{pid}")) else []
    return head + rest[:limit - len(head)], max(total, limit + 1)


def _tid_key(tid: str) -> int:
    return int(tid) if tid.isdigit() else 1 << 62


def _listed_children(pid: int, root: str, tids: list[str] | None = None) -> list[int] | None:
    """The kernel's own list of a process's children (/proc/PID/task/*/children): it costs a read
    per thread of the process, where psutil's children() reads the stat file of every process on
    the host. None when the kernel has no such file (built without CONFIG_PROC_CHILDREN)."""
    if tids is None:
        tasks = path(root, f"proc/{pid}/task")
        try:
            tids = os.listdir(tasks)
        except OSError as exc:
            raise translate_oserror(exc, tasks) from None
    kids: set[int] = set()
    listed = False
    for tid in tids:
        text = try_read_text(root, f"proc/{pid}/task/{tid}/children")
        if text is not None:
            listed = True
            kids.update(int(x) for x in text.split())
    return sorted(kids) if listed or not tids else None


SCAN_ABOVE_THREADS = 64      # a process with more threads may be cheaper to answer by a host scan


class _ParentScan:
    """Every process's parent, from one pass over proc/*/stat, made at most once per walk and only
    when needed: cheaper than the kernel's child lists for a process with more threads than the
    host has processes (each thread keeps its own list: 10,000 threads are 10,000 reads a listing)."""

    def __init__(self, root: str):
        self.root = root
        self._names: list[str] | None = None
        self._kids: dict[int, list[int]] | None = None

    @property
    def host_processes(self) -> int:
        if self._names is None:
            try:
                self._names = [n for n in os.listdir(path(self.root, "proc")) if n.isdigit()]
            except OSError:
                self._names = []
        return len(self._names)

    def children(self, pid: int) -> list[int]:
        if self._kids is None:
            self._kids = {}
            for n in self._names or []:
                text = try_read_text(self.root, f"proc/{n}/stat")
                if not text or ")" not in text:
                    continue
                rest = text[text.rindex(")") + 2:].split()
                if len(rest) > 1 and rest[1].isdigit():
                    self._kids.setdefault(int(rest[1]), []).append(int(n))
        return sorted(self._kids.get(pid, []))


def children_of(pid: int, root: str = "/", scan: _ParentScan | None = None) -> list[int]:
    """Direct children of a process: the kernel's list where it keeps one, else psutil's scan.
    A process with more threads than the host has processes is answered from one pass over every
    process's stat instead (`scan`, shared by a walk). A captured tree is read from its files only
    (psutil reads a whole live /proc)."""
    n = thread_count(root, pid)
    if n is not None and n > SCAN_ABOVE_THREADS:
        scan = scan or _ParentScan(root)
        if 0 < scan.host_processes < n:
            return scan.children(pid)
    tasks = path(root, f"proc/{pid}/task")
    try:
        tids = os.listdir(tasks)
    except OSError as exc:
        raise translate_oserror(exc, tasks) from None
    kids = _listed_children(pid, root, tids)
    if kids is not None:
        return kids
    if root not in ("", "/"):
        return []
    with ps_errors(f"process {pid}"):
        return sorted(c.pid for c in process(pid, root).children())


def descendants_of(pid: int, root: str = "/", limit: int = 4 * MAX_PROCESSES_FOLLOWED) -> list[tuple[int, int]]:
    """(pid, parent pid) for every descendant, breadth first, at most `limit` of them (a job forking
    without end is not walked without end). Processes that vanish during the walk are skipped."""
    out: list[tuple[int, int]] = []
    frontier, seen = [pid], {pid}
    scan = _ParentScan(root)
    while frontier and len(out) < limit:
        p = frontier.pop(0)
        try:
            kids = children_of(p, root, scan)
        except ProbeError:    # a process that exits mid-walk has no children
            continue
        for k in kids:
            if k not in seen and len(out) < limit:
                seen.add(k)
                out.append((k, p))
                frontier.append(k)
    return out


def cpus_online(root: str = "/") -> list[int]:
    text = try_read_text(root, "sys/devices/system/cpu/online")
    cpus = parse_cpulist(text)
    return cpus or list(range(os.cpu_count() or 1))


def numa_node_count(root: str = "/") -> int:
    text = try_read_text(root, "sys/devices/system/node/online")
    nodes = parse_cpulist(text)
    return len(nodes) or 1


def cpu_capacity(pid: int, root: str = "/") -> tuple[float, str]:
    """The CPUs a process may use: its affinity, capped by its cgroup v2 quota, and how that was read."""
    status = parse_status(try_read_text(root, f"proc/{pid}/status") or "")
    allowed = parse_cpulist(status.get("Cpus_allowed_list"))
    cpus = float(len(allowed) or len(cpus_online(root)))
    basis = f"{len(allowed)} CPUs in its affinity" if allowed else f"{int(cpus)} CPUs online"
    cgroup = parse_cgroup_v2_path(try_read_text(root, f"proc/{pid}/cgroup"))
    quota = parse_cpu_max(try_read_text(root, f"sys/fs/cgroup/{cgroup.lstrip('/')}/cpu.max")) if cgroup else None
    if quota is not None and quota < cpus:
        cpus, basis = quota, f"cgroup quota of {quota:g} CPUs ({basis})"
    return cpus, basis


def thread_ids(root: str, pid: int) -> list[str]:
    """The thread ids of `pid` (/proc/PID/task), in numeric order; [] when it cannot be listed."""
    try:
        return sorted(os.listdir(path(root, f"proc/{pid}/task")), key=lambda t: int(t) if t.isdigit() else 0)
    except OSError:
        return []


def task_snapshot(root: str, pid: int, limit: int = 1024) -> dict[str, Any]:
    """The raw /proc/PID/task/TID/{stat,schedstat} of each thread of `pid` (at most `limit`), with the
    monotonic time."""
    tasks: dict[str, dict[str, str | None]] = {}
    for tid in thread_ids(root, pid)[:limit]:
        stat = try_read_text(root, f"proc/{pid}/task/{tid}/stat")
        if stat:
            tasks[tid] = {"stat": stat, "schedstat": try_read_text(root, f"proc/{pid}/task/{tid}/schedstat")}
    return {"t": round(time.monotonic(), 6), "tasks": tasks}


def thread_cpu_shares(tasks: dict[str, Any] | None) -> tuple[dict[int, tuple[float, float | None]], float | None]:
    """tid -> (share of the window on a CPU, share waiting for one) between the two snapshots."""
    if not tasks or not isinstance(tasks.get("start"), dict) or not isinstance(tasks.get("end"), dict):
        return {}, None
    s, e = tasks["start"], tasks["end"]
    win = float(e.get("t") or 0.0) - float(s.get("t") or 0.0)
    if win <= 0.05:
        return {}, None
    out: dict[int, tuple[float, float | None]] = {}
    for tid, te in (e.get("tasks") or {}).items():
        ts = (s.get("tasks") or {}).get(tid)
        if not ts or not str(tid).isdigit():
            continue
        a, b = parse_stat(ts["stat"]), parse_stat(te["stat"])
        cpu = (b["utime_s"] + b["stime_s"]) - (a["utime_s"] + a["stime_s"])
        sa, sb = parse_schedstat(ts.get("schedstat")), parse_schedstat(te.get("schedstat"))
        if sa and sb:
            cpu = sb["run_s"] - sa["run_s"]          # ns counters: finer than clock ticks
            rq: float | None = max(0.0, sb["wait_s"] - sa["wait_s"]) / win
        else:
            rq = None
        out[int(tid)] = (min(max(cpu, 0.0) / win, 1.0), None if rq is None else min(rq, 1.0))
    return out, win
