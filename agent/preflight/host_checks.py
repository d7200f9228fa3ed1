"""Host checks: CPUs, memory, /dev/shm, limits, kernel memory settings, disks, the kernel log.

Each is a pure function of the host probe's reads (probes/host.py; parsers in probes/parsers/hostfacts.py)
and the profile.
"""
from __future__ import annotations

from typing import Any

from trainprobe.agent.preflight import GIB, Result, gib
from trainprobe.agent.preflight.engine import Reads, check
from trainprobe.probes.parsers import hostfacts
from trainprobe.probes.parsers.procfs import format_cpulist, parse_cpulist


@check("host.cpus_online", "host", ("cpus",))
def cpus_online(r: Reads, p: dict[str, Any]) -> Result:
    d = r.data("cpus")
    online, present = parse_cpulist(d.get("online")), parse_cpulist(d.get("present"))
    job = parse_cpulist(d.get("job_cpus"))
    want = int(p["host"]["cpus_online"])
    offline = sorted(set(present) - set(online))
    observed = f"{len(online)} online of {len(present) or '?'} present" + (f"; the job may use {len(job)}" if job else "")
    expected = f">= {want} online" if want else "every present CPU online"
    src = "/sys/devices/system/cpu/{online,present}"
    details = {"online": d.get("online"), "present": d.get("present"), "job_cpus": d.get("job_cpus")}
    if want and len(online) < want:
        return Result("critical", observed, expected, f"only {len(online)} CPUs online, the profile expects {want}",
                      remediation="check the BIOS (cores or SMT disabled) and `cat /sys/devices/system/cpu/offline`",
                      value=len(online), unit="cpus", source=src, details=details)
    if offline:
        return Result("warn", observed, expected, f"CPUs {format_cpulist(offline)} are present but offline",
                      remediation=f"bring them online: echo 1 | tee /sys/devices/system/cpu/cpu{{{format_cpulist(offline)}}}/online",
                      value=len(online), unit="cpus", source=src, details=details)
    return Result("ok", observed, expected, f"{len(online)} CPUs online", value=len(online), unit="cpus",
                  source=src, details=details)


@check("host.numa_nodes", "host", ("numa",))
def numa_nodes(r: Reads, p: dict[str, Any]) -> Result:
    d = r.data("numa")
    nodes = parse_cpulist(d.get("online")) or [0]
    want = int(p["host"]["numa_nodes"])
    cpus = {n: v.get("cpulist") for n, v in (d.get("nodes") or {}).items()}
    observed = f"{len(nodes)} node(s): " + "; ".join(f"node{n} CPUs {c}" for n, c in cpus.items())
    expected = f"{want} nodes" if want else "any"
    if want and len(nodes) != want:
        return Result("warn", observed, expected, f"{len(nodes)} NUMA nodes where the profile expects {want}",
                      remediation="check the BIOS NUMA setting (sub-NUMA clustering, NPS) against the node type",
                      value=len(nodes), unit="nodes", source="/sys/devices/system/node", details={"nodes": cpus})
    return Result("ok", observed, expected, f"{len(nodes)} NUMA node(s)", value=len(nodes), unit="nodes",
                  source="/sys/devices/system/node", details={"nodes": cpus})


@check("host.cpu_governor", "host", ("governors",))
def cpu_governor(r: Reads, p: dict[str, Any]) -> Result:
    d = r.data("governors")
    govs: dict[str, str] = d.get("governors") or {}
    allowed = list(p["host"]["governors"])
    expected = " or ".join(allowed) if allowed else "any"
    src = "/sys/devices/system/cpu/cpu*/cpufreq/scaling_governor"
    if not govs:
        if not allowed:
            return Result("ok", "no cpufreq", expected,
                          "not applicable: no cpufreq driver, the firmware or hypervisor sets the CPU frequency",
                          source=src)
        # The profile asks for a governor and the host does not expose one: the fact is not visible, so
        # the check cannot pass (a hypervisor may still run the CPUs at low clocks).
        return Result("unknown", "no cpufreq", expected,
                      f"cannot tell: no cpufreq driver, so the governor the profile expects ({expected}) cannot be "
                      "read; the firmware or hypervisor sets the CPU frequency",
                      remediation="check the BIOS/hypervisor power profile (e.g. 'maximum performance'), or use a "
                                  "profile with [host] governors = [] on a node without cpufreq",
                      source=src)
    counts: dict[str, int] = {}
    for g in govs.values():
        counts[g] = counts.get(g, 0) + 1
    observed = ", ".join(f"{g} on {n} of {len(govs)} CPUs" for g, n in sorted(counts.items(), key=lambda x: -x[1]))
    bad = {g: n for g, n in counts.items() if allowed and g not in allowed}
    details = {"counts": counts, "driver": d.get("driver")}
    if bad:
        worst = max(bad, key=lambda g: bad[g])
        return Result("warn", observed, expected,
                      f"{sum(bad.values())} CPUs run the {worst} governor: the host side of the step "
                      "(Python, the DataLoader, kernel launches) runs at lower clocks",
                      remediation=f"cpupower frequency-set -g {allowed[0]}   (or: echo {allowed[0]} | tee "
                                  "/sys/devices/system/cpu/cpu*/cpufreq/scaling_governor)",
                      value=sum(bad.values()), unit="cpus", source=src, details=details)
    return Result("ok", observed, expected, f"every CPU runs {expected}", value=0, unit="cpus", source=src,
                  details=details)


@check("host.memory", "host", ("meminfo",))
def memory(r: Reads, p: dict[str, Any]) -> Result:
    m = hostfacts.parse_meminfo(r.data("meminfo"))
    total, avail = m.get("MemTotal"), m.get("MemAvailable")
    want = float(p["host"]["min_memory_gib"])
    frac_min = float(p["host"]["min_memory_available_fraction"])
    observed = f"{gib(total)} total, {gib(avail)} available"
    expected = (f">= {want:g} GiB total; " if want else "") + f">= {frac_min:.0%} available"
    details = {"MemTotal": total, "MemAvailable": avail}
    if total is None:
        return Result("unknown", "no MemTotal", expected, "/proc/meminfo has no MemTotal", source="/proc/meminfo")
    if want and total < want * GIB * 0.95:
        return Result("critical", observed, expected, f"{gib(total)} of memory where the profile expects {want:g} GiB",
                      remediation="a DIMM failed or is not detected: check `dmidecode -t 17` and the BMC log",
                      value=total, unit="bytes", source="/proc/meminfo", details=details)
    if avail is not None and avail < frac_min * total:
        return Result("warn", observed, expected,
                      f"only {avail / total:.0%} of memory is available: an earlier job's processes or "
                      "files in /dev/shm may still hold it",
                      remediation="look for leftover processes (ps -eo pid,user,rss,cmd --sort=-rss | head) and "
                                  "files in /dev/shm and /tmp",
                      value=avail, unit="bytes", source="/proc/meminfo", details=details)
    return Result("ok", observed, expected, f"{gib(avail)} of {gib(total)} available", value=avail, unit="bytes",
                  source="/proc/meminfo", details=details)


@check("host.swap", "host", ("meminfo",))
def swap(r: Reads, p: dict[str, Any]) -> Result:
    m = hostfacts.parse_meminfo(r.data("meminfo"))
    total, free = m.get("SwapTotal", 0), m.get("SwapFree", 0)
    used = total - free
    mode = p["host"]["swap"]
    max_used = float(p["host"]["max_swap_used_gib"]) * GIB
    observed = "none" if not total else f"{gib(total)}, {gib(used)} in use"
    expected = ("no swap" if mode == "off" else "any") + f"; <= {gib(max_used)} in use"
    details = {"SwapTotal": total, "SwapFree": free}
    if mode == "off" and total:
        return Result("warn", observed, expected, "swap is configured on a node that should have none",
                      remediation="swapoff -a (and remove the swap entry from /etc/fstab)",
                      value=used, unit="bytes", source="/proc/meminfo", details=details)
    if used > max_used:
        return Result("warn", observed, expected, f"{gib(used)} of swap in use: memory pressure before the job starts",
                      remediation="find what was swapped out (grep VmSwap /proc/*/status | sort -k2 -n | tail)",
                      value=used, unit="bytes", source="/proc/meminfo", details=details)
    return Result("ok", observed, expected, "no swap" if not total else f"{gib(used)} of swap in use",
                  value=used, unit="bytes", source="/proc/meminfo", details=details)


@check("host.shm", "host", ("shm",))
def shm(r: Reads, p: dict[str, Any]) -> Result:
    s = hostfacts.parse_shm(r.data("shm"))
    want = float(p["host"]["min_shm_gib"]) * GIB
    expected = f">= {gib(want)} size and free"
    fix = ("docker run --shm-size=16g (Kubernetes: an emptyDir with medium: Memory at /dev/shm); "
           "on a host: mount -o remount,size=50% /dev/shm")
    src = s.get("source") or "/proc/self/mounts"
    if not s["mounted"]:
        return Result("critical", "not mounted", expected,
                      "/dev/shm is not mounted: DataLoader workers and NCCL pass data through it",
                      remediation="mount -t tmpfs -o size=50% tmpfs /dev/shm", source=src)
    size, free = s["size_bytes"], s["free_bytes"]
    observed = f"{gib(size)}" + (f", {gib(free)} free" if free is not None else "") + f" ({s['fstype']})"
    details = {"size_bytes": size, "free_bytes": free, "fstype": s["fstype"]}
    if size is None:
        return Result("unknown", observed, expected, "the size of /dev/shm could not be read", source=src)
    if size < want:
        return Result("critical", observed, expected,
                      f"/dev/shm is {gib(size)}: DataLoader workers fail with 'Bus error' or 'No space left on "
                      "device' once their batches outgrow it",
                      remediation=fix, value=size, unit="bytes", source=src, details=details)
    if free is not None and free < want:
        return Result("critical", observed, expected,
                      f"/dev/shm has only {gib(free)} free of {gib(size)}: files left behind by an earlier job?",
                      remediation="remove stale files (ls -la /dev/shm; torch_* and nccl-* from dead jobs)",
                      value=free, unit="bytes", source=src, details=details)
    if s["fstype"] not in (None, "tmpfs"):
        return Result("warn", observed, expected, f"/dev/shm is {s['fstype']}, not tmpfs: shared memory goes to disk",
                      remediation="mount -t tmpfs -o size=50% tmpfs /dev/shm", value=size, unit="bytes",
                      source=src, details=details)
    return Result("ok", observed, expected, f"/dev/shm {gib(size)}", value=size, unit="bytes", source=src,
                  details=details)


@check("host.memlock", "host", ("limits",))
def memlock(r: Reads, p: dict[str, Any]) -> Result:
    lim = hostfacts.parse_limits(r.data("limits")).get("memlock")
    want_gib = float(p["host"]["memlock_gib"])
    expected = "unlimited" if want_gib < 0 else f">= {want_gib:g} GiB"
    if lim is None:
        return Result("unknown", "not listed", expected, "/proc/self/limits has no 'Max locked memory' line",
                      source="/proc/self/limits")
    soft = lim["soft"]
    observed = "unlimited" if soft is None else gib(soft)
    low = soft is not None and (want_gib < 0 or soft < want_gib * GIB)
    if low:
        return Result(p["host"]["memlock_status"], observed, expected,
                      f"RLIMIT_MEMLOCK is {observed}: RDMA (NCCL over InfiniBand or RoCE, GPUDirect) registers "
                      "memory against it, and a low limit makes registration fail or NCCL fall back or hang",
                      remediation="/etc/security/limits.conf: '* - memlock unlimited'; for slurmd (jobs inherit "
                                  "its limits): LimitMEMLOCK=infinity in its systemd unit; docker: --ulimit memlock=-1",
                      value=soft, unit="bytes", source="/proc/self/limits", details=lim)
    return Result("ok", observed, expected, f"memlock {observed}", value=soft if soft is not None else -1,
                  unit="bytes", source="/proc/self/limits", details=lim)


@check("host.nofile", "host", ("limits",))
def nofile(r: Reads, p: dict[str, Any]) -> Result:
    lim = hostfacts.parse_limits(r.data("limits")).get("nofile")
    want = int(p["host"]["min_nofile"])
    expected = f">= {want}"
    if lim is None:
        return Result("unknown", "not listed", expected, "/proc/self/limits has no 'Max open files' line",
                      source="/proc/self/limits")
    soft, hard = lim["soft"], lim["hard"]
    observed = f"{'unlimited' if soft is None else soft} (hard {'unlimited' if hard is None else hard})"
    if soft is not None and soft < want:
        fix = (f"ulimit -n {want} in the job script (the hard limit allows it)" if hard is None or hard >= want
               else f"/etc/security/limits.conf: '* - nofile {want}' (the hard limit is {hard})")
        return Result("warn", observed, expected,
                      f"open-files limit {soft}: DataLoader workers sharing tensors through file descriptors fail "
                      "with 'Too many open files'", remediation=fix, value=soft, unit="files",
                      source="/proc/self/limits", details=lim)
    return Result("ok", observed, expected, f"nofile {observed}", value=soft if soft is not None else -1,
                  unit="files", source="/proc/self/limits", details=lim)


@check("host.thp", "host", ("vm",))
def thp(r: Reads, p: dict[str, Any]) -> Result:
    d = r.data("vm")
    mode = hostfacts.bracketed(d.get("thp_enabled"))
    allowed = list(p["host"]["thp"])
    expected = " or ".join(allowed) if allowed else "any"
    src = "/sys/kernel/mm/transparent_hugepage/enabled"
    if mode is None:
        return Result("ok", "no THP", expected, "not applicable: the kernel has no transparent huge pages", source=src)
    observed = f"{mode} (defrag {hostfacts.bracketed(d.get('thp_defrag'))})"
    if allowed and mode not in allowed:
        return Result("warn", observed, expected,
                      f"transparent huge pages are '{mode}': large host buffers use 4 KiB pages",
                      remediation=f"echo {allowed[-1]} > {src}", source=src)
    return Result("ok", observed, expected, f"THP {mode}", source=src)


@check("host.numa_balancing", "host", ("vm", "numa"))
def numa_balancing(r: Reads, p: dict[str, Any]) -> Result:
    d = r.data("vm")
    nodes = parse_cpulist(r.data("numa").get("online")) or [0]
    val = d.get("numa_balancing")
    want = int(p["host"]["numa_balancing"])
    expected = "any" if want < 0 else str(want) + " on multi-NUMA nodes"
    src = "/proc/sys/kernel/numa_balancing"
    if val is None:
        return Result("ok", "absent", expected, "not applicable: the kernel has no automatic NUMA balancing", source=src)
    if len(nodes) < 2:
        return Result("ok", val, expected, f"not applicable on {len(nodes)} NUMA node", value=int(val), source=src)
    if want >= 0 and int(val) != want:
        return Result("warn", val, expected,
                      "automatic NUMA balancing migrates the pages of a pinned training process and its "
                      "workers, adding page faults the job did not ask for",
                      remediation=f"sysctl -w kernel.numa_balancing={want}", value=int(val), source=src)
    return Result("ok", val, expected, f"numa_balancing {val}", value=int(val), source=src)


@check("host.disk", "host", ("disk",))
def disk(r: Reads, p: dict[str, Any]) -> list[Result]:
    d = r.data("disk")
    warn_pct = float(p["host"]["disk_warn_used_pct"])
    min_free = float(p["host"]["disk_min_free_gib"]) * GIB
    expected = f">= {gib(min_free)} available, < {warn_pct:g}% used"
    out = []
    for path, st in d.items():
        if "error" in st:
            out.append(Result("unknown", "unreadable", expected, st["error"], target=path, source="statvfs",
                              remediation="create the path, or drop it from the profile's disk_paths"))
            continue
        used = st["total"] - st["free"]
        # df's Use%: used / (used + available to unprivileged users)
        pct = 100.0 * used / (used + st["avail"]) if used + st["avail"] > 0 else 0.0
        observed = f"{gib(st['avail'])} available, {pct:.0f}% used"
        if st["avail"] < min_free:
            out.append(Result("critical", observed, expected,
                              f"{path} has {gib(st['avail'])} available: checkpoints and logs will fail to write",
                              remediation=f"free space on {path} (du -xsh {path.rstrip('/')}/* | sort -h | tail)",
                              target=path, value=st["avail"], unit="bytes", source="statvfs", details=st))
        elif pct >= warn_pct:
            out.append(Result("warn", observed, expected, f"{path} is {pct:.0f}% full",
                              remediation=f"free space on {path}", target=path, value=st["avail"], unit="bytes",
                              source="statvfs", details=st))
        else:
            out.append(Result("ok", observed, expected, f"{path}: {observed}", target=path, value=st["avail"],
                              unit="bytes", source="statvfs", details=st))
    return out


# Kernel-log events and what they mean for a job about to start.
_EVENT_TEXT = {
    "fallen_off_bus": "a GPU fell off the bus",
    "mce": "machine check",
    "edac_ue": "uncorrectable host memory error (EDAC)",
    "edac_ce": "corrected host memory error (EDAC)",
    "aer_uncorrected": "uncorrected PCIe error (AER)",
    "io_error": "block I/O error",
}


def _event_status(ev: dict[str, Any], warn_xids: set[int]) -> str:
    k = ev["kind"]
    if k == "xid":
        return "warn" if ev["code"] in warn_xids else "critical"
    if k in ("fallen_off_bus", "edac_ue"):
        return "critical"
    return "warn"


@check("host.kernel_log", "host", ("kernel_log",))
def kernel_log(r: Reads, p: dict[str, Any]) -> Result:
    rec = r.get("kernel_log")
    hours = float(p["host"]["kernel_log_hours"])
    expected = f"no GPU, machine-check, memory or PCIe errors in the last {hours:g} h"
    if rec is not None and rec.get("error") and rec["error"]["kind"] in ("permission_denied", "unavailable"):
        return Result("unknown", "unreadable", expected, f"the kernel log cannot be read: {rec['error']['message']}",
                      remediation="run preflight as root (a Slurm prolog does), or sysctl kernel.dmesg_restrict=0",
                      source="/dev/kmsg")
    d = r.data("kernel_log")
    events = hostfacts.classify_kernel_events(d)
    warn_xids = set(int(x) for x in p["gpu"]["xid_warn_only"])
    window = hours * 3600
    statuses = []
    for ev in events:
        st = _event_status(ev, warn_xids)
        if st == "critical" and ev.get("age_s") is not None and ev["age_s"] > window:
            st = "warn"
        ev["status"] = st
        statuses.append(st)
    n = len(events)
    src = d.get("source", "/dev/kmsg")
    details = {"records_read": d.get("records_read"), "events": events[-50:]}
    if not events:
        return Result("ok", f"none in {d.get('records_read')} records", expected, "no errors in the kernel log",
                      value=0, unit="events", source=src, details=details)
    worst = "critical" if "critical" in statuses else "warn"
    top = next(e for e in events if e["status"] == worst)
    desc = (f"Xid {top['code']}" + (f" on {top['device']}" if top.get("device") else "")) if top["kind"] == "xid" \
        else _EVENT_TEXT.get(top["kind"], top["kind"]) + (f" ({top['device']})" if top.get("device") else "")
    ago = f", {top['age_s'] / 3600:.1f} h ago" if top.get("age_s") is not None else ""
    kinds: dict[str, int] = {}
    for e in events:
        label = f"Xid {e['code']}" if e["kind"] == "xid" else e["kind"]
        kinds[label] = kinds.get(label, 0) + 1
    observed = ", ".join(f"{k} x{v}" for k, v in kinds.items())
    fix = ("drain the node and look up the Xid in NVIDIA's Xid catalog; most GPU Xids need a GPU reset "
           "(nvidia-smi -r) or a reboot" if top["kind"] in ("xid", "fallen_off_bus", "sxid")
           else "read the full lines (dmesg -T | grep -iE 'mce|edac|aer|i/o error') and call the hardware vendor")
    return Result(worst, observed, expected, f"{n} kernel error event(s); worst: {desc}{ago}: {top['text'][:160]}",
                  remediation=fix, value=n, unit="events", source=src, details=details)
