"""Where a thread's CPU goes, by library: the kernel's software CPU clock sampled per thread.

One perf event per thread (perf_event_open(2): PERF_TYPE_SOFTWARE / PERF_COUNT_SW_CPU_CLOCK, a
sample every PERIOD_NS of the thread's own CPU time, PERF_SAMPLE_IP | PERF_SAMPLE_TID), each with a
small ring buffer read once when the window ends. The CPU clock is a software event: it needs no
hardware PMU (virtual machines without one count it), no BPF and no compiler. Each sample's
instruction pointer is placed in the process's mappings: in the kernel, in the OpenMP runtime
(libgomp, libiomp, libomp: an intra-op thread there spins or waits at a barrier for the others), or
elsewhere in user space (work). That split is the one /proc cannot give: a spinning OpenMP thread's
CPU time reads exactly like a working one's.

Nothing is changed in the target: the events are per-thread counters the kernel samples on its own
timer; they are closed (detached) when the window ends, whatever happens. Each sample is a timer
interrupt in the sampled thread, paid by the job, not by the agent: measured with
benchmarks/bench_oncpu_cost.py (docs/cost.md), 19-43 us of the job's wall time a sample on the 2-CPU
VM (at 10 ms, 0.4-0.9% of a loop and its intra-op thread while the window is open), and none
resolved on the H200 node (a 16-thread team at 16,000 samples a second ran at 0.999 of its pace). Opening one needs root,
CAP_PERFMON, or kernel.perf_event_paranoid <= 2 for the caller's own processes (user space only
then: samples in the kernel are not taken).
"""
from __future__ import annotations

import errno
import mmap
import os
import struct
from typing import Any

PERF_TYPE_SOFTWARE = 1
PERF_COUNT_SW_CPU_CLOCK = 0
PERF_SAMPLE_IP = 1
PERF_SAMPLE_TID = 2
PERF_RECORD_LOST = 2
PERF_RECORD_SAMPLE = 9
MISC_CPUMODE_MASK = 7
MISC_KERNEL = 1
MISC_USER = 2
ATTR_SIZE = 112                 # PERF_ATTR_SIZE_VER5
FLAG_EXCLUDE_KERNEL = 1 << 5
FLAG_EXCLUDE_HV = 1 << 6
SYSCALL_NR = {"x86_64": 298, "aarch64": 241}
PERIOD_NS = 10_000_000          # one sample per 10 ms of a thread's CPU (100 Hz while it runs)
MAX_THREADS = 64
RECORD = struct.Struct("<IHHQII")   # header (type, misc, size), ip, pid, tid
OPENMP_LIBS = ("libgomp", "libiomp", "libomp")


class ThreadSamples:
    __slots__ = ("total", "kernel", "openmp")

    def __init__(self) -> None:
        self.total = self.kernel = self.openmp = 0

    def as_list(self) -> list[int]:
        return [self.total, self.kernel, self.openmp]


class Sampler:
    """Open events (tid -> (fd, mmap)); `reason` says why none could be opened. (Plain classes, not
    dataclasses: this module is imported on every diagnosis's start-up.)"""

    def __init__(self, ranges: list[tuple[int, int, str]] | None = None, pages: int = 0,
                 reason: str | None = None, period_ns: int = PERIOD_NS):
        self.events: dict[int, tuple[int, mmap.mmap]] = {}
        self.pages, self.reason, self.user_only, self.period_ns = pages, reason, False, period_ns
        self.ranges = ranges or []

    def close(self) -> None:
        for fd, mm in self.events.values():
            try:
                mm.close()
            finally:
                os.close(fd)
        self.events = {}


def openmp_ranges(maps_text: str) -> list[tuple[int, int, str]]:
    """The executable mappings of an OpenMP runtime in a /proc/PID/maps text: (start, end, path)."""
    out = []
    for line in maps_text.splitlines():
        parts = line.split(None, 5)
        if len(parts) < 6 or "x" not in parts[1]:
            continue
        name = os.path.basename(parts[5].strip())
        if any(name.startswith(lib) for lib in OPENMP_LIBS):
            lo, hi = parts[0].split("-")
            out.append((int(lo, 16), int(hi, 16), parts[5].strip()))
    return out


def _attr(user_only: bool, period_ns: int) -> Any:
    import ctypes   # noqa: PLC0415 - only where events are opened
    buf = ctypes.create_string_buffer(ATTR_SIZE)
    flags = FLAG_EXCLUDE_HV | (FLAG_EXCLUDE_KERNEL if user_only else 0)
    struct.pack_into("<IIQQQQQ", buf, 0, PERF_TYPE_SOFTWARE, ATTR_SIZE, PERF_COUNT_SW_CPU_CLOCK, period_ns,
                     PERF_SAMPLE_IP | PERF_SAMPLE_TID, 0, flags)
    return buf


def _pages_for(window_s: float, period_ns: int = PERIOD_NS) -> int:
    need = window_s * (1e9 / period_ns) * RECORD.size * 1.5
    pages = 4
    while pages * mmap.PAGESIZE < need and pages < 64:
        pages *= 2
    return pages


def start(tids: list[int], maps_text: str, window_s: float, period_ns: int = PERIOD_NS) -> Sampler:
    """Open one event per thread (at most MAX_THREADS), a sample every `period_ns` of each thread's
    CPU; a Sampler with `reason` when none opened."""
    import ctypes   # noqa: PLC0415 - only where events are opened
    s = Sampler(ranges=openmp_ranges(maps_text), pages=_pages_for(window_s, period_ns), period_ns=period_ns)
    machine = os.uname().machine
    nr = SYSCALL_NR.get(machine)
    if nr is None:
        s.reason = f"perf_event_open's number is not known on {machine}"
        return s
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    first_err = 0
    for tid in tids[:MAX_THREADS]:
        fd = -1
        for user_only in ((s.user_only,) if s.events else (False, True)):
            fd = libc.syscall(nr, _attr(user_only, period_ns), ctypes.c_int(tid), ctypes.c_int(-1), ctypes.c_int(-1),
                              ctypes.c_ulong(0))
            if fd >= 0:
                s.user_only = user_only
                break
            first_err = first_err or ctypes.get_errno()
        if fd < 0:
            continue
        try:
            mm = mmap.mmap(fd, (1 + s.pages) * mmap.PAGESIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except OSError as e:
            os.close(fd)
            first_err = first_err or (e.errno or errno.ENOMEM)
            continue
        s.events[tid] = (fd, mm)
    if not s.events:
        name = errno.errorcode.get(first_err, str(first_err)) if first_err else "no thread"
        s.reason = ("perf_event_open was refused (" + name + "): root, CAP_PERFMON or kernel.perf_event_paranoid "
                    "<= 2 is needed" if first_err in (errno.EACCES, errno.EPERM) else
                    f"perf_event_open failed ({name})")
    return s


def read(s: Sampler) -> dict[str, Any]:
    """Close the events and count each thread's samples: {tid: [total, kernel, openmp]}, lost."""
    out: dict[str, list[int]] = {}
    lost = 0
    try:
        for tid, (_fd, mm) in s.events.items():
            c, n_lost = _count(mm, s.pages, s.ranges)
            out[str(tid)] = c.as_list()
            lost += n_lost
    finally:
        s.close()
    return {"threads": out, "lost": lost, "period_ms": s.period_ns / 1e6, "user_only": s.user_only,
            "openmp_runtime": sorted({p for _lo, _hi, p in s.ranges})}


def _count(mm: mmap.mmap, pages: int, ranges: list[tuple[int, int, str]]) -> tuple[ThreadSamples, int]:
    page = mmap.PAGESIZE
    head = struct.unpack_from("<Q", mm, 1024)[0]
    off, size = struct.unpack_from("<QQ", mm, 1040)
    if not off or not size:
        off, size = page, pages * page
    c, lost, pos = ThreadSamples(), 0, max(0, head - size)
    data = mm[off:off + size]
    while pos + 8 <= head:
        at = pos % size
        hdr = data[at:at + 8] if at + 8 <= size else data[at:] + data[:at + 8 - size]
        typ, misc, rsize = struct.unpack("<IHH", hdr)
        if rsize < 8:
            break
        body = data[at:at + rsize] if at + rsize <= size else data[at:] + data[:at + rsize - size]
        if typ == PERF_RECORD_SAMPLE and rsize >= RECORD.size:
            ip = RECORD.unpack_from(body, 0)[3]
            c.total += 1
            mode = misc & MISC_CPUMODE_MASK
            if mode == MISC_KERNEL:
                c.kernel += 1
            elif mode == MISC_USER and any(lo <= ip < hi for lo, hi, _p in ranges):
                c.openmp += 1
        elif typ == PERF_RECORD_LOST and rsize >= 24:
            lost += struct.unpack_from("<Q", body, 16)[0]
        pos += rsize
    return c, lost
