"""The host probe (preflight): a node's health facts from /proc, /sys and /dev.

Its reads: CPUs online and the job's CPUs, cpufreq governors, /proc/meminfo, NUMA nodes, the
/dev/shm mount, this process's resource limits, THP and NUMA balancing, free space on the disk
paths, the kernel log's error lines, trainprobe's own prerequisites (rights, perf, tracefs, BTF,
bcc, headers) and the NVIDIA GPUs on the PCI bus. Each reader takes a root (default "/") so a
captured tree can stand in for the live host, returns JSON-able raw values (mostly the files' own
text), and never decides whether a value is good: the parsers are in probes/parsers/hostfacts.py,
the thresholds in agent/preflight. Readers translate OSError into the probes.errors taxonomy or
record an absent file as None. Cost: a few dozen small file reads; the kernel-log reader reads the
whole /dev/kmsg ring once (about a megabyte at most) and keeps only the lines that matter.
"""
from __future__ import annotations

import errno
import glob
import os
import platform
import re
import shutil
import socket
import sys
import time
from typing import Any

from trainprobe.probes.base import Availability, ReadingProbe, Recorder, WatchSpec, reads_schema
from trainprobe.probes.parsers import procfs
from trainprobe.probes.parsers.hw import PCI_VENDOR_NVIDIA
from trainprobe.probes.errors import PermissionDenied, Unavailable, translate_oserror

NVIDIA_VENDOR = f"{PCI_VENDOR_NVIDIA:#06x}"     # as sysfs prints it: "0x10de"
# PCI base class 0x03 (display controller): 0x0300 VGA, 0x0302 3D controller. NVSwitches (0x0680)
# and the GPUs' HDMI audio functions (0x0403) share the vendor id and are not GPUs.
GPU_CLASS_PREFIXES = ("0x0300", "0x0302")


def _opt(root: str, rel: str) -> str | None:
    text = procfs.try_read_text(root, rel)
    return text.strip() if text is not None else None


# -- host identity ----------------------------------------------------------------------------

def host_identity(root: str = "/") -> dict[str, Any]:
    """Hostname and kernel: from the tree when it holds them, else from this process's host."""
    hostname = _opt(root, "proc/sys/kernel/hostname") or socket.gethostname()
    release = _opt(root, "proc/sys/kernel/osrelease") or platform.release()
    return {"hostname": hostname, "kernel": release, "root": root}


# -- CPUs -------------------------------------------------------------------------------------

def read_cpus(root: str = "/", job_cpus: list[int] | None = None) -> dict[str, Any]:
    """online/present/possible cpulists, and the CPUs the job may use (given, or this process's)."""
    source = "given" if job_cpus is not None else None
    if job_cpus is None and root == "/" and hasattr(os, "sched_getaffinity"):
        job_cpus, source = sorted(os.sched_getaffinity(0)), "sched_getaffinity"
    return {
        "online": _opt(root, "sys/devices/system/cpu/online"),
        "present": _opt(root, "sys/devices/system/cpu/present"),
        "possible": _opt(root, "sys/devices/system/cpu/possible"),
        "job_cpus": procfs.format_cpulist(job_cpus) if job_cpus else None,
        "job_cpus_source": source,
    }


def read_governors(root: str = "/") -> dict[str, Any]:
    """scaling_governor of every CPU that has cpufreq, and the cpufreq driver."""
    govs: dict[str, str] = {}
    base = procfs.path(root, "sys/devices/system/cpu")
    for d in sorted(glob.glob(os.path.join(base, "cpu[0-9]*")), key=lambda p: int(p.rsplit("cpu", 1)[1])):
        g = procfs.try_read_text(root, os.path.relpath(os.path.join(d, "cpufreq/scaling_governor"), root))
        if g is not None:
            govs[os.path.basename(d)] = g.strip()
    driver = _opt(root, "sys/devices/system/cpu/cpu0/cpufreq/scaling_driver")
    return {"governors": govs, "driver": driver}


# -- NUMA -------------------------------------------------------------------------------------

def read_numa(root: str = "/") -> dict[str, Any]:
    online = _opt(root, "sys/devices/system/node/online")
    nodes: dict[str, Any] = {}
    for n in procfs.parse_cpulist(online):
        nodes[str(n)] = {"cpulist": _opt(root, f"sys/devices/system/node/node{n}/cpulist")}
    return {"online": online, "nodes": nodes}


# -- /dev/shm ---------------------------------------------------------------------------------

def read_shm(root: str = "/") -> dict[str, Any]:
    """The /dev/shm mount line(s) and, on the live host, statvfs of /dev/shm."""
    mounts = procfs.try_read_text(root, "proc/self/mounts") or procfs.try_read_text(root, "proc/mounts") or ""
    lines = [ln for ln in mounts.splitlines() if len(ln.split()) > 2 and ln.split()[1] == "/dev/shm"]
    out: dict[str, Any] = {"mount_lines": lines, "statvfs": None}
    if root == "/":
        try:
            st = os.statvfs("/dev/shm")
            out["statvfs"] = {"total": st.f_blocks * st.f_frsize, "free": st.f_bfree * st.f_frsize,
                              "avail": st.f_bavail * st.f_frsize}
        except OSError as exc:
            out["statvfs_error"] = str(translate_oserror(exc, "/dev/shm"))
    return out


# -- kernel memory settings --------------------------------------------------------------------

def read_vm_settings(root: str = "/") -> dict[str, Any]:
    return {
        "thp_enabled": _opt(root, "sys/kernel/mm/transparent_hugepage/enabled"),
        "thp_defrag": _opt(root, "sys/kernel/mm/transparent_hugepage/defrag"),
        "numa_balancing": _opt(root, "proc/sys/kernel/numa_balancing"),
    }


# -- disks --------------------------------------------------------------------------------------

def read_disk(paths: list[str], root: str = "/") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for p in paths:
        full = procfs.path(root, p)
        try:
            st = os.statvfs(full)
        except FileNotFoundError:
            out[p] = {"error": f"{p}: no such file or directory"}
        except OSError as exc:
            out[p] = {"error": str(translate_oserror(exc, p))}
            continue
        out[p] = {"total": st.f_blocks * st.f_frsize, "free": st.f_bfree * st.f_frsize,
                  "avail": st.f_bavail * st.f_frsize,
                  "files": st.f_files, "files_avail": st.f_favail}
    return out


# -- kernel log -----------------------------------------------------------------------------------

# A broad net: only lines that may matter to a health check are kept from the ring buffer.
KMSG_KEEP = re.compile(
    r"NVRM|Xid|SXid|fallen off the bus|Machine Check|Hardware Error|mce:|EDAC|AER:|I/O error|"
    r"nvidia-nvswitch|NVLink|lost carrier|Lost Carrier", re.IGNORECASE)
MAX_KMSG_RECORDS = 200_000


def _read_kmsg_device(path: str, deadline: float) -> list[str]:
    """Every record in the ring: one read() per record, non-blocking, stop at EAGAIN."""
    records: list[str] = []
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        while len(records) < MAX_KMSG_RECORDS and time.monotonic() < deadline:
            try:
                chunk = os.read(fd, 8192)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.EPIPE:   # the record we were at was overwritten: go on
                    continue
                if exc.errno == errno.EINVAL:  # a record longer than our buffer: skip it
                    continue
                raise
            if not chunk:
                break
            records.append(chunk.decode(errors="replace"))
    finally:
        os.close(fd)
    return records


def read_kernel_log(root: str = "/", budget_s: float = 3.0) -> dict[str, Any]:
    """Lines of /dev/kmsg that may matter, with the uptime and wall clock to place them in time.

    Needs read access to /dev/kmsg (root, or kernel.dmesg_restrict=0). In a captured tree,
    dev/kmsg is a plain file of kmsg records, one per line.
    """
    path = procfs.path(root, "dev/kmsg")
    uptime_text = _opt(root, "proc/uptime")
    now = time.time()
    try:
        if os.path.isfile(path):
            with open(path, "r", errors="replace") as fh:
                records = fh.read().splitlines()
        else:
            records = _read_kmsg_device(path, time.monotonic() + budget_s)
    except OSError as exc:
        err = translate_oserror(exc, path)
        if isinstance(err, PermissionDenied):
            raise PermissionDenied(f"{path}: permission denied (kernel.dmesg_restrict="
                                   f"{_opt(root, 'proc/sys/kernel/dmesg_restrict') or '?'})") from None
        raise Unavailable(str(err)) from None
    kept: list[str] = []
    for rec in records:
        # A record is 'prio,seq,usec,flags;message' plus ' KEY=value' continuation lines.
        first = rec.split("\n", 1)[0]
        if KMSG_KEEP.search(first):
            kept.append(first)
    return {"source": "/dev/kmsg", "records_read": len(records), "lines": kept,
            "uptime_s": float(uptime_text.split()[0]) if uptime_text else None, "read_unix": now}


# -- PCI bus ----------------------------------------------------------------------------------------

def read_pci_gpus(root: str = "/") -> list[dict[str, Any]]:
    """NVIDIA GPUs on the PCI bus (vendor 0x10de, display class), read from sysfs: needs no driver."""
    base = procfs.path(root, "sys/bus/pci/devices")
    try:
        names = sorted(os.listdir(base))
    except OSError as exc:
        raise translate_oserror(exc, base) from None
    out: list[dict[str, Any]] = []
    for bdf in names:
        rel = f"sys/bus/pci/devices/{bdf}"
        vendor = _opt(root, f"{rel}/vendor")
        cls = _opt(root, f"{rel}/class")
        if vendor != NVIDIA_VENDOR or not cls or not cls.startswith(GPU_CLASS_PREFIXES):
            continue
        drv = None
        try:
            drv = os.path.basename(os.readlink(procfs.path(root, f"{rel}/driver")))
        except OSError:
            pass
        out.append({
            "bdf": bdf, "vendor": vendor, "device": _opt(root, f"{rel}/device"), "class": cls,
            "driver": drv, "numa_node": _opt(root, f"{rel}/numa_node"),
            "local_cpulist": _opt(root, f"{rel}/local_cpulist"),
            "current_link_speed": _opt(root, f"{rel}/current_link_speed"),
            "current_link_width": _opt(root, f"{rel}/current_link_width"),
            "max_link_speed": _opt(root, f"{rel}/max_link_speed"),
            "max_link_width": _opt(root, f"{rel}/max_link_width"),
            "aer_dev_fatal": _opt(root, f"{rel}/aer_dev_fatal"),
            "aer_dev_nonfatal": _opt(root, f"{rel}/aer_dev_nonfatal"),
        })
    return out


# -- trainprobe's own prerequisites -----------------------------------------------------------------

def read_probe_prerequisites(root: str = "/") -> dict[str, Any]:
    """What trainprobe's probes need: rights to attach, perf, tracing, BTF, bcc, kernel headers."""
    release = _opt(root, "proc/sys/kernel/osrelease") or platform.release()
    build = procfs.path(root, f"lib/modules/{release}/build")
    headers: dict[str, Any] = {"path": f"/lib/modules/{release}/build", "exists": os.path.isdir(build)}
    if headers["exists"]:
        headers["target"] = os.path.realpath(build) if os.path.islink(build) else None
        rel_text = procfs.try_read_text(root, f"lib/modules/{release}/build/include/config/kernel.release")
        headers["release"] = rel_text.strip() if rel_text else None
    pmu_dir = procfs.path(root, "sys/bus/event_source/devices")
    try:
        pmus = sorted(os.listdir(pmu_dir))
    except OSError:
        pmus = []
    bcc_paths = ["/" + p for p in ("usr/lib/python3/dist-packages/bcc/__init__.py",
                             "usr/lib64/python3/site-packages/bcc/__init__.py",
                             "usr/lib/python3/site-packages/bcc/__init__.py")
                 if os.path.exists(procfs.path(root, p))]
    bcc_paths += ["/" + os.path.relpath(p, root) for p in
                  glob.glob(procfs.path(root, "usr/lib*/python3*/site-packages/bcc/__init__.py"))]
    py_spy = None
    if root == "/":
        py_spy = shutil.which("py-spy") or (
            os.path.join(os.path.dirname(sys.executable), "py-spy")
            if os.path.exists(os.path.join(os.path.dirname(sys.executable), "py-spy")) else None)
    return {
        "euid": os.geteuid() if root == "/" else None,
        "cap_eff": _cap_eff(root),
        "ptrace_scope": _opt(root, "proc/sys/kernel/yama/ptrace_scope"),
        "perf_event_paranoid": _opt(root, "proc/sys/kernel/perf_event_paranoid"),
        "pmus": pmus,
        "tracefs": _tracefs(root),
        "btf": os.path.exists(procfs.path(root, "sys/kernel/btf/vmlinux")),
        "kernel_release": release,
        "headers": headers,
        "bcc": sorted(set(bcc_paths)),
        "py_spy": py_spy,
    }


def _tracefs(root: str) -> dict[str, Any]:
    """Where tracefs is mounted, and whether this user can reach its events (root-only by default)."""
    mounts = procfs.try_read_text(root, "proc/self/mounts") or ""
    points = [ln.split()[1] for ln in mounts.splitlines() if len(ln.split()) > 2 and ln.split()[2] == "tracefs"]
    out: dict[str, Any] = {"mounts": points}
    for d in ("/sys/kernel/tracing", "/sys/kernel/debug/tracing"):
        ev = procfs.path(root, d.lstrip("/") + "/events")
        out[d] = {"events": os.path.isdir(ev), "readable": os.access(ev, os.R_OK | os.X_OK)}
    return out


def _cap_eff(root: str) -> str | None:
    status = procfs.try_read_text(root, "proc/self/status") or ""
    for line in status.splitlines():
        if line.startswith("CapEff:"):
            return line.split(":", 1)[1].strip()
    return None


# -- the probe ---------------------------------------------------------------------------------------

# Reads kept as the kernel wrote them (parsed by probes/parsers/hostfacts.py). The limits are this
# process's: preflight runs where the job will, and the job inherits them.
TEXT_FILES = {"meminfo": "proc/meminfo", "limits": "proc/self/limits"}

class HostProbe(ReadingProbe):
    """The node's host facts, one read per fact, for preflight's host and GPU-bus checks."""

    name = "host"
    description = "Node health facts: CPUs, memory, /dev/shm, limits, disks, kernel log, PCI GPUs"
    needs = ()
    cost = "a few dozen small file reads and the kernel log ring (about 1 MB), well under a second"
    timeout_s = 10.0
    reads = {
        "cpus": "/sys/devices/system/cpu/{online,present}",
        "governors": "/sys/devices/system/cpu/cpu*/cpufreq/scaling_governor",
        "meminfo": "/proc/meminfo",
        "numa": "/sys/devices/system/node",
        "shm": "/dev/shm",
        "limits": "/proc/self/limits",
        "vm": "/sys/kernel/mm/transparent_hugepage, /proc/sys/kernel/numa_balancing",
        "disk": "statvfs of the disk paths",
        "kernel_log": "/dev/kmsg",
        "prereqs": "trainprobe's probe prerequisites",
        "pci": "/sys/bus/pci/devices",
    }
    evidence_schema = reads_schema("HostReads", reads)

    def check(self, spec: WatchSpec) -> Availability:
        if not os.path.isdir(spec.root):
            return Availability.no(f"{spec.root} is not a directory: nothing to read")
        return Availability.yes()

    def read(self, name: str, spec: WatchSpec, rec: Recorder) -> Any:
        root, opts = spec.root, spec.options
        if name in TEXT_FILES:
            return rec.read_file(procfs.path(root, TEXT_FILES[name]), artifact=name)
        readers = {
            "cpus": lambda: read_cpus(root, opts.get("job_cpus")),
            "governors": lambda: read_governors(root),
            "numa": lambda: read_numa(root),
            "shm": lambda: read_shm(root),
            "vm": lambda: read_vm_settings(root),
            "disk": lambda: read_disk(list(opts.get("disk_paths") or []), root),
            "kernel_log": lambda: read_kernel_log(root),
            "prereqs": lambda: read_probe_prerequisites(root),
            "pci": lambda: read_pci_gpus(root),
        }
        return readers[name]()
