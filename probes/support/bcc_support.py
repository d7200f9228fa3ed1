"""What the eBPF probes need, checked one piece at a time, and bcc reached from a virtualenv.

bcc's Python module ships only with the distribution (Debian/Ubuntu `python3-bpfcc`, Fedora
`python3-bcc`); the PyPI name `bcc` is an unrelated package. It is pure Python over libbcc.so, so
it is loaded here by path from the system's dist-packages without putting that whole directory on
sys.path (which would let system copies of numpy or torch shadow the virtualenv's).

Every check answers with one line a user can act on. Readers take a root so tests can point them
at a captured tree; the mount helper is the only function here that changes the host, and only
when trainprobe runs as root and tracefs is absent.

The probes attach to tracepoints whose argument layout comes from tracefs' format files, read at
run time; no program here reads kernel structs, so headers from another kernel release compile
them correctly (bcc still insists on a headers directory to build anything).
"""
from __future__ import annotations

import ctypes
import importlib.util
import os
import platform
import re
import sys
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from trainprobe.probes.parsers import procfs
from trainprobe.probes.errors import PermissionDenied, ProbeError, Unavailable

DISABLE_ENV = "TRAINPROBE_NO_EBPF"          # set to 1: the eBPF probes skip and say so
BCC_PATH_ENV = "TRAINPROBE_BCC_PATH"        # a directory that holds the `bcc` package
BCC_DIRS = ("/usr/lib/python3/dist-packages", "/usr/lib64/python3/site-packages",
            "/usr/share/bcc/python")
TRACEFS_DIRS = ("sys/kernel/tracing", "sys/kernel/debug/tracing")
# BPF programs that trainprobe loads are named with this prefix (15 characters at most in all),
# so `bpftool prog` shows which are ours.
PROG_PREFIX = "trainprb_"

CAP_SYS_ADMIN, CAP_PERFMON, CAP_BPF = 21, 38, 39

_import_lock = threading.Lock()
# libbcc's clang/LLVM front end is not safe to run from two threads at once (the scheduler and the
# syscall probes start together): compiles are serialised.
_compile_lock = threading.Lock()
_tracefs_lock = threading.Lock()


# -- bcc itself -----------------------------------------------------------------------------------

def bcc_package_dir() -> str | None:
    """The directory holding the system's `bcc` Python package, or None."""
    cands = [os.environ[BCC_PATH_ENV]] if os.environ.get(BCC_PATH_ENV) else []
    pyver = f"python{sys.version_info.major}.{sys.version_info.minor}"
    cands += list(BCC_DIRS) + [f"/usr/lib/{pyver}/site-packages", f"/usr/lib64/{pyver}/site-packages"]
    for d in cands:
        if os.path.isfile(os.path.join(d, "bcc", "__init__.py")):
            return os.path.join(d, "bcc")
    return None


def import_bcc() -> Any:
    """The `bcc` module (system package loaded by path). Raises Unavailable with the fix."""
    with _import_lock:
        mod = sys.modules.get("bcc")
        if mod is not None and hasattr(mod, "BPF"):
            return mod
        pkg = bcc_package_dir()
        if pkg is None:
            raise Unavailable("bcc's Python module is not installed: " + install_hint("bcc"))
        spec = importlib.util.spec_from_file_location("bcc", os.path.join(pkg, "__init__.py"),
                                                      submodule_search_locations=[pkg])
        if spec is None or spec.loader is None:
            raise Unavailable(f"cannot load bcc from {pkg}")
        mod = importlib.util.module_from_spec(spec)
        sys.modules["bcc"] = mod
        try:
            spec.loader.exec_module(mod)
        except (OSError, ImportError, AttributeError) as exc:
            sys.modules.pop("bcc", None)
            for name in [n for n in sys.modules if n.startswith("bcc.")]:
                sys.modules.pop(name, None)
            raise Unavailable(f"bcc at {pkg} does not load ({type(exc).__name__}: {exc}); libbcc is missing "
                              "or does not match: " + install_hint("bcc")) from None
        return mod


def os_release(root: str = "/") -> dict[str, str]:
    text = procfs.try_read_text(root, "etc/os-release") or ""
    out = {}
    for line in text.splitlines():
        k, sep, v = line.partition("=")
        if sep:
            out[k.strip()] = v.strip().strip('"')
    return out


def _distro_family(root: str = "/") -> str:
    rel = os_release(root)
    ids = (rel.get("ID", "") + " " + rel.get("ID_LIKE", "")).lower()
    for fam in ("debian", "ubuntu", "fedora", "rhel", "centos", "suse", "arch"):
        if fam in ids:
            return {"ubuntu": "debian", "centos": "rhel"}.get(fam, fam)
    return "unknown"


def install_hint(what: str, release: str | None = None, root: str = "/") -> str:
    """The distribution's command for bcc or for the running kernel's headers."""
    rel = release or platform.release()
    fam = _distro_family(root)
    if what == "bcc":
        return {"debian": "sudo apt-get install python3-bpfcc",
                "fedora": "sudo dnf install python3-bcc", "rhel": "sudo dnf install python3-bcc",
                "suse": "sudo zypper install python3-bcc", "arch": "sudo pacman -S python-bcc",
                }.get(fam, "install your distribution's bcc Python package (python3-bpfcc / python3-bcc)")
    return {"debian": f"sudo apt-get install linux-headers-{rel}",
            "fedora": f"sudo dnf install kernel-devel-{rel}", "rhel": f"sudo dnf install kernel-devel-{rel}",
            "suse": "sudo zypper install kernel-default-devel", "arch": "sudo pacman -S linux-headers",
            }.get(fam, f"install the kernel headers for {rel} from your distribution")


# -- host features ---------------------------------------------------------------------------------

def effective_caps(root: str = "/") -> int:
    status = procfs.parse_status(procfs.try_read_text(root, "proc/self/status") or "")
    try:
        return int(status.get("CapEff", "0"), 16)
    except ValueError:
        return 0


def may_use_bpf(root: str = "/") -> bool:
    """Root, or CAP_SYS_ADMIN, or both CAP_BPF and CAP_PERFMON (what tracepoint programs need)."""
    if os.geteuid() == 0:
        return True
    caps = effective_caps(root)
    return bool(caps >> CAP_SYS_ADMIN & 1) or bool((caps >> CAP_BPF & 1) and (caps >> CAP_PERFMON & 1))


CAP_DAC_READ_SEARCH = 2


def root_ok_dac(root: str = "/") -> bool:
    """False when tracefs is mounted but this user cannot look inside it (not root, no
    CAP_DAC_READ_SEARCH): then the fix is a capability, not a mount."""
    d = procfs.path(root, "sys/kernel/tracing")
    if os.geteuid() == 0 or effective_caps(root) >> CAP_DAC_READ_SEARCH & 1:
        return True
    return not (os.path.ismount(d) and not os.access(d, os.R_OK | os.X_OK))


def tracefs_dir(root: str = "/") -> str | None:
    """Where tracefs' events are, or None when it is not mounted."""
    for d in TRACEFS_DIRS:
        if os.path.isdir(procfs.path(root, d, "events")):
            return procfs.path(root, d)
    return None


def headers_dir(release: str | None = None, root: str = "/") -> str | None:
    """The kernel headers bcc will compile against, or None."""
    rel = release or platform.release()
    for rel_path in (f"lib/modules/{rel}/build", f"lib/modules/{rel}/source"):
        p = procfs.path(root, rel_path)
        if os.path.isdir(os.path.join(p, "include")) or os.path.isdir(os.path.join(p, "arch")):
            return os.path.realpath(p)
    if os.path.exists(procfs.path(root, "sys/kernel/kheaders.tar.xz")):
        return procfs.path(root, "sys/kernel/kheaders.tar.xz")
    return None


def headers_release(path: str | None) -> str | None:
    """'6.1.0-57' from /usr/src/linux-headers-6.1.0-57-amd64, when the path names one."""
    if not path:
        return None
    m = re.search(r"linux-headers-(\d+\.\d+[^/]*)", path)
    return m.group(1) if m else None


def btf_present(root: str = "/") -> bool:
    return os.path.exists(procfs.path(root, "sys/kernel/btf/vmlinux"))


def tracepoints_present(tracefs: str, tracepoints: tuple[str, ...]) -> list[str]:
    """The tracepoints ('cat:event') missing from a mounted tracefs."""
    return [tp for tp in tracepoints if not os.path.isdir(os.path.join(tracefs, "events", *tp.split(":", 1)))]


@dataclass
class Readiness:
    """What stands between this host and a bcc tracepoint probe."""

    missing: list[str] = field(default_factory=list)     # one actionable line each
    facts: dict[str, Any] = field(default_factory=dict)
    will_mount_tracefs: bool = False

    @property
    def ok(self) -> bool:
        return not self.missing

    @property
    def reason(self) -> str | None:
        return "; ".join(self.missing) if self.missing else None


def readiness(tracepoints: tuple[str, ...], root: str = "/", release: str | None = None) -> Readiness:
    """Check every piece, without changing anything. Each missing piece gets one line."""
    r = Readiness()
    rel = release or platform.release()
    if os.environ.get(DISABLE_ENV, "").strip() not in ("", "0"):
        r.missing.append(f"eBPF disabled by {DISABLE_ENV}={os.environ[DISABLE_ENV]} (unset it to use bcc); "
                         "run-queue delay still comes from /proc schedstat")
        return r
    root_ok = may_use_bpf(root)
    r.facts["may_use_bpf"] = root_ok
    if not root_ok:
        r.missing.append("eBPF needs root (or CAP_BPF and CAP_PERFMON): run trainprobe with sudo")
    pkg = bcc_package_dir()
    r.facts["bcc_package"] = pkg
    if pkg is None:
        r.missing.append("bcc is not installed: " + install_hint("bcc", rel, root))
    tfs = tracefs_dir(root)
    r.facts["tracefs"] = tfs
    if tfs is None and not root_ok_dac(root):
        r.missing.append("tracefs at /sys/kernel/tracing is root-only (mode 0700): run trainprobe as root, or "
                         "give it CAP_DAC_READ_SEARCH besides CAP_BPF and CAP_PERFMON (docs/security.md)")
    elif tfs is None:
        if root_ok and os.path.isdir(procfs.path(root, "sys/kernel/tracing")):
            r.will_mount_tracefs = True
        else:
            r.missing.append("tracefs is not mounted: sudo mount -t tracefs nodev /sys/kernel/tracing")
    else:
        gone = tracepoints_present(tfs, tracepoints)
        if gone:
            r.missing.append(f"this kernel has no tracepoint {', '.join(gone)} (CONFIG_FTRACE / CONFIG_TRACEPOINTS)")
    hdr = headers_dir(rel, root)
    r.facts["headers"] = hdr
    r.facts["headers_release"] = headers_release(hdr)
    if hdr is None:
        r.missing.append(f"bcc cannot find kernel headers for {rel} in /lib/modules/{rel}/build: "
                         + install_hint("headers", rel, root))
    r.facts["btf"] = btf_present(root)
    r.facts["kernel"] = rel
    return r


def ensure_tracefs(root: str = "/", mountpoint: str | None = None,
                   say: Callable[[str], None] | None = None) -> tuple[str, bool]:
    """The tracefs directory, mounting tracefs first when it is absent and we may.

    Returns (directory, mounted_now). The mount is left in place (as `mount -t tracefs` by hand
    would be): unmounting could pull it from under another tool started meanwhile.
    """
    with _tracefs_lock:
        target = mountpoint or procfs.path(root, "sys/kernel/tracing")
        if os.path.isdir(os.path.join(target, "events")):
            return target, False
        if mountpoint is None:
            existing = tracefs_dir(root)
            if existing:
                return existing, False
        if not may_use_bpf(root):
            raise PermissionDenied("tracefs is not mounted and mounting it needs root: "
                                   "sudo mount -t tracefs nodev /sys/kernel/tracing")
        rc, err = _mount("tracefs", target, "tracefs")
        if rc != 0:
            raise Unavailable(f"tracefs is not mounted and mounting it at {target} failed ({err}): "
                              "sudo mount -t tracefs nodev /sys/kernel/tracing")
        msg = f"mounted tracefs at {target} (the sched and raw_syscalls tracepoints live there; left mounted)"
        (say or _stderr)(msg)
        return target, True


def _stderr(msg: str) -> None:
    print(f"trainprobe: {msg}", file=sys.stderr, flush=True)


def _mount(source: str, target: str, fstype: str) -> tuple[int, str]:
    libc = ctypes.CDLL(None, use_errno=True)
    rc = libc.mount(source.encode(), target.encode(), fstype.encode(), ctypes.c_ulong(0), None)
    if rc != 0:
        e = ctypes.get_errno()
        return rc, os.strerror(e)
    return 0, ""


def umount(target: str) -> None:
    """Used by tests that mount a second tracefs instance of their own."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.umount2(target.encode(), 0) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e), target)


# -- tracepoint formats ----------------------------------------------------------------------------

_FIELD = re.compile(r"field:(?P<decl>[^;]+);\s*offset:(?P<off>\d+);\s*size:(?P<size>\d+);\s*signed:(?P<signed>\d)")


def parse_format(text: str) -> dict[str, Any]:
    """A tracefs `format` file -> {name, id, fields: [{name, type, offset, size, signed}], print_fmt}."""
    out: dict[str, Any] = {"fields": []}
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("name:"):
            out["name"] = s.split(":", 1)[1].strip()
        elif s.startswith("ID:"):
            out["id"] = int(s.split(":", 1)[1])
        elif s.startswith("print fmt:"):
            out["print_fmt"] = s.split(":", 1)[1].strip()
        m = _FIELD.search(s)
        if m:
            decl = m.group("decl").strip()
            name = decl.split()[-1]
            base = re.sub(r"\[.*\]$", "", name)
            out["fields"].append({"name": base, "type": decl[: -len(name)].strip(), "offset": int(m.group("off")),
                                  "size": int(m.group("size")), "signed": m.group("signed") == "1",
                                  "array": name != base})
    return out


def c_struct(struct_name: str, fmt: dict[str, Any]) -> str:
    """A C struct that lays out a tracepoint's record exactly as its format file says."""
    lines = [f"struct {struct_name} {{"]
    pos = 0
    for f in sorted(fmt["fields"], key=lambda f: f["offset"]):
        if f["offset"] < pos:
            continue
        if f["offset"] > pos:
            lines.append(f"    u8 __pad_{pos}[{f['offset'] - pos}];")
        name, size = f["name"], f["size"]
        if f["array"] or size not in (1, 2, 4, 8) or f["offset"] % size:
            elem = "char" if "char" in f["type"] else "u8"
            if "long" in f["type"] and size % 8 == 0 and f["array"]:
                lines.append(f"    u64 {name}[{size // 8}];")
            else:
                lines.append(f"    {elem} {name}[{size}];")
        else:
            lines.append(f"    {'s' if f['signed'] else 'u'}{size * 8} {name};")
        pos = f["offset"] + size
    lines.append("};")
    return "\n".join(lines)


def task_report_max(switch_fmt: dict[str, Any]) -> int:
    """sched_switch's prev_state bit that means 'preempted' (TASK_REPORT_MAX), from its print fmt.

    The print fmt masks prev_state with ((TASK_REPORT + 1) << 1) - 1 and prints "+" when the bit
    ((TASK_REPORT + 1) << 1) is set; the kernel sets exactly that bit when the task was preempted.
    """
    pf = switch_fmt.get("print_fmt", "")
    m = re.search(r"&\s*\(\(\(([0-9a-fx|\s]+)\)\s*\+\s*1\)\s*<<\s*1\)\s*\?", pf)
    if m:
        report = 0
        for part in m.group(1).split("|"):
            part = part.strip()
            if part:
                report |= int(part, 0)
        return (report + 1) << 1
    return 0x100          # the value on kernels 4.14 and later with TASK_REPORT = 0x7f


# -- the traced window ----------------------------------------------------------------------------

MIN_TRACED_S = 2.0


def traced_until(window_s: float, deadline_monotonic: float, attached_monotonic: float,
                 max_s: float | None = None) -> float:
    """When an eBPF probe detaches: the session's deadline, but never before min(window,
    MIN_TRACED_S) of tracing (compiling can eat most of a short window), and never after max_s."""
    floor = attached_monotonic + min(float(window_s), MIN_TRACED_S)
    end = max(deadline_monotonic, floor)
    return min(end, attached_monotonic + max_s) if max_s is not None else end


# -- BPF run-time statistics -----------------------------------------------------------------------

BPF_ENABLE_STATS = 32
BPF_STATS_RUN_TIME = 0
_SYS_BPF = {"x86_64": 321, "aarch64": 280, "ppc64le": 361, "s390x": 351}


def enable_bpf_stats() -> int | None:
    """Turn on the kernel's per-program run-time accounting for as long as the returned fd is open.

    BPF_ENABLE_STATS reverts by itself when the fd is closed (or trainprobe dies), so no setting
    stays changed. Returns None where the kernel or the architecture does not offer it.
    """
    nr = _SYS_BPF.get(platform.machine())
    if nr is None:
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    attr = (ctypes.c_uint32 * 2)(BPF_STATS_RUN_TIME, 0)
    fd = libc.syscall(ctypes.c_long(nr), ctypes.c_int(BPF_ENABLE_STATS), ctypes.byref(attr), ctypes.c_uint(8))
    return fd if fd >= 0 else None


def prog_run_stats(fd: int) -> dict[str, int]:
    """run_time_ns and run_cnt of a loaded program, from /proc/self/fdinfo (kernel 5.1+)."""
    out: dict[str, int] = {}
    text = procfs.try_read_text("/", f"proc/self/fdinfo/{fd}") or ""
    for line in text.splitlines():
        k, _, v = line.partition(":")
        if k.strip() in ("run_time_ns", "run_cnt", "prog_id", "recursion_misses"):
            try:
                out[k.strip()] = int(v.strip())
            except ValueError:
                pass
    return out


class Loaded:
    """A compiled BPF object and what is attached, detached for sure on close.

    Used as a context manager by the probes, so a probe that fails, is interrupted or times out
    leaves nothing attached; bcc's own atexit hook and the kernel (on exit, fds close) are the
    second and third lines of defence.
    """

    def __init__(self, bpf: Any):
        self.bpf = bpf
        self.attached: list[str] = []

    def attach_tracepoint(self, tp: str, fn: str) -> None:
        self.bpf.attach_tracepoint(tp=tp.encode(), fn_name=fn.encode())
        self.attached.append(tp)

    def prog_fds(self) -> dict[str, int]:
        return {name.decode() if isinstance(name, bytes) else name: f.fd for name, f in self.bpf.funcs.items()}

    def close(self) -> None:
        if self.bpf is None:
            return
        try:
            self.bpf.cleanup()
        finally:
            self.bpf = None
            self.attached = []

    def __enter__(self) -> "Loaded":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


COMPILE_NICE = 5      # clang runs in trainprobe's thread: it yields the CPUs to the job it watches


class _lower_priority:
    """Run the calling thread at a higher nice value, then restore it (Linux sets nice per thread)."""

    def __init__(self, nice: int):
        self.nice = nice
        self.before: int | None = None

    def __enter__(self) -> "_lower_priority":
        try:
            tid = threading.get_native_id()
            self.before = os.getpriority(os.PRIO_PROCESS, tid)
            os.setpriority(os.PRIO_PROCESS, tid, max(self.before, self.nice))
        except (OSError, AttributeError):
            self.before = None
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.before is not None:
            try:
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), self.before)
            except OSError:
                pass


def compile_bpf(text: str, cflags: list[str] | None = None) -> Loaded:
    """Compile with bcc; translate its failures into the error taxonomy with the likely cause."""
    bcc = import_bcc()
    try:
        with _compile_lock, _lower_priority(COMPILE_NICE):
            bpf = bcc.BPF(text=text.encode(), cflags=list(cflags or []))
    except Exception as exc:  # noqa: BLE001 - bcc raises bare Exception for compile and load errors
        msg = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        if isinstance(exc, PermissionError) or "Operation not permitted" in msg:
            raise PermissionDenied("loading a BPF program was refused: run trainprobe as root") from None
        if "headers" in msg.lower() or "include" in msg.lower() or "modules" in msg.lower():
            raise Unavailable(f"bcc could not compile its program ({msg}): "
                              + install_hint("headers")) from None
        raise ProbeError(f"bcc could not compile or load its program: {msg}") from None
    return Loaded(bpf)


# C helpers shared by trainprobe's BPF programs (each program defines an `events` per-CPU array
# before it includes them).
BPF_HELPERS = r"""static __always_inline u32 log2_u64(u64 v) {
    u32 r = 0;
    if (v >> 32) { v >>= 32; r += 32; }
    if (v >> 16) { v >>= 16; r += 16; }
    if (v >> 8) { v >>= 8; r += 8; }
    if (v >> 4) { v >>= 4; r += 4; }
    if (v >> 2) { v >>= 2; r += 2; }
    if (v >> 1) { r += 1; }
    return r;
}

/* Quarter-octave buckets: 0..3 exact, then 4 per power of two (at most 25% wide). */
static __always_inline u32 slot_of(u64 v) {
    if (v < 4) return (u32)v;
    u32 l = log2_u64(v);
    return l * 4 + (u32)((v >> (l - 2)) & 3);
}

static __always_inline void count_event(int i) {
    u64 *c = events.lookup(&i);
    if (c) (*c)++;
}
"""
