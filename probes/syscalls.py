"""Syscall probe (bcc): what the training process and each DataLoader worker ask of the kernel.

Attaches BPF programs to `raw_syscalls:sys_enter` and `raw_syscalls:sys_exit` (plus
`sched:sched_process_fork`, so a worker forked during the window is followed from its first
call). Per process and per syscall it counts calls, total and maximum latency, errors and, for the
read family, bytes; reads are also counted per file descriptor (to tell files from pipes, and to
count multiprocessing queue messages, which start with a 4-byte length read) and by size
(quarter-octave buckets). The paths passed to open/openat are sampled (the first 2048 distinct
ones) so a finding can name the directory.

Cost: while attached, these tracepoints slow every system call of every process on the host, not
only the target's (the filter runs inside the program, after the tracepoint fired). The window is
therefore bounded (`syscalls_max_s`, default 5 s), and the probe measures the tax: the CPU time of
a `dd bs=1` calibration before and while attached (one run unwatched, one watched) gives the added
nanoseconds per syscall, and the in-kernel count of the host's syscalls turns it into a share of
the host's CPU, reported in the overhead.
"""
from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import time
from typing import Any

from trainprobe.probes.support import bcc_support as bs
from trainprobe.probes.parsers import procfs
from trainprobe.probes.base import Availability, Capture, Probe, Recorder, WatchSpec
from trainprobe.probes.schema import SyscallsEvidence
from trainprobe.probes.errors import Unavailable
from trainprobe.probes.sched import ProcessTree, read_formats, slot_bounds, _say_mount

TRACEPOINTS = ("raw_syscalls:sys_enter", "raw_syscalls:sys_exit", "sched:sched_process_fork")
DEFAULT_MAX_S = 5.0
REFRESH_S = 0.25
PATH_LEN = 120
CALIBRATION_BLOCKS = 50000          # dd bs=1 count=N: 2N read/write syscalls

# The syscalls the findings reason about, by architecture (bcc's own table is x86_64-only and old).
SYSCALLS: dict[str, dict[str, int]] = {
    "x86_64": {
        "read": 0, "write": 1, "open": 2, "close": 3, "stat": 4, "fstat": 5, "lstat": 6, "poll": 7,
        "lseek": 8, "mmap": 9, "mprotect": 10, "munmap": 11, "brk": 12, "ioctl": 16, "pread64": 17,
        "pwrite64": 18, "readv": 19, "writev": 20, "select": 23, "sched_yield": 24, "madvise": 28,
        "nanosleep": 35, "sendfile": 40, "sendto": 44, "recvfrom": 45, "sendmsg": 46, "recvmsg": 47,
        "clone": 56, "fork": 57, "wait4": 61, "fcntl": 72, "getdents64": 217, "readahead": 187,
        "futex": 202, "fadvise64": 221, "clock_nanosleep": 230, "epoll_wait": 232, "pselect6": 270,
        "ppoll": 271, "epoll_pwait": 281, "openat": 257, "newfstatat": 262, "preadv": 295,
        "pwritev": 296, "copy_file_range": 326, "preadv2": 327, "pwritev2": 328, "statx": 332,
        "io_uring_enter": 426, "clone3": 435, "close_range": 436, "openat2": 437,
    },
    "aarch64": {
        "read": 63, "write": 64, "openat": 56, "close": 57, "getdents64": 61, "lseek": 62,
        "pread64": 67, "pwrite64": 68, "readv": 65, "writev": 66, "preadv": 69, "pwritev": 70,
        "sendfile": 71, "pselect6": 72, "ppoll": 73, "newfstatat": 79, "fstat": 80, "futex": 98,
        "nanosleep": 101, "clock_nanosleep": 115, "sched_yield": 124, "sendto": 206, "recvfrom": 207,
        "sendmsg": 211, "recvmsg": 212, "readahead": 213, "brk": 214, "munmap": 215, "clone": 220,
        "mmap": 222, "fadvise64": 223, "mprotect": 226, "madvise": 233, "wait4": 260,
        "copy_file_range": 285, "preadv2": 286, "pwritev2": 287, "statx": 291, "epoll_pwait": 22,
        "ioctl": 29, "fcntl": 25, "io_uring_enter": 426, "clone3": 435, "close_range": 436, "openat2": 437,
    },
}
READ_FAMILY = ("read", "pread64", "readv", "preadv", "preadv2")
OPEN_FAMILY = ("open", "openat", "openat2")
FILE_META = ("close", "stat", "fstat", "lstat", "newfstatat", "statx", "lseek", "getdents64", "fadvise64")

BPF_TEXT = r"""
#define PATH_LEN __PATH_LEN__
__ENTER_STRUCT__
__EXIT_STRUCT__
__FORK_STRUCT__

struct start_t { u64 ts; u32 nr; s32 fd; };
struct ckey_t { u32 tgid; u32 nr; };
struct cval_t { u64 count; u64 total_ns; u64 max_ns; u64 bytes; u64 errors; };
struct fkey_t { u32 tgid; s32 fd; };
struct rfkey_t { u32 tgid; s32 fd; u32 opened; u32 pad; };
struct fval_t { u64 reads; u64 bytes; u64 four; u64 eof; u64 ns; };
struct span_t { u64 ns; u64 n; };
struct rkey_t { u32 tgid; u32 slot; };
struct pkey_t { u32 tgid; char path[PATH_LEN]; };

BPF_HASH(watch_tgid, u32, u8, 4096);
BPF_HASH(start, u32, struct start_t, 32768);
BPF_HASH(calls, struct ckey_t, struct cval_t, 16384);
BPF_HASH(fds, struct rfkey_t, struct fval_t, 16384);
BPF_HASH(file_fds, struct fkey_t, u64, 65536);
BPF_HASH(spans, u32, struct span_t, 4096);
BPF_HASH(read_sizes, struct rkey_t, u64, 8192);
BPF_HASH(paths, struct pkey_t, u64, 2048);
BPF_PERCPU_ARRAY(events, u64, 2);

__HELPERS__

int trainprb_sysent(struct tp_sys_enter *a) {
    count_event(0);
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32;
    if (!watch_tgid.lookup(&tgid)) return 0;
    u32 tid = (u32)id;
    struct start_t s = {};
    s.ts = bpf_ktime_get_ns();
    s.nr = (u32)a->id;
    u64 arg0 = a->args[0];
    u64 arg1 = a->args[1];
    s.fd = (s32)arg0;
    /* Both arguments are loaded before the call below: the verifier refuses a ctx pointer
       offset chosen at run time, which a conditional load could compile into. */
    start.update(&tid, &s);
    if (s.nr == __NR_CLOSE__) {
        /* A file opened in the window and closed now: the time from its open to its close. */
        struct fkey_t ck = {};
        ck.tgid = tgid;
        ck.fd = s.fd;
        u64 *ots = file_fds.lookup(&ck);
        if (ots) {
            struct span_t sz = {};
            struct span_t *sp = spans.lookup_or_try_init(&tgid, &sz);
            if (sp) { sp->ns += s.ts - *ots; sp->n++; }
            file_fds.delete(&ck);
        }
    }
    if (__IS_OPEN__) {
        struct pkey_t pk = {};
        pk.tgid = tgid;
        const char *fn = (const char *)(__OPEN_PATH__);
        bpf_probe_read_user_str(pk.path, sizeof(pk.path), fn);
        u64 pz = 0;
        u64 *pc = paths.lookup_or_try_init(&pk, &pz);
        if (pc) (*pc)++;
    }
    return 0;
}

int trainprb_sysext(struct tp_sys_exit *a) {
    count_event(1);
    u64 id = bpf_get_current_pid_tgid();
    u32 tid = (u32)id;
    struct start_t *s = start.lookup(&tid);
    if (!s) return 0;
    u64 d = bpf_ktime_get_ns() - s->ts;
    u32 nr = s->nr;
    s32 fd = s->fd;
    u64 t_enter = s->ts;
    start.delete(&tid);
    struct ckey_t k = {};
    k.tgid = id >> 32;
    k.nr = nr;
    struct cval_t cz = {};
    struct cval_t *v = calls.lookup_or_try_init(&k, &cz);
    s64 ret = a->ret;
    if (v) {
        v->count++;
        v->total_ns += d;
        if (d > v->max_ns) v->max_ns = d;
        if (ret < 0) v->errors++;
    }
    if (__IS_OPEN_NR__ && ret >= 0) {
        struct fkey_t ok = {};
        ok.tgid = k.tgid;
        ok.fd = (s32)ret;
        file_fds.update(&ok, &t_enter);
    }
    if (__IS_READ__) {
        if (v && ret > 0) v->bytes += ret;
        struct fkey_t lk = {};
        lk.tgid = k.tgid;
        lk.fd = fd;
        struct rfkey_t fk = {};
        fk.tgid = k.tgid;
        fk.fd = fd;
        fk.opened = file_fds.lookup(&lk) ? 1 : 0;
        struct fval_t fz = {};
        struct fval_t *f = fds.lookup_or_try_init(&fk, &fz);
        if (f) {
            f->reads++;
            f->ns += d;
            if (ret > 0) f->bytes += ret;
            if (ret == 4) f->four++;
            if (ret == 0) f->eof++;
        }
        if (ret > 0) {
            struct rkey_t rk = {};
            rk.tgid = k.tgid;
            rk.slot = slot_of((u64)ret);
            u64 rz = 0;
            u64 *r = read_sizes.lookup_or_try_init(&rk, &rz);
            if (r) (*r)++;
        }
    }
    return 0;
}

int trainprb_fork(struct tp_fork *a) {
    u32 ptgid = bpf_get_current_pid_tgid() >> 32;
    if (!watch_tgid.lookup(&ptgid)) return 0;
    u32 child = a->child_pid;
    u8 one = 1;
    watch_tgid.update(&child, &one);
    return 0;
}
"""


def syscall_table(arch: str | None = None) -> dict[str, int]:
    return SYSCALLS.get(arch or platform.machine(), {})


def syscall_names(arch: str | None = None) -> dict[int, str]:
    """Number -> name: our table first, then bcc's (x86_64) where it knows more."""
    names = {nr: n for n, nr in syscall_table(arch).items()}
    if (arch or platform.machine()) == "x86_64":
        try:
            import bcc.syscall as bsys  # noqa: PLC0415 - only inside capture, after import_bcc
            for nr, n in bsys.syscalls.items():
                names.setdefault(int(nr), n.decode() if isinstance(n, bytes) else str(n))
        except ImportError:
            pass
    return names


def build_program(formats: dict[str, dict[str, Any]], arch: str | None = None) -> str:
    tab = syscall_table(arch)
    if not tab:
        raise Unavailable(f"no syscall table for {arch or platform.machine()}: the syscall probe supports "
                          f"{', '.join(SYSCALLS)}")
    reads = [tab[n] for n in READ_FAMILY if n in tab]
    opens = [tab[n] for n in OPEN_FAMILY if n in tab]
    is_read = " || ".join(f"nr == {n}" for n in reads) or "0"
    is_open = " || ".join(f"s.nr == {n}" for n in opens) or "0"
    is_open_nr = "(" + (" || ".join(f"nr == {n}" for n in opens) or "0") + ")"
    open_path = f"s.nr == {tab['open']} ? arg0 : arg1" if "open" in tab else "arg1"
    return (BPF_TEXT.replace("__HELPERS__", bs.BPF_HELPERS).replace("__PATH_LEN__", str(PATH_LEN))
            .replace("__ENTER_STRUCT__", bs.c_struct("tp_sys_enter", formats["sys_enter"]))
            .replace("__EXIT_STRUCT__", bs.c_struct("tp_sys_exit", formats["sys_exit"]))
            .replace("__FORK_STRUCT__", bs.c_struct("tp_fork", formats["sched_process_fork"]))
            .replace("__IS_READ__", is_read).replace("__IS_OPEN_NR__", is_open_nr).replace("__IS_OPEN__", is_open)
            .replace("__NR_CLOSE__", str(tab["close"])).replace("__OPEN_PATH__", open_path))


_DD_SECONDS = re.compile(r"copied,\s*([0-9.eE+-]+)\s*s")


def dd_seconds(stderr: str) -> float | None:
    """The elapsed time dd reports for itself ("... copied, 0.0123 s, ...")."""
    m = _DD_SECONDS.search(stderr or "")
    return float(m.group(1)) if m else None


DD_ARGV = ["dd", "if=/dev/zero", "of=/dev/null", "bs=1", f"count={CALIBRATION_BLOCKS}"]
DD_ENV = {"LC_ALL": "C", "PATH": "/usr/local/bin:/usr/bin:/bin"}


def _dd_cpu(rec: Recorder, watch: Any = None) -> tuple[float | None, int | None]:
    """CPU-seconds (user + system, from the kernel's accounting of the child) of one `dd bs=1`.

    CPU time, not elapsed time: on a busy host dd also waits for a CPU, which is not the tax.
    dd starts held (`read` in sh, then exec), so it can be put in the watch map before its first
    call when `watch` is given. Returns (cpu seconds, pid)."""
    import ctypes
    argv = ["sh", "-c", "read _go; exec " + " ".join(DD_ARGV)]
    try:
        proc = rec.spawn(argv, stop_signal=15, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, env=DD_ENV)
    except Exception:  # noqa: BLE001 - no sh or dd: the tax stays unmeasured, the probe still runs
        return None, None
    cpu = None
    try:
        if watch is not None:
            watch[ctypes.c_uint32(proc.pid)] = ctypes.c_uint8(1)
        assert proc.stdin is not None
        proc.stdin.write(b"go\n")
        proc.stdin.close()
        _pid, status, ru = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode == 0:
            cpu = ru.ru_utime + ru.ru_stime
    except Exception:  # noqa: BLE001
        proc.kill()
    finally:
        rec.finish(proc, grace_s=5.0)
        if watch is not None:
            try:
                del watch[ctypes.c_uint32(proc.pid)]
            except Exception:  # noqa: BLE001 - already gone
                pass
    return cpu, proc.pid


class SyscallsProbe(Probe):
    name = "syscalls"
    description = "per-process syscall counts, latency, read sizes, opens (bcc, raw_syscalls tracepoints; bounded window)"
    needs = ("root", "bcc (python3-bpfcc)", "tracefs", "kernel headers", "raw_syscalls tracepoints")
    cost = ("slows every syscall on the host while attached (measured: see overhead); attached at most "
            f"{DEFAULT_MAX_S:g} s")
    timeout_s = 25.0
    evidence_schema = SyscallsEvidence
    default_enabled = False      # its tracepoint tax falls on every process: opt in with --deep

    def check(self, spec: WatchSpec) -> Availability:
        r = bs.readiness(TRACEPOINTS, spec.root)
        if r.ok and not syscall_table():
            return Availability.no(f"no syscall table for {platform.machine()} (supported: {', '.join(SYSCALLS)})")
        return Availability.yes() if r.ok else Availability.no(r.reason or "eBPF unavailable")

    def capture(self, spec: WatchSpec, rec: Recorder, deadline_monotonic: float) -> None:
        capture_syscalls(spec, rec, deadline_monotonic)

    @staticmethod
    def parse(capture: Capture) -> SyscallsEvidence:
        return parse_syscalls(json.loads(capture.artifacts["syscalls.json"]))


def _events_total(b: Any) -> int:
    try:
        return int(sum(b[b"events"].getvalue(b[b"events"].Key(0))))
    except Exception:  # noqa: BLE001
        return 0


def capture_syscalls(spec: WatchSpec, rec: Recorder, deadline_monotonic: float) -> None:
    import ctypes

    t0 = time.time()
    max_s = float(spec.options.get("syscalls_max_s", DEFAULT_MAX_S))
    tracefs, mounted = bs.ensure_tracefs(spec.root, say=_say_mount(rec))
    if mounted:
        rec.note("mount", f"tracefs at {tracefs}", 0, t0, time.time() - t0)
    formats = read_formats(rec, tracefs, TRACEPOINTS)
    arch = platform.machine()
    text = build_program(formats, arch)
    rec.add("program.c", text)
    c0 = time.monotonic()
    loaded = bs.compile_bpf(text)
    compile_s = time.monotonic() - c0
    rec.note("bpf", "compile syscall program (bcc/clang)", 0, t0, compile_s)
    calibrate = bool(spec.options.get("syscalls_calibrate", True))
    cal: dict[str, Any] = {"syscalls_per_run": 2 * CALIBRATION_BLOCKS}
    stats_fd = None
    try:
        if calibrate:
            runs = [_dd_cpu(rec)[0] for _ in range(2)]
            cal["off_seconds"] = min([r for r in runs if r is not None], default=None)
        b = loaded.bpf
        tree = ProcessTree(spec.pid, spec.root)
        u32, u8 = ctypes.c_uint32, ctypes.c_uint8
        w_tgid = b[b"watch_tgid"]

        def push() -> None:
            new_pids, _ = tree.refresh()
            for p in new_pids:
                w_tgid[u32(p)] = u8(1)

        push()
        if not tree.pids:
            raise Unavailable(f"process {spec.pid} exited before the syscall probe attached")
        if rec.stop.is_set():
            raise Unavailable("stopped before the tracepoints were attached")
        stats_fd = bs.enable_bpf_stats()
        a0 = time.monotonic()
        for tp, fn in (("raw_syscalls:sys_enter", "trainprb_sysent"), ("raw_syscalls:sys_exit", "trainprb_sysext"),
                       ("sched:sched_process_fork", "trainprb_fork")):
            loaded.attach_tracepoint(tp, fn)
        attach_ns, attach_unix = time.monotonic_ns(), time.time()
        attached_mono = time.monotonic()
        attach_s = attached_mono - a0
        rec.note("bpf", "attach " + ",".join(TRACEPOINTS), 0, attach_unix, attach_s)
        cal_events, cal_pid = 0, None
        if calibrate:
            cal["on_unwatched_seconds"], _ = _dd_cpu(rec)
            cal["on_watched_seconds"], cal_pid = _dd_cpu(rec, w_tgid)
            # The two dd runs' own calls (their start-up adds a few dozen): left out of the host's.
            cal_events = 2 * cal["syscalls_per_run"]
        end = bs.traced_until(spec.window_s, deadline_monotonic, attached_mono, max_s)
        while not rec.stop.is_set() and time.monotonic() < end:
            rec.stop.wait(min(REFRESH_S, max(0.0, end - time.monotonic())))
            push()
            if spec.pid not in tree.timeline[-1]["pids"]:
                break
        for tp in list(loaded.attached):
            b.detach_tracepoint(tp.encode())
        detach_ns, detach_unix = time.monotonic_ns(), time.time()
        rec.note("bpf", "detach " + ",".join(TRACEPOINTS), 0, detach_unix, 0.0)
        run = {name: bs.prog_run_stats(fd) for name, fd in loaded.prog_fds().items()} if stats_fd is not None else {}
        data = _read_maps(b, spec.root, exclude={cal_pid} if cal_pid else set())
        host_events = _events_total(b)
    finally:
        loaded.close()
        if stats_fd is not None:
            os.close(stats_fd)
    window_s = (detach_ns - attach_ns) / 1e9
    names = syscall_names(arch)
    used = {int(c[1]) for c in data["calls"]}
    data.update({
        "pid": spec.pid, "arch": arch, "attach_ns": attach_ns, "detach_ns": detach_ns, "attach_unix": attach_unix,
        "detach_unix": detach_unix, "window_s": window_s, "max_s": max_s,
        "pids": {str(p): pp for p, pp in tree.pids.items()}, "timeline": tree.timeline,
        "syscall_names": {str(nr): names.get(nr, f"syscall_{nr}") for nr in sorted(used)},
        "host_syscalls": host_events, "calibration_syscalls": cal_events, "calibration": cal,
        "cpus_online": len(procfs.cpus_online(spec.root)),
        "classes": {"read": list(READ_FAMILY), "open": list(OPEN_FAMILY), "file_meta": list(FILE_META)},
    })
    rec.add("syscalls.json", json.dumps(data))
    rec.capture.meta.update({"attach_unix": attach_unix, "window_s": round(window_s, 3)})
    rec.capture.meta["overhead"] = syscall_overhead(data, run, compile_s, attach_s)


def syscall_overhead(d: dict[str, Any], run: dict[str, dict[str, int]], compile_s: float,
                     attach_s: float) -> dict[str, Any]:
    """The tracepoint tax, from the dd calibration and the host's syscall count in the window."""
    window_s = max(float(d["window_s"]), 1e-6)
    ncpu = max(1, int(d.get("cpus_online") or 1))
    cal = d.get("calibration") or {}
    n = float(cal.get("syscalls_per_run") or 0)
    off, on_u, on_w = cal.get("off_seconds"), cal.get("on_unwatched_seconds"), cal.get("on_watched_seconds")
    per_u = (on_u - off) / n * 1e9 if (off is not None and on_u is not None and n) else None
    per_w = (on_w - off) / n * 1e9 if (off is not None and on_w is not None and n) else None
    host = max(0, int(d.get("host_syscalls") or 0) - int(d.get("calibration_syscalls") or 0))
    target = sum(int(c[2]) for c in d.get("calls", []))
    out: dict[str, Any] = {
        "compile_seconds": round(compile_s, 3), "attach_seconds": round(attach_s, 4),
        "traced_seconds": round(window_s, 3), "bounded_to_seconds": d.get("max_s"),
        "host_syscalls_per_second": round(host / window_s, 1),
        "target_syscalls_per_second": round(target / window_s, 1),
        "tax_ns_per_syscall_unwatched": None if per_u is None else round(max(per_u, 0.0), 1),
        "tax_ns_per_syscall_watched": None if per_w is None else round(max(per_w, 0.0), 1),
        "calibration": cal,
    }
    if per_u is not None and per_w is not None:
        added = (max(per_u, 0.0) * max(host - target, 0) + max(per_w, 0.0) * min(target, host)) / 1e9
        out["host_cpu_fraction"] = round(added / (window_s * ncpu), 5)
        out["target_added_cores"] = round(max(per_w, 0.0) * target / 1e9 / window_s, 5)
        out["basis"] = ("the CPU time of dd bs=1 before and while attached (unwatched and watched) gives the added "
                        "ns per syscall; times the host's and the target's syscalls in the window")
    if run:
        run_ns = sum(r.get("run_time_ns", 0) for r in run.values())
        cnt = sum(r.get("run_cnt", 0) for r in run.values())
        out["bpf_run_time_ns"] = run_ns
        out["bpf_ns_per_event"] = round(run_ns / max(cnt, 1), 1)
        out.setdefault("host_cpu_fraction", round(run_ns / (window_s * 1e9 * ncpu), 6))
    return out


def _fd_kind(root: str, tgid: int, fd: int) -> str:
    try:
        target = os.readlink(procfs.path(root, f"proc/{tgid}/fd/{fd}"))
    except OSError:
        return "closed"
    if target.startswith("pipe:"):
        return "pipe"
    if target.startswith("socket:"):
        return "socket"
    if target.startswith("anon_inode:"):
        return "anon"
    if target.startswith("/dev/"):
        return "device"
    return "file"


def _read_maps(b: Any, root: str, exclude: set[int]) -> dict[str, Any]:
    calls = [[int(k.tgid), int(k.nr), int(v.count), int(v.total_ns), int(v.max_ns), int(v.bytes), int(v.errors)]
             for k, v in b[b"calls"].items() if int(k.tgid) not in exclude]
    fds = []
    for k, v in b[b"fds"].items():
        if int(k.tgid) in exclude:
            continue
        # Descriptors opened by open*() in the window are files; the others are resolved now.
        kind = "opened" if int(k.opened) else _fd_kind(root, int(k.tgid), int(k.fd))
        fds.append([int(k.tgid), int(k.fd), int(v.reads), int(v.bytes), int(v.four), int(v.eof), int(v.ns), kind])
    sizes = [[int(k.tgid), int(k.slot), int(v.value)] for k, v in b[b"read_sizes"].items() if int(k.tgid) not in exclude]
    spans = [[int(k.value), int(v.ns), int(v.n)] for k, v in b[b"spans"].items() if int(k.value) not in exclude]
    paths = []
    for k, v in b[b"paths"].items():
        if int(k.tgid) in exclude:
            continue
        raw = bytes(k.path).split(b"\0", 1)[0]
        paths.append([int(k.tgid), raw.decode(errors="replace"), int(v.value)])
    return {"calls": calls, "fds": fds, "read_sizes": sizes, "spans": spans, "paths": paths, "paths_capacity": 2048}


# -- pure parsing ------------------------------------------------------------------------------------

FILE_KINDS = ("opened", "file", "device")


def _median_from_slots(slots: dict[int, int]) -> float | None:
    total = sum(slots.values())
    if not total:
        return None
    acc = 0
    for s in sorted(slots):
        acc += slots[s]
        if acc * 2 >= total:
            lo, hi = slot_bounds(s)
            return lo if hi - lo <= 1 else round((lo + hi) / 2.0, 1)
    return None


def parse_syscalls(d: dict[str, Any]) -> dict[str, Any]:
    """Pure: the maps read at detach -> per-process syscall evidence."""
    pid = int(d["pid"])
    win_s = max((int(d["detach_ns"]) - int(d["attach_ns"])) / 1e9, 1e-6)
    names = {int(k): v for k, v in d.get("syscall_names", {}).items()}
    classes = d.get("classes", {})
    read_fam = set(classes.get("read", READ_FAMILY))
    open_fam = set(classes.get("open", OPEN_FAMILY))
    meta_fam = set(classes.get("file_meta", FILE_META))
    parents = {int(k): int(v) for k, v in d.get("pids", {}).items()}
    procs: dict[int, dict[str, Any]] = {}

    def proc(p: int) -> dict[str, Any]:
        if p not in procs:
            procs[p] = {"pid": p, "ppid": parents.get(p), "role": "main" if p == pid else "child",
                        "syscalls": {}, "calls": 0, "syscall_seconds": 0.0,
                        "file_reads": {"reads": 0, "bytes": 0, "eof_reads": 0, "seconds": 0.0},
                        "ipc_reads": {"reads": 0, "bytes": 0, "seconds": 0.0}, "queue_messages": 0}
        return procs[p]

    for tgid, nr, count, total_ns, max_ns, nbytes, errors in d.get("calls", []):
        pr = proc(int(tgid))
        name = names.get(int(nr), f"syscall_{nr}")
        pr["syscalls"][name] = {"count": count, "total_seconds": round(total_ns / 1e9, 6),
                                "max_us": round(max_ns / 1e3, 1), "mean_us": round(total_ns / max(count, 1) / 1e3, 2),
                                "errors": errors, **({"bytes": nbytes} if name in read_fam else {})}
        pr["calls"] += count
        pr["syscall_seconds"] += total_ns / 1e9
    for tgid, _fd, reads, nbytes, four, eof, ns, kind in d.get("fds", []):
        pr = proc(int(tgid))
        if kind in FILE_KINDS:
            agg = pr["file_reads"]
            agg["eof_reads"] += eof
        else:
            agg = pr["ipc_reads"]
        agg["reads"] += reads
        agg["bytes"] += nbytes
        agg["seconds"] += ns / 1e9
        if kind == "pipe":
            # multiprocessing.Connection frames each message with a 4-byte length: one such read
            # on a queue's pipe is one message received (a DataLoader worker: one batch of indices).
            pr["queue_messages"] += four
    spans = {int(t): (int(ns), int(n)) for t, ns, n in d.get("spans", [])}
    size_slots: dict[int, dict[int, int]] = {}
    for tgid, slot, n in d.get("read_sizes", []):
        size_slots.setdefault(int(tgid), {})
        size_slots[int(tgid)][int(slot)] = size_slots[int(tgid)].get(int(slot), 0) + int(n)
    dirs: dict[int, dict[str, int]] = {}
    for tgid, path, n in d.get("paths", []):
        dname = os.path.dirname(path) or path
        dirs.setdefault(int(tgid), {})
        dirs[int(tgid)][dname] = dirs[int(tgid)].get(dname, 0) + int(n)
    out_procs = []
    for p in sorted(procs):
        pr = procs[p]
        sc = pr["syscalls"]
        opens = sum(v["count"] for n, v in sc.items() if n in open_fam)
        open_s = sum(v["total_seconds"] for n, v in sc.items() if n in open_fam)
        reads = sum(v["count"] for n, v in sc.items() if n in read_fam)
        read_bytes = sum(v.get("bytes", 0) for n, v in sc.items() if n in read_fam)
        meta_s = sum(v["total_seconds"] for n, v in sc.items() if n in meta_fam)
        fr = pr["file_reads"]
        nonempty = fr["reads"] - fr["eof_reads"]
        file_sys_s = open_s + meta_s + fr["seconds"]
        span_ns, span_n = spans.get(p, (0, 0))
        pr.update({
            "syscall_seconds": round(pr["syscall_seconds"], 6),
            "calls_per_second": round(pr["calls"] / win_s, 1),
            "opens": opens, "opens_per_second": round(opens / win_s, 1),
            "reads": reads, "read_bytes": read_bytes,
            "file_reads": {k: (round(v, 6) if isinstance(v, float) else v) for k, v in fr.items()},
            "ipc_reads": {k: (round(v, 6) if isinstance(v, float) else v) for k, v in pr["ipc_reads"].items()},
            "mean_file_read_bytes": round(fr["bytes"] / nonempty, 1) if nonempty > 0 else None,
            "median_read_bytes": _median_from_slots(size_slots.get(p, {})),
            # Time inside open/read/stat/close of files (a lower bound on file handling), and from
            # each file's open to its close (an upper bound: it includes the user code between).
            "file_syscall_seconds": round(file_sys_s, 6),
            "file_syscall_share": round(min(file_sys_s / win_s, 1.0), 4),
            "files_closed": span_n, "file_open_to_close_seconds": round(span_ns / 1e9, 6),
            "file_open_to_close_share": round(min(span_ns / 1e9 / win_s, 1.0), 4),
            "open_dirs": sorted(({"dir": k, "opens": v} for k, v in dirs.get(p, {}).items()),
                                key=lambda x: -x["opens"])[:5],
            "top_syscalls": sorted(({"name": n, **v} for n, v in sc.items()), key=lambda x: -x["total_seconds"])[:8],
        })
        out_procs.append(pr)
    main = next((x for x in out_procs if x["pid"] == pid), None)
    return {"pid": pid, "window_s": round(win_s, 3), "attach_unix": d.get("attach_unix"),
            "bounded_to_seconds": d.get("max_s"), "processes": out_procs, "main": main,
            "children": [x for x in out_procs if x["pid"] != pid],
            "paths_sampled": len(d.get("paths", [])), "paths_capacity": d.get("paths_capacity")}
