"""perf stat probe: hardware and software counters of the training process and, separately, of its
DataLoader workers, over the window.

Runs two `perf stat` sessions in counting mode (no sampling, no interrupts), one attached to the
training process and one to its worker processes, so the two can be told apart:

    perf stat -x ';' -I MS --interval-count N --per-thread --no-inherit -e EVENTS -p PIDS -o FILE

Events: instructions, cycles, LLC-loads, LLC-load-misses, cache-references, cache-misses (hardware)
and task-clock, context-switches, cpu-migrations, page-faults, major-faults (software). perf bounds
itself: `--interval-count` makes it exit after the window (perf 6.1 refuses `--timeout` together
with `-I`), and the session sends SIGINT, which makes perf print what it has and exit, if it is
still running after that. `--no-inherit` keeps processes the job forks during the window out of the
training process's counts; `--per-thread` keeps the training thread apart from torch's intra-op
threads. Cost: the kernel saves and restores each counter at every context switch of a watched
thread, and perf wakes once per interval to read and print them (a few ms of CPU per interval).

Where the host has no hardware PMU (most VMs: perf prints `<not supported>`), the software
counters are kept and the evidence says why the hardware ones are missing. Where perf is missing or
`kernel.perf_event_paranoid` forbids it, `check` says which and how to fix it.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections import defaultdict
from typing import Any

from trainprobe.probes.parsers import perfparse as pp
from trainprobe.probes.parsers import procfs
from trainprobe.probes.base import (Availability, Capture, JobShape, Probe, Recorder, WatchSpec, private_dir,
                                    remove_private_dir, which)
from trainprobe.probes.schema import PerfStatEvidence
from trainprobe.probes.errors import PermissionDenied, ProbeError, TargetGone, Unavailable

EVENTS = pp.HARDWARE_EVENTS + pp.SOFTWARE_EVENTS
SEP = ";"                       # never in an event name; ',' is (cpu/event=0x3c,umask=0x0/)
MIN_INTERVAL_MS = 100           # perf-stat.txt: overhead "could be high" below 100 ms
MAX_INTERVAL_MS = 1000
TARGET_INTERVALS = 10

CAP_SYS_ADMIN = 21
CAP_PERFMON = 38
# Names under /sys/bus/event_source/devices of CPU (core) PMUs. The core PMU of x86 registers as
# type 4 (PERF_TYPE_RAW); the others are named.
_CORE_PMU_PREFIXES = ("armv8", "armv7", "arm_cortex", "arm_neoverse", "cpum_cf", "riscv_pmu", "apple_")

INSTALL_HINT = ("install perf (Debian: `apt-get install linux-perf`; Ubuntu: `apt-get install "
                "linux-tools-common linux-tools-$(uname -r)`; Fedora/RHEL: `dnf install perf`)")


def perf_binary() -> str | None:
    return which("perf")


def interval_plan(window_s: float) -> tuple[int, int]:
    """(interval in ms, number of intervals) that cover the window with about ten readings."""
    ms = int(min(MAX_INTERVAL_MS, max(MIN_INTERVAL_MS, window_s * 1000.0 / TARGET_INTERVALS)))
    return ms, max(1, int(window_s * 1000.0 // ms))


def _cap_bits(status_text: str | None) -> int:
    if not status_text:
        return 0
    for ln in status_text.splitlines():
        if ln.startswith("CapEff:"):
            try:
                return int(ln.split()[1], 16)
            except (IndexError, ValueError):
                return 0
    return 0


def permission_problem(euid: int, cap_eff: int, paranoid: int | None, target_uid: int | None) -> str | None:
    """Why perf may not count the target's events for this user, in words a user can act on.

    kernel.perf_event_paranoid (Documentation/admin-guide/sysctl/kernel.rst): -1 all events for
    all users; >=0 no raw tracepoints; >=1 no CPU-wide events; >=2 no kernel-side counting (perf
    falls back to user-only `:u` events); Debian and Ubuntu kernels add 3 (and 4): no perf at all
    without CAP_PERFMON. Root, CAP_PERFMON or CAP_SYS_ADMIN bypass it.
    """
    if euid == 0 or cap_eff & (1 << CAP_PERFMON) or cap_eff & (1 << CAP_SYS_ADMIN):
        return None
    if paranoid is not None and paranoid > 2:
        return (f"kernel.perf_event_paranoid is {paranoid}: this kernel forbids perf to unprivileged users; "
                "run trainprobe as root, give perf CAP_PERFMON (`sudo setcap cap_perfmon+ep $(command -v perf)`), "
                "or `sudo sysctl kernel.perf_event_paranoid=2`")
    if target_uid is not None and target_uid != euid:
        return (f"the target belongs to uid {target_uid}: counting another user's process needs root or "
                f"CAP_PERFMON (kernel.perf_event_paranoid is {paranoid if paranoid is not None else 'unknown'})")
    return None


def classify_failure(stderr: str, rc: int | None) -> ProbeError:
    """perf's own error text -> the error taxonomy, with the fix."""
    text = stderr or ""
    m = re.search(r"perf_event_paranoid setting is (-?\d+)", text)
    if "Access to performance monitoring and observability operations is limited" in text or m:
        level = m.group(1) if m else "?"
        return PermissionDenied(
            f"perf was refused by the kernel (kernel.perf_event_paranoid is {level}): run trainprobe as root, "
            "give perf CAP_PERFMON, or lower kernel.perf_event_paranoid (2 lets a user count their own processes)")
    if "Problems finding threads of monitor" in text:
        return TargetGone("the process exited before perf could attach to it")
    if "not found for kernel" in text or "You may need to install" in text:
        return Unavailable("perf has no build for the running kernel: " + INSTALL_HINT)
    if "event syntax error" in text or "is not supported" in text:
        first = next((ln.strip() for ln in text.splitlines() if ln.strip() and ln.strip() != "Error:"), "")
        return Unavailable(f"perf could not open its events: {first}")
    first = next((ln.strip() for ln in text.splitlines() if ln.strip() and ln.strip() != "Error:"), "no output")
    return ProbeError(f"perf stat exited with status {rc}: {first}")


def read_pmu(root: str) -> dict[str, Any]:
    """Which perf event sources the kernel registered, and whether the CPU runs under a hypervisor."""
    base = procfs.path(root, "sys/bus/event_source/devices")
    sources: dict[str, int | None] = {}
    try:
        names = sorted(os.listdir(base))
    except OSError:
        names = []
    for n in names:
        t = procfs.try_read_text(root, f"sys/bus/event_source/devices/{n}/type")
        sources[n] = int(t.strip()) if t and t.strip().lstrip("-").isdigit() else None
    cpuinfo = procfs.try_read_text(root, "proc/cpuinfo") or ""
    flags = next((ln for ln in cpuinfo.splitlines() if ln.startswith(("flags", "Features"))), "")
    return {"sources": sources, "hypervisor": " hypervisor" in f" {flags.split(':', 1)[-1]} ",
            "core_pmus": core_pmus(sources)}


def core_pmus(sources: dict[str, int | None]) -> list[str]:
    return sorted(n for n, t in sources.items()
                  if t == 4 or n in ("cpu", "cpu_core", "cpu_atom") or n.startswith(_CORE_PMU_PREFIXES))


def hardware_reason(pmu: dict[str, Any], status: dict[str, str]) -> str | None:
    """Why IPC or LLC ratios are missing, or None when they were counted."""
    hw = {e: status.get(e) for e in pp.HARDWARE_EVENTS}
    ipc_ok = hw.get("instructions") == pp.COUNTED and hw.get("cycles") == pp.COUNTED
    llc_ok = (hw.get("LLC-loads") == pp.COUNTED and hw.get("LLC-load-misses") == pp.COUNTED) or \
             (hw.get("cache-references") == pp.COUNTED and hw.get("cache-misses") == pp.COUNTED)
    if ipc_ok and llc_ok:
        return None
    unsupported = [e for e, s in hw.items() if s == pp.NOT_SUPPORTED]
    if unsupported and not pmu.get("core_pmus"):
        where = ("this virtual machine exposes no hardware PMU (the CPU flags say hypervisor)"
                 if pmu.get("hypervisor") else "the kernel registered no CPU PMU for this processor")
        return (f"no hardware counters: {where}; perf reports <not supported> for "
                f"{', '.join(unsupported)}. IPC and LLC misses need a PMU: bare metal, or a VM with PMU "
                "passthrough (e.g. KVM `-cpu host,pmu=on`, or a cloud instance type that exposes it). "
                "Software counters are kept.")
    if unsupported:
        return (f"perf reports <not supported> for {', '.join(unsupported)} although a CPU PMU is present "
                f"({', '.join(pmu.get('core_pmus') or [])}): the generic events are not mapped on this CPU")
    missing = [e for e, s in hw.items() if s != pp.COUNTED]
    if missing:
        return f"hardware counters never ran for {', '.join(missing)} (<not counted>: the watched threads were idle or the PMU was busy)"
    return None


def short_hardware_reason(pmu: dict[str, Any], status: dict[str, str]) -> str:
    """One line for the report's probe list: software counters only, and why."""
    if not pmu.get("core_pmus"):
        where = "no hardware PMU in this VM" if pmu.get("hypervisor") else "no CPU PMU registered by the kernel"
        return f"software counters only: {where}, so no IPC or LLC misses (needs bare metal or PMU passthrough)"
    missing = [e for e in pp.HARDWARE_EVENTS if status.get(e) != pp.COUNTED]
    return f"hardware counters missing for {', '.join(missing)}"


class PerfStatProbe(Probe):
    name = "perfstat"
    description = "IPC, LLC misses and software counters of the training process and its workers (perf stat)"
    needs = ("perf (linux-perf / linux-tools)",
             "root or CAP_PERFMON, or kernel.perf_event_paranoid <= 2 for your own processes",
             "a hardware PMU for IPC and LLC misses (software counters work without one)")
    cost = ("counting only: counters saved/restored at each context switch of a watched thread, and perf "
            "reading them once per interval (~10 readings per window)")
    timeout_s = 10.0
    evidence_schema = PerfStatEvidence
    cost_cpu_s_fixed = 0.05       # measured per 10 s window, capture and parse (docs/cost.md)
    cost_cpu_s_per_process = 0.02

    def check(self, spec: WatchSpec) -> Availability:
        if perf_binary() is None:
            return Availability.no("perf not found on PATH: " + INSTALL_HINT)
        status = procfs.try_read_text(spec.root, f"proc/{spec.pid}/status")
        if status is None:
            return Availability.no(f"process {spec.pid} does not exist")
        uid_line = procfs.parse_status(status).get("Uid", "")
        target_uid = int(uid_line.split()[0]) if uid_line.split() else None
        paranoid_text = procfs.try_read_text(spec.root, "proc/sys/kernel/perf_event_paranoid")
        paranoid = int(paranoid_text.strip()) if paranoid_text and paranoid_text.strip().lstrip("-").isdigit() else None
        problem = permission_problem(os.geteuid(), _cap_bits(procfs.try_read_text("/", "proc/self/status")),
                                     paranoid, target_uid)
        return Availability.no(problem) if problem else Availability.yes()

    def adds_nothing(self, spec: WatchSpec, job: JobShape) -> str | None:
        if core_pmus(read_pmu(spec.root)["sources"]):
            return None
        return ("no hardware PMU on this host (no CPU PMU under /sys/bus/event_source/devices): perf stat "
                "would count only software events, which the process probe reads from /proc; "
                "`--probes perfstat` runs it anyway")

    def capture(self, spec: WatchSpec, rec: Recorder, deadline_monotonic: float) -> None:
        exe = perf_binary()
        if exe is None:
            raise Unavailable("perf not found on PATH: " + INSTALL_HINT)
        version = rec.run([exe, "--version"], timeout_s=5.0)
        if version.rc != 0:
            raise classify_failure(version.stdout + version.stderr, version.rc)
        window = max(deadline_monotonic - time.monotonic(), 0.3)
        interval_ms, count = interval_plan(window)
        t0 = time.time()
        pmu = read_pmu(spec.root)
        rec.note("file", "/sys/bus/event_source/devices/*/type, /proc/cpuinfo (flags)", 0, t0, time.time() - t0)
        paranoid = procfs.try_read_text(spec.root, "proc/sys/kernel/perf_event_paranoid")
        main_pid = spec.pid
        descendants = procfs.descendants_of(main_pid, spec.root)
        worker_pids = [p for p, _ in descendants]
        ppids = {str(p): pp_ for p, pp_ in descendants}
        tasks = {str(p): _tasks(spec.root, p) for p in [main_pid] + worker_pids}
        comms = {str(p): (procfs.try_read_text(spec.root, f"proc/{p}/comm") or "").strip() for p in tasks}
        sessions: dict[str, list[int]] = {"main": [main_pid]}
        if worker_pids:
            sessions["workers"] = worker_pids
        tmpdir = private_dir("trainprobe-perf-")
        procs: dict[str, tuple[subprocess.Popen, str, Any]] = {}
        argvs: dict[str, list[str]] = {}
        try:
            for name, pids in sessions.items():
                out = os.path.join(tmpdir, f"{name}.txt")
                argv = [exe, "stat", "-x", SEP, "-I", str(interval_ms), "--interval-count", str(count),
                        "--per-thread", "--no-inherit", "-e", ",".join(EVENTS),
                        "-p", ",".join(str(p) for p in pids), "-o", out]
                err = open(os.path.join(tmpdir, f"{name}.stderr"), "w+")
                procs[name] = (rec.spawn(argv, stop_signal=signal.SIGINT, stdout=subprocess.DEVNULL, stderr=err),
                               out, err)
                argvs[name] = argv
            stopped = rec.wait_window(deadline_monotonic)
            perf_cpu = sum(procfs.cpu_seconds(spec.root, p.pid) for p, _o, _e in procs.values())
            results: dict[str, dict[str, Any]] = {}
            for name, (proc, out, err) in procs.items():
                rc = rec.finish(proc, grace_s=0.1 if stopped else interval_ms / 1000.0 + 1.5)
                err.seek(0)
                err_text = err.read()
                err.close()
                out_text = ""
                if os.path.exists(out):
                    with open(out, errors="replace") as fh:
                        out_text = fh.read()
                rec.add(f"{name}.perf.txt", out_text)
                rec.add(f"{name}.stderr.txt", err_text[-20000:])
                results[name] = {"rc": rc, "rows": len(pp.parse_text(out_text, SEP).rows)}
        except BaseException:
            rec.stop_all()           # a session that did start must not outlive a failed capture
            raise
        finally:
            for _p, _o, err in procs.values():
                if not err.closed:
                    err.close()
            remove_private_dir(tmpdir)
        # Threads that started while perf listed them: the union of both listings maps every tid.
        for p in list(tasks):
            tasks[p] = sorted(set(tasks[p]) | set(_tasks(spec.root, int(p))))
        rec.add("targets.json", json.dumps({
            "main_pid": main_pid, "sessions": sessions, "tasks": tasks, "comm": comms, "ppid": ppids,
            "interval_ms": interval_ms, "interval_count": count, "events": list(EVENTS), "sep": SEP,
            "pmu": pmu, "perf_event_paranoid": paranoid.strip() if paranoid else None, "euid": os.geteuid(),
            "perf_version": version.stdout.strip(), "argv": argvs, "results": results,
        }))
        rec.capture.meta["overhead"] = {"perf_cpu_seconds": round(perf_cpu, 4),
                                        "basis": "utime+stime of the perf processes at the end of the window"}
        if any(r["rows"] for r in results.values()):
            parsed_status = pp.event_status(r for n in results
                                            for r in pp.parse_text(rec.capture.artifacts[f"{n}.perf.txt"], SEP).rows)
            if hardware_reason(pmu, parsed_status):
                rec.capture.reason = short_hardware_reason(pmu, parsed_status)
        else:
            name = "main"
            raise classify_failure(rec.capture.artifacts.get(f"{name}.stderr.txt", ""), results[name]["rc"])

    @staticmethod
    def parse(capture: Capture) -> PerfStatEvidence:
        targets = json.loads(capture.artifacts["targets.json"])
        texts = {n: capture.artifacts.get(f"{n}.perf.txt", "") for n in targets["sessions"]}
        errors = {n: capture.artifacts.get(f"{n}.stderr.txt", "") for n in targets["sessions"]}
        return summarise(texts, targets, errors)


def _tasks(root: str, pid: int) -> list[int]:
    try:
        return sorted(int(t) for t in os.listdir(procfs.path(root, f"proc/{pid}/task")) if t.isdigit())
    except OSError:
        return []



# -- pure: captured text -> evidence --------------------------------------------------------------

def summarise(texts: dict[str, str], targets: dict[str, Any], errors: dict[str, str] | None = None) -> dict[str, Any]:
    """perf stat -x texts of the sessions plus what was attached -> the perfstat evidence.

    `targets` holds main_pid, sessions {name: [pid...]}, tasks {pid: [tid...]}, comm {pid: name},
    interval_ms, pmu; the captures of tests/data/perf come with the same shape.
    """
    errors = errors or {}
    tid_pid: dict[int, int] = {}
    for pid, tids in (targets.get("tasks") or {}).items():
        for t in tids:
            tid_pid[int(t)] = int(pid)
    main_pid = int(targets["main_pid"])
    sep = targets.get("sep")
    groups: dict[str, Any] = {}
    processes: list[dict[str, Any]] = []
    threads: list[dict[str, Any]] = []
    all_rows: list[pp.Row] = []
    sessions_out: dict[str, Any] = {}
    window = None
    unparsed = 0
    for name, pids in targets["sessions"].items():
        text = texts.get(name) or ""
        parsed = pp.parse_text(text, sep) if text.strip() else pp.ParsedStat(sep=sep or SEP)
        unparsed += len(parsed.unparsed)
        rows = parsed.rows
        if parsed.interval_mode:
            rows = [r for r in rows if r.aggregation != "summary"]   # --summary repeats the totals
        seconds = pp.window_seconds(parsed, (targets.get("interval_ms") or 0) * (targets.get("interval_count") or 0) / 1000.0 or None)
        window = max(window or 0.0, seconds or 0.0) or window
        result = (targets.get("results") or {}).get(name, {})
        if not rows:
            err = classify_failure(errors.get(name, ""), result.get("rc")) if errors.get(name) else None
            sessions_out[name] = {"status": "failed", "pids": pids,
                                  "reason": str(err) if err else "perf printed no counters"}
            continue
        sessions_out[name] = {"status": "ok", "pids": pids, "intervals": len(parsed.timestamps),
                              "rows": len(rows), "started_on": parsed.started_on}
        all_rows.extend(rows)
        default_pid = pids[0] if len(pids) == 1 else None
        by_tid: dict[int | None, list[pp.Row]] = defaultdict(list)
        for r in rows:
            by_tid[r.tid].append(r)
        by_pid: dict[int | None, list[pp.Row]] = defaultdict(list)
        thread_info: list[tuple[int | None, int | None, str | None, list[pp.Row]]] = []
        for tid, trows in by_tid.items():
            pid = tid_pid.get(tid, default_pid) if tid is not None else default_pid
            by_pid[pid].extend(trows)
            thread_info.append((pid, tid, trows[0].comm, trows))
        g = pp.derive(pp.counters_of(rows), seconds)
        g.update({"pids": pids, "processes": len([p for p in by_pid if p is not None]) or len(pids),
                  "threads_counted": len(by_tid), "seconds": _r(seconds),
                  "series": pp.interval_series(rows)})
        groups[name] = g
        for pid, prows in sorted(by_pid.items(), key=lambda kv: (kv[0] is None, kv[0] or 0)):
            d = pp.derive(pp.counters_of(prows), seconds)
            comm = (targets.get("comm") or {}).get(str(pid))
            d.update({"pid": pid, "group": name, "ppid": (targets.get("ppid") or {}).get(str(pid)),
                      "role": _role(pid, main_pid, comm, (targets.get("ppid") or {}).get(str(pid))),
                      "comm": comm, "threads_counted": len({r.tid for r in prows})})
            processes.append(d)
        for pid, tid, comm, trows in thread_info:
            d = pp.derive(pp.counters_of(trows), seconds)
            d.update({"pid": pid, "tid": tid, "comm": comm, "group": name})
            threads.append(d)
    threads.sort(key=lambda t: -(t.get("task_clock_s") or 0.0))
    status = pp.event_status(all_rows)
    pmu = targets.get("pmu") or {}
    reason = hardware_reason(pmu, status) if all_rows else None
    training = next((t for t in threads if t["tid"] == main_pid), None)
    if training is None:
        training = next((t for t in threads if t["group"] == "main"), None)
    return {
        "perf_version": targets.get("perf_version"),
        "interval_s": (targets.get("interval_ms") or 0) / 1000.0 or None,
        "window_s": _r(window),
        "events": {e: status.get(e, "not requested") for e in targets.get("events", EVENTS)},
        "hardware": {"available": reason is None and bool(all_rows), "reason": reason,
                     "core_pmus": pmu.get("core_pmus"), "hypervisor": pmu.get("hypervisor")},
        "user_only": any("u" in r.modifiers and "k" not in r.modifiers for r in all_rows),
        "sessions": sessions_out,
        "groups": groups,
        "training_thread": training,
        "processes": processes,
        "threads": threads,
        "unparsed_lines": unparsed,
    }


def _role(pid: int | None, main_pid: int, comm: str | None, ppid: int | None) -> str:
    """main, dataloader_worker (recent torch names its worker processes pt_data_worker) or child
    (a rank under a launcher, a compiler subprocess, a worker of an older torch). The process and
    py-spy evidence settle roles; this is a label."""
    if pid == main_pid:
        return "main"
    if (comm or "").startswith("pt_data_worker"):
        return "dataloader_worker"
    return "child"


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 4)
