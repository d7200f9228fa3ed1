"""throttle probe: CPU quota throttling of the target's cgroup over the window.

A container or Slurm step with a CPU quota (cgroup v2 `cpu.max`, v1 `cpu.cfs_quota_us`) is stopped
by the kernel for the rest of each period once it has used its quota: the job then runs slower than
its CPUs suggest, with no sign of it in its own threads. The kernel counts it in the cgroup's
`cpu.stat`: the periods that ran, the periods that hit the quota (`nr_throttled`) and the time spent
throttled (`throttled_usec` in v2, `throttled_time` in ns in v1). Read once at each end of the
window, with the quota, from the cgroup that /proc/PID/cgroup names (v2 first, then v1's cpu
controller). Cost: four small reads; nothing attaches to the target.
"""
from __future__ import annotations

import os
import time

from trainprobe.probes.base import Availability, Capture, Probe, Recorder, WatchSpec
from trainprobe.probes.errors import ProbeError
from trainprobe.probes.parsers import procfs
from trainprobe.probes.schema import ThrottleEvidence

# Where each hierarchy is mounted: the v2 tree alone, or beside v1's controllers (hybrid).
V2_MOUNTS = ("sys/fs/cgroup", "sys/fs/cgroup/unified")
V1_MOUNTS = ("sys/fs/cgroup/cpu", "sys/fs/cgroup/cpu,cpuacct", "sys/fs/cgroup/cpuacct,cpu")


def parse_cpu_stat(text: str) -> dict[str, int]:
    """cpu.stat ('nr_periods 20' a line, v1 or v2) -> {key: value}; lines that are not `key int` are skipped."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, _, value = line.strip().partition(" ")
        if key and value.strip().lstrip("-").isdigit() and value.strip().isascii():
            out[key] = int(value)
    return out


def throttled_seconds(stat: dict[str, int]) -> float | None:
    """Time throttled so far: v2 counts microseconds, v1 nanoseconds; None when neither is counted."""
    if "throttled_usec" in stat:
        return stat["throttled_usec"] / 1e6
    if "throttled_time" in stat:
        return stat["throttled_time"] / 1e9
    return None


def quota_cpus(version: int, files: dict[str, str | None]) -> float | None:
    """The quota in CPUs (quota / period), or None when the cgroup has none ('max', -1)."""
    if version == 2:
        return procfs.parse_cpu_max(files.get("cpu.max"))
    try:
        quota = int((files.get("cpu.cfs_quota_us") or "").strip())
        period = int((files.get("cpu.cfs_period_us") or "").strip())
    except ValueError:
        return None
    return round(quota / period, 3) if quota > 0 and period > 0 else None


def throttling(start: str, end: str, window_s: float | None) -> dict[str, float | int | None]:
    """Two readings of cpu.stat -> the window's periods, throttled periods, their share and the time."""
    a, b = parse_cpu_stat(start), parse_cpu_stat(end)
    periods = b.get("nr_periods", 0) - a.get("nr_periods", 0)
    throttled = b.get("nr_throttled", 0) - a.get("nr_throttled", 0)
    t_a, t_b = throttled_seconds(a), throttled_seconds(b)
    seconds = round(t_b - t_a, 6) if t_a is not None and t_b is not None else None
    share = round(seconds / window_s, 4) if seconds is not None and window_s else None
    return {"periods": periods, "throttled_periods": throttled,
            "throttled_period_share": round(throttled / periods, 4) if periods > 0 else None,
            "throttled_seconds": seconds, "throttled_share_of_window": share}


def find_cgroup(root: str, cgroup_text: str | None) -> tuple[int, str] | None:
    """The target's cgroup directory whose cpu.stat counts throttling: v2 (the `0::` line) or v1's cpu
    controller, whichever counts periods (on a hybrid host the quota lives in v1); else the first
    cpu.stat found (a cgroup without a quota counts no periods)."""
    lines = [ln.split(":", 2) for ln in (cgroup_text or "").splitlines() if ln.count(":") >= 2]
    v2 = next((p for h, c, p in lines if h == "0" and c == ""), None)
    v1 = next((p for h, c, p in lines if "cpu" in c.split(",")), None)
    found: list[tuple[int, str, str]] = []
    for version, rel, mounts in ((2, v2, V2_MOUNTS), (1, v1, V1_MOUNTS)):
        for mount in mounts if rel is not None else ():
            d = procfs.path(root, os.path.join(mount, (rel or "").lstrip("/")))
            stat = procfs.try_read_text("/", os.path.join(d, "cpu.stat").lstrip("/"))
            if stat is not None:
                found.append((version, d, stat))
                break
    counting = [(v, d) for v, d, stat in found if "nr_periods" in parse_cpu_stat(stat)]
    return (counting or [(v, d) for v, d, _ in found] or [None])[0]


class ThrottleProbe(Probe):
    name = "throttle"
    description = "CPU quota throttling of the target's cgroup over the window (cpu.stat)"
    needs = ("cgroup v2 cpu.stat, or cgroup v1's cpu controller",)
    cost = "negligible: four small cgroup reads, two at each end of the window"
    timeout_s = 5.0
    default_enabled = False
    evidence_schema = ThrottleEvidence

    def check(self, spec: WatchSpec) -> Availability:
        if find_cgroup(spec.root, procfs.try_read_text(spec.root, f"proc/{spec.pid}/cgroup")) is None:
            return Availability.no(f"no cpu.stat for the cgroup of PID {spec.pid} (no cpu controller mounted)")
        return Availability.yes()

    def capture(self, spec: WatchSpec, rec: Recorder, deadline_monotonic: float) -> None:
        found = find_cgroup(spec.root, rec.read_file(procfs.path(spec.root, f"proc/{spec.pid}/cgroup")))
        if found is None:
            raise ProbeError(f"no cpu.stat for the cgroup of PID {spec.pid}")
        version, d = found
        rec.capture.meta.update({"cgroup_dir": d, "cgroup_version": version})
        quota_files = ("cpu.max",) if version == 2 else ("cpu.cfs_quota_us", "cpu.cfs_period_us")
        for f in quota_files:
            try:
                rec.read_file(os.path.join(d, f), artifact=f)
            except ProbeError:
                pass                      # the root cgroup has no quota file: no quota
        t0 = time.monotonic()
        rec.read_file(os.path.join(d, "cpu.stat"), artifact="cpu.stat.start")
        rec.wait_window(deadline_monotonic)
        t1 = time.monotonic()
        rec.read_file(os.path.join(d, "cpu.stat"), artifact="cpu.stat.end")
        rec.capture.meta["interval_s"] = round(t1 - t0, 6)

    @staticmethod
    def parse(capture: Capture) -> ThrottleEvidence:
        art, meta = capture.artifacts, capture.meta
        version = int(meta.get("cgroup_version") or 0)
        window = meta.get("interval_s")
        counts = throttling(art.get("cpu.stat.start", ""), art.get("cpu.stat.end", ""), window)
        return ThrottleEvidence(cgroup_dir=meta.get("cgroup_dir"), cgroup_version=version, window_s=window,
                                quota_cpus=quota_cpus(version, art), **counts)  # type: ignore[typeddict-item]
