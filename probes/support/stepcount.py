"""How many steps the loop makes: its backward passes, counted by the kernel at torch's autograd engine.

Every training step calls `torch::autograd::Engine::execute` (libtorch_cpu.so) once per backward
pass, from the thread that calls `.backward()`, whether the model is eager or compiled (a compiled
backward still runs as one node of the engine's graph). A uprobe on that function's entry, opened as
a counting perf event per thread of the training process (perf_event_open(2) with the kernel's
uprobe PMU, /sys/bus/event_source/devices/uprobe: no BPF, no compiler, no sampling), counts the
backward passes of the window: with the window's length, the step's length, which py-spy's 20-100
Hz samples cannot resolve on a job of 8 ms steps (a loop that hands each batch from a worker pays a
cost per batch, not per second of loading: the step model needs the rate).

The function's file offset is read from the library's dynamic symbol table (its mangled name's
prefix: the signature changes between torch releases, the name does not). Nothing in the target is
changed for good: the kernel puts a breakpoint on the function's first instruction in the process's
own copy of that page (the file is untouched) while an event is open, and takes it out when the
last one closes, which happens when the window ends, or with the agent's process, however it ends.
A hit costs the loop's thread a trap, about 1-3 us. Opening the events needs root or CAP_PERFMON
(the uprobe PMU refuses others).
"""
from __future__ import annotations

import errno
import mmap
import os
import struct
import time
from typing import Any

from trainprobe.probes.support.oncpu import ATTR_SIZE, MAX_THREADS, SYSCALL_NR

ENGINE_EXECUTE = b"_ZN5torch8autograd6Engine7executeE"   # torch::autograd::Engine::execute(...)
LIBRARY = "libtorch_cpu"
UPROBE_TYPE = "/sys/bus/event_source/devices/uprobe/type"
SHT_DYNSYM = 11
PT_LOAD = 1
EHDR = struct.Struct("<16sHHIQQQIHHHHHH")
SHDR = struct.Struct("<IIQQQQIIQQ")
PHDR = struct.Struct("<IIQQQQQQ")
SYM = struct.Struct("<IBBHQQ")


class Counter:
    """Open counting events (tid -> fd) and their start counts; `reason` says why none is open.
    (A plain class: this module is imported on every diagnosis's start-up.)"""

    def __init__(self, reason: str | None = None):
        self.fds: dict[int, int] = {}
        self.reason = reason
        self.library = ""
        self.t0 = 0.0

    def close(self) -> None:
        for fd in self.fds.values():
            try:
                os.close(fd)
            except OSError:
                pass
        self.fds = {}


def library_path(maps_text: str) -> str | None:
    """The path of torch's CPU library among a /proc/PID/maps text's executable mappings."""
    for line in maps_text.splitlines():
        parts = line.split(None, 5)
        if len(parts) == 6 and "x" in parts[1] and os.path.basename(parts[5].strip()).startswith(LIBRARY):
            return parts[5].strip()
    return None


def symbol_offset(path: str, prefix: bytes = ENGINE_EXECUTE) -> int | None:
    """The file offset of the first dynamic symbol whose name starts with `prefix` (a uprobe's offset),
    None where the library has none. Reads the section headers, the dynamic string table's match and
    the program headers; the library is mapped, not read (a CUDA build's is over 1 GB)."""
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        eh = EHDR.unpack_from(mm, 0)
        if eh[0][:4] != b"\x7fELF" or eh[0][4] != 2:   # 64-bit ELF only
            return None
        phoff, shoff, phnum, shnum = eh[5], eh[6], eh[10], eh[12]
        shdrs = [SHDR.unpack_from(mm, shoff + i * SHDR.size) for i in range(shnum)]
        dynsym = next((s for s in shdrs if s[1] == SHT_DYNSYM), None)
        if dynsym is None or dynsym[6] >= len(shdrs):
            return None
        strtab = shdrs[dynsym[6]]
        at = mm.find(b"\0" + prefix, strtab[4], strtab[4] + strtab[5])
        if at < 0:
            return None
        key = struct.pack("<I", at + 1 - strtab[4])
        lo, hi = dynsym[4], dynsym[4] + dynsym[5]
        pos = mm.find(key, lo, hi)
        while pos >= 0 and (pos - lo) % SYM.size:
            pos = mm.find(key, pos + 1, hi)
        if pos < 0:
            return None
        value = SYM.unpack_from(mm, pos)[4]
        for i in range(phnum):
            p = PHDR.unpack_from(mm, phoff + i * PHDR.size)
            if p[0] == PT_LOAD and p[3] <= value < p[3] + p[5]:
                return value - p[3] + p[2]
        return None
    finally:
        mm.close()


_OFFSETS: dict[tuple[int, int, int], int | None] = {}


def _offset_of(path: str) -> int | None:
    """symbol_offset, read once per library file (a launcher's ranks map the same one: its symbol
    table is searched once, not once a rank)."""
    st = os.stat(path)
    key = (st.st_dev, st.st_ino, st.st_mtime_ns)
    if key not in _OFFSETS:
        _OFFSETS[key] = symbol_offset(path)
    return _OFFSETS[key]


def _attr(uprobe_type: int, path_buf: Any, offset: int) -> Any:
    import ctypes   # noqa: PLC0415 - only where events are opened
    buf = ctypes.create_string_buffer(ATTR_SIZE)
    struct.pack_into("<IIQQQQQ", buf, 0, uprobe_type, ATTR_SIZE, 0, 0, 0, 0, 0)
    struct.pack_into("<QQ", buf, 56, ctypes.addressof(path_buf), offset)   # uprobe_path, probe_offset
    return buf


def start(tids: list[int], maps_text: str, pid: int | None = None) -> Counter:
    """Open one counting uprobe event per thread (at most MAX_THREADS) at the autograd engine's entry;
    a Counter with `reason` where none could be opened. The library is opened through the target's
    root (/proc/PID/root: a job in a container maps its own torch, which the agent's mount namespace
    may not have at that path, or have another one there); the kernel resolves the uprobe's path
    the same way, to the inode the job runs."""
    path = library_path(maps_text)
    if path is None:
        return Counter("the process does not map torch's CPU library")
    target_path = path
    if pid is not None and os.path.exists(f"/proc/{pid}/root{path}"):
        path = f"/proc/{pid}/root{path}"
    nr = SYSCALL_NR.get(os.uname().machine)
    if nr is None:
        return Counter(f"perf_event_open's number is not known on {os.uname().machine}")
    try:
        with open(UPROBE_TYPE) as f:
            uprobe_type = int(f.read().strip())
    except (OSError, ValueError):
        return Counter("the kernel has no uprobe PMU (" + UPROBE_TYPE + ")")
    try:
        offset = _offset_of(path)
    except (OSError, ValueError, struct.error) as e:
        return Counter(f"torch's CPU library could not be read ({e.__class__.__name__}: {e})")
    if offset is None:
        return Counter("torch's CPU library exports no torch::autograd::Engine::execute")
    import ctypes   # noqa: PLC0415
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    path_buf = ctypes.create_string_buffer(path.encode())
    attr = _attr(uprobe_type, path_buf, offset)
    c, first_err = Counter(), 0
    c.library = target_path
    for tid in tids[:MAX_THREADS]:
        fd = libc.syscall(nr, attr, ctypes.c_int(tid), ctypes.c_int(-1), ctypes.c_int(-1), ctypes.c_ulong(0))
        if fd < 0:
            first_err = first_err or ctypes.get_errno()
            continue
        c.fds[tid] = fd
    c.t0 = time.monotonic()
    if not c.fds:
        name = errno.errorcode.get(first_err, str(first_err)) if first_err else "no thread"
        c.reason = ("perf_event_open's uprobe was refused (" + name + "): root or CAP_PERFMON is needed"
                    if first_err in (errno.EACCES, errno.EPERM) else f"perf_event_open's uprobe failed ({name})")
    return c


def read(c: Counter) -> dict[str, Any]:
    """Close the events: {"calls": {tid: n}, "seconds": how long they counted, "library": path}."""
    calls: dict[str, int] = {}
    try:
        for tid, fd in c.fds.items():
            try:
                calls[str(tid)] = struct.unpack("<Q", os.read(fd, 8))[0]
            except OSError:
                continue
        seconds = time.monotonic() - c.t0
    finally:
        c.close()
    return {"calls": calls, "seconds": round(seconds, 3), "library": c.library}
