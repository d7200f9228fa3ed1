"""Can trainprobe's own probes run on this node? Each check says what is missing and how to enable it.

These are informational in the default profile ([checks] informational): they are shown with their
status but do not make a node unfit for a job.
"""
from __future__ import annotations

from typing import Any

from trainprobe.agent.preflight import Result
from trainprobe.agent.preflight.engine import Reads, check
from trainprobe.probes.parsers.hostfacts import CAP_PERFMON, CAP_SYS_ADMIN, CAP_SYS_PTRACE, has_cap

# Core PMUs by the name the kernel registers them under (x86 "cpu"/"cpu_core"/"cpu_atom", Arm, RISC-V;
# IBM POWER registers its core PMU as "cpu" too). "power" is x86 RAPL (energy counters), not a core PMU.
_HW_PMU_PREFIXES = ("cpu", "armv8", "armv9", "arm_cortex", "arm_neoverse", "riscv")


def _root(d: dict[str, Any]) -> bool:
    return d.get("euid") == 0


@check("trainprobe.attach", "trainprobe", ("prereqs",))
def attach(r: Reads, p: dict[str, Any]) -> Result:
    d = r.data("prereqs")
    scope = d.get("ptrace_scope")
    expected = "root, CAP_SYS_PTRACE, or kernel.yama.ptrace_scope 0"
    src = "/proc/sys/kernel/yama/ptrace_scope"
    if _root(d):
        return Result("ok", "root", expected, "py-spy and /proc can attach to any process", source="euid")
    if has_cap(d.get("cap_eff"), CAP_SYS_PTRACE):
        return Result("ok", "CAP_SYS_PTRACE", expected, "may attach to any process", source="/proc/self/status CapEff")
    if scope is None or scope == "0":
        return Result("ok", f"ptrace_scope {scope or 'absent (no Yama)'}", expected,
                      "may attach to the user's own processes", source=src)
    return Result("warn", f"not root, ptrace_scope {scope}", expected,
                  "py-spy cannot attach to a job it did not start",
                  remediation="run trainprobe as root, or sysctl -w kernel.yama.ptrace_scope=0", source=src)


@check("trainprobe.perf_event_paranoid", "trainprobe", ("prereqs",))
def perf_paranoid(r: Reads, p: dict[str, Any]) -> Result:
    d = r.data("prereqs")
    val = d.get("perf_event_paranoid")
    expected = "<= 1, or root / CAP_PERFMON"
    src = "/proc/sys/kernel/perf_event_paranoid"
    if val is None:
        return Result("warn", "absent", expected, "the kernel has no perf events", source=src,
                      remediation="a kernel built with CONFIG_PERF_EVENTS")
    if _root(d) or has_cap(d.get("cap_eff"), CAP_PERFMON) or has_cap(d.get("cap_eff"), CAP_SYS_ADMIN):
        return Result("ok", f"{val} (privileged)", expected, "perf counters are open to this user", source=src)
    if int(val) <= 1:
        return Result("ok", val, expected, "perf counters are open to unprivileged users", source=src)
    return Result("warn", val, expected,
                  "unprivileged perf is restricted: " + ("user-space counts only" if int(val) == 2 else "disabled"),
                  remediation="run as root, or sysctl -w kernel.perf_event_paranoid=1", source=src)


@check("trainprobe.hw_counters", "trainprobe", ("prereqs",))
def hw_counters(r: Reads, p: dict[str, Any]) -> Result:
    pmus = r.data("prereqs").get("pmus") or []
    hw = [x for x in pmus if x.startswith(_HW_PMU_PREFIXES)]
    src = "/sys/bus/event_source/devices"
    if hw:
        return Result("ok", ", ".join(hw), "a hardware PMU", "IPC and cache-miss counters are available", source=src)
    return Result("warn", ", ".join(pmus) or "none", "a hardware PMU",
                  "no hardware PMU is exposed (a virtual machine without a vPMU?): IPC and LLC-miss counts "
                  "are unavailable; software events still count",
                  remediation="expose the PMU to the guest (KVM/libvirt: <pmu state='on'/>, -cpu host) or use a "
                              "bare-metal instance", source=src)


@check("trainprobe.tracefs", "trainprobe", ("prereqs",))
def tracefs(r: Reads, p: dict[str, Any]) -> Result:
    t = r.data("prereqs").get("tracefs") or {}
    dirs = {k: v for k, v in t.items() if k.startswith("/") and isinstance(v, dict)}
    usable = [k for k, v in dirs.items() if v.get("events") and v.get("readable")]
    if usable:
        return Result("ok", f"mounted at {usable[0]}", "mounted and readable", "tracepoints are reachable",
                      source=usable[0])
    if t.get("mounts") or any(v.get("events") for v in dirs.values()):
        where = (t.get("mounts") or [k for k, v in dirs.items() if v.get("events")])[0]
        return Result("warn", f"mounted at {where}, not readable", "mounted and readable",
                      "tracefs is mounted but this user cannot read it: only root can attach tracepoint probes",
                      remediation="run trainprobe as root", source=where)
    return Result("warn", "not mounted", "mounted and readable",
                  "tracefs is not mounted: tracepoint probes cannot attach",
                  remediation="mount -t tracefs nodev /sys/kernel/tracing", source="/sys/kernel/tracing")


@check("trainprobe.btf", "trainprobe", ("prereqs",))
def btf(r: Reads, p: dict[str, Any]) -> Result:
    if r.data("prereqs").get("btf"):
        return Result("ok", "present", "present", "CO-RE eBPF tools (libbpf-tools) can run",
                      source="/sys/kernel/btf/vmlinux")
    return Result("warn", "absent", "present", "no kernel BTF: CO-RE eBPF tools cannot load",
                  remediation="a kernel built with CONFIG_DEBUG_INFO_BTF=y (most distribution kernels since 5.x)",
                  source="/sys/kernel/btf/vmlinux")


@check("trainprobe.kprobes", "trainprobe", ("prereqs",))
def kprobes(r: Reads, p: dict[str, Any]) -> Result:
    pmus = r.data("prereqs").get("pmus") or []
    if "kprobe" in pmus:
        return Result("ok", "available", "available", "kprobe-based tools can attach",
                      source="/sys/bus/event_source/devices/kprobe")
    return Result("warn", "absent", "available",
                  "the kernel has no kprobes: kprobe-based bcc tools (offcputime, cpudist) cannot attach; "
                  "tracepoint-based ones still work",
                  remediation="a kernel built with CONFIG_KPROBES=y", source="/sys/bus/event_source/devices")


@check("trainprobe.bcc", "trainprobe", ("prereqs",))
def bcc(r: Reads, p: dict[str, Any]) -> Result:
    paths = r.data("prereqs").get("bcc") or []
    if paths:
        return Result("ok", paths[0].rsplit("/", 1)[0], "installed", "bcc's Python module is installed",
                      source=paths[0])
    return Result("warn", "not found", "installed", "bcc is not installed: the eBPF probes cannot run",
                  remediation="apt-get install python3-bpfcc (Debian/Ubuntu) or dnf install python3-bcc (RHEL)",
                  source="/usr/lib/python3/dist-packages/bcc")


@check("trainprobe.kernel_headers", "trainprobe", ("prereqs",))
def kernel_headers(r: Reads, p: dict[str, Any]) -> Result:
    d = r.data("prereqs")
    rel = d.get("kernel_release")
    h = d.get("headers") or {}
    expected = f"headers for {rel}"
    src = h.get("path") or f"/lib/modules/{rel}/build"
    fix = "apt-get install linux-headers-$(uname -r) (RHEL: dnf install kernel-devel-$(uname -r))"
    if not h.get("exists"):
        return Result("warn", "missing", expected, "bcc compiles its programs against kernel headers; none are "
                      "installed for the running kernel", remediation=fix, source=src)
    hrel = h.get("release")
    if hrel and rel and hrel != rel:
        return Result("warn", f"headers for {hrel}", expected,
                      f"the headers at {src} are for {hrel}, not the running {rel}: tracepoint programs may "
                      "load, programs that read kernel structures may read them wrong",
                      remediation=fix, source=src, details=h)
    return Result("ok", f"headers for {hrel or rel}", expected, "bcc can compile its programs", source=src,
                  details=h)


@check("trainprobe.py_spy", "trainprobe", ("prereqs",))
def py_spy(r: Reads, p: dict[str, Any]) -> Result:
    path = r.data("prereqs").get("py_spy")
    if path:
        return Result("ok", path, "installed", "py-spy can sample Python stacks", source=path)
    return Result("warn", "not found", "installed", "py-spy is not on PATH: trainprobe diagnose cannot read "
                  "Python stacks", remediation="pip install py-spy", source="PATH")
