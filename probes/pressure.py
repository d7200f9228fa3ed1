"""Pressure stall information (PSI): how much of the window tasks stalled for CPU, I/O or memory.

Reads /proc/pressure/{cpu,io,memory} for the host and, on cgroup v2, {cpu,io,memory}.pressure of
the target's cgroup, once at the start and once at the end of the window: six small files each
time, a negligible cost. The kernel's `total` counters (microseconds stalled) give the share of the
window in which some task (or every non-idle task: `full`) of the host or the cgroup waited for the
resource; the kernel's own 10/60/300 s averages are kept beside it.
"""
from __future__ import annotations

import os
import time
from typing import TypedDict

from trainprobe.probes.parsers import procfs
from trainprobe.probes.base import Availability, Capture, Probe, Recorder, WatchSpec
from trainprobe.probes.schema import PressureEvidence, Stall
from trainprobe.probes.errors import ProbeError

RESOURCES = ("cpu", "io", "memory")


class PressureLine(TypedDict):
    avg10: float
    avg60: float
    avg300: float
    total_us: int


def parse_pressure(text: str) -> dict[str, PressureLine]:
    """One PSI file ('some avg10=0.00 avg60=0.00 avg300=0.00 total=0' and a 'full' line) -> by kind.

    The host's cpu file has no `full` line before Linux 5.13; a missing line is simply absent.
    """
    out: dict[str, PressureLine] = {}
    for line in text.splitlines():
        kind, _, rest = line.strip().partition(" ")
        if kind not in ("some", "full"):
            continue
        kv = dict(f.split("=", 1) for f in rest.split() if "=" in f)
        out[kind] = PressureLine(avg10=float(kv["avg10"]), avg60=float(kv["avg60"]),
                                 avg300=float(kv["avg300"]), total_us=int(kv["total"]))
    return out


def stalls(start: str, end: str, window_s: float | None) -> dict[str, Stall]:
    """Two readings of one PSI file -> per kind, the averages at the end and the window's stall share."""
    a, b = parse_pressure(start), parse_pressure(end)
    out: dict[str, Stall] = {}
    for kind, last in b.items():
        first = a.get(kind)
        frac = None
        if first is not None and window_s and window_s > 0 and last["total_us"] >= first["total_us"]:
            frac = round(min(1.0, (last["total_us"] - first["total_us"]) / 1e6 / window_s), 4)
        out[kind] = Stall(avg10=last["avg10"], avg60=last["avg60"], avg300=last["avg300"], stall_fraction=frac)
    return out


def cgroup_v2_path(cgroup_text: str) -> str | None:
    """/proc/PID/cgroup -> the process's cgroup v2 path ('0::/path' line); None on v1 or at the root,
    whose pressure is the host's."""
    for line in cgroup_text.splitlines():
        if line.startswith("0::"):
            rel = line[3:].strip()
            return rel if rel not in ("", "/") else None
    return None


def cgroup_dir(root: str, rel: str) -> str | None:
    """Where the cgroup v2 hierarchy is mounted (/sys/fs/cgroup, or .../unified on hybrid hosts)."""
    for mount in ("sys/fs/cgroup", "sys/fs/cgroup/unified"):
        if os.path.exists(procfs.path(root, mount, "cgroup.controllers")):
            d = procfs.path(root, mount, rel)
            return d if os.path.isdir(d) else None
    return None


class PressureProbe(Probe):
    name = "pressure"
    description = "Pressure stall information: share of the window stalled on CPU, I/O, memory"
    needs = ("Linux 4.20+ with PSI enabled (/proc/pressure)",)
    cost = "negligible: six small /proc and cgroup reads at each end of the window"
    timeout_s = 5.0
    evidence_schema = PressureEvidence

    def check(self, spec: WatchSpec) -> Availability:
        path = procfs.path(spec.root, "proc/pressure/cpu")
        try:
            with open(path) as fh:
                fh.read()
        except FileNotFoundError:
            return Availability.no("no /proc/pressure: this kernel has no PSI (Linux 4.20+, CONFIG_PSI)")
        except OSError:
            return Availability.no("PSI is compiled in but off: boot with psi=1 to enable /proc/pressure")
        return Availability.yes()

    def _read_all(self, spec: WatchSpec, rec: Recorder, cgdir: str | None, when: str) -> None:
        for res in RESOURCES:
            files = [("host", procfs.path(spec.root, f"proc/pressure/{res}"))]
            if cgdir:
                files.append(("cgroup", os.path.join(cgdir, f"{res}.pressure")))
            for scope, path in files:
                try:
                    rec.read_file(path, artifact=f"{scope}/{res}.{when}")
                except ProbeError:
                    pass   # io/memory may be off in a cgroup; the parser reports what it has

    def capture(self, spec: WatchSpec, rec: Recorder, deadline_monotonic: float) -> None:
        try:
            rel = cgroup_v2_path(rec.read_file(procfs.path(spec.root, f"proc/{spec.pid}/cgroup")))
        except ProbeError:
            rel = None
        cgdir = cgroup_dir(spec.root, rel) if rel else None
        rec.capture.meta["cgroup_path"] = cgdir
        t0 = time.monotonic()
        self._read_all(spec, rec, cgdir, "start")
        rec.wait_window(deadline_monotonic)
        t1 = time.monotonic()
        self._read_all(spec, rec, cgdir, "end")
        rec.capture.meta["interval_s"] = round(t1 - t0, 6)

    @staticmethod
    def parse(capture: Capture) -> PressureEvidence:
        art, window = capture.artifacts, capture.meta.get("interval_s")
        scopes: dict[str, dict[str, dict[str, Stall]]] = {"host": {}, "cgroup": {}}
        for scope, by_res in scopes.items():
            for res in RESOURCES:
                start, end = art.get(f"{scope}/{res}.start"), art.get(f"{scope}/{res}.end")
                if start is not None and end is not None:
                    by_res[res] = stalls(start, end, window)
        return PressureEvidence(window_s=window, host=scopes["host"], cgroup=scopes["cgroup"],
                                cgroup_path=capture.meta.get("cgroup_path"))
