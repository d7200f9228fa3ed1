"""What preflight reads, in which tier, under which timeout; and one run from reads to records."""
from __future__ import annotations

import json
import time
from typing import Any

from trainprobe.agent.preflight import Record
from trainprobe.agent.preflight.engine import RAW_SCHEMA, CheckSpec, Context, Reads, ReadSpec, all_checks, collect, evaluate
from trainprobe.agent.preflight.profile import matches
from trainprobe.probes import gpubench, gpuhealth, hostinfo
from trainprobe.probes.errors import BadInput


def _t(key: str):
    return lambda ctx, prior: float(ctx.profile["timeouts"][key])


def _active_timeout(ctx: Context, prior: dict[str, Any]) -> float:
    t = ctx.profile["timeouts"]
    nvml = (prior.get("nvml") or {}).get("data") or {}
    n = len(ctx.gpus) if ctx.gpus is not None else int(nvml.get("count") or 1)
    return float(t["active_s"]) + float(t["active_per_gpu_s"]) * max(1, n)


# A captured tree (--root / TRAINPROBE_ROOT) holds files, not a driver: NVML and torch would read
# this machine's devices instead, so under a tree the device reads say so and read nothing.
TREE_NO_DEVICES = "no NVIDIA driver in a captured tree (NVML and CUDA read only the live host)"


def _nvml(ctx: Context, prior: dict[str, Any]) -> dict[str, Any]:
    if ctx.root != "/":
        return {"schema": gpuhealth.SCHEMA, "error": TREE_NO_DEVICES, "count": None, "gpus": [], "timing": {}}
    return gpuhealth.read_gpus(ctx.gpus, float(ctx.profile["timeouts"]["nvml_call_s"]))


def _gpubench(ctx: Context, prior: dict[str, Any]) -> dict[str, Any]:
    if ctx.root != "/":
        return {"schema": gpubench.SCHEMA, "error": TREE_NO_DEVICES, "devices": []}
    a = ctx.profile["active"]
    ctx.progress("running the active GPU tier (matmul check, GEMM rate, pinned copies on each GPU)")
    # The child kills itself a little before the runner would abandon it, so its own message wins.
    return gpubench.run_child(ctx.gpus, _active_timeout(ctx, prior) - 2.0, gemm_n=int(a["gemm_n"]),
                              gemm_seconds=float(a["gemm_seconds"]), copy_mib=int(a["copy_mib"]),
                              copy_reps=int(a["copy_reps"]))


READS: dict[str, ReadSpec] = {s.name: s for s in (
    ReadSpec("cpus", "host", lambda c, p: hostinfo.read_cpus(c.root, c.job_cpus), _t("host_read_s"),
             what="/sys/devices/system/cpu/{online,present}"),
    ReadSpec("governors", "host", lambda c, p: hostinfo.read_governors(c.root), _t("host_read_s"),
             what="/sys/devices/system/cpu/cpu*/cpufreq/scaling_governor"),
    ReadSpec("meminfo", "host", lambda c, p: hostinfo.read_meminfo(c.root), _t("host_read_s"),
             what="/proc/meminfo"),
    ReadSpec("numa", "host", lambda c, p: hostinfo.read_numa(c.root), _t("host_read_s"),
             what="/sys/devices/system/node"),
    ReadSpec("shm", "host", lambda c, p: hostinfo.read_shm(c.root), _t("host_read_s"),
             what="/dev/shm"),
    ReadSpec("limits", "host", lambda c, p: hostinfo.read_limits(c.root), _t("host_read_s"),
             what="/proc/self/limits"),
    ReadSpec("vm", "host", lambda c, p: hostinfo.read_vm_settings(c.root), _t("host_read_s"),
             what="/sys/kernel/mm/transparent_hugepage, /proc/sys/kernel/numa_balancing"),
    ReadSpec("disk", "host", lambda c, p: hostinfo.read_disk(c.disk_paths, c.root), _t("host_read_s"),
             on_timeout="critical", what="statvfs of the disk paths"),
    ReadSpec("kernel_log", "host", lambda c, p: hostinfo.read_kernel_log(c.root), _t("host_read_s"),
             what="/dev/kmsg"),
    ReadSpec("prereqs", "host", lambda c, p: hostinfo.read_probe_prerequisites(c.root),
             _t("host_read_s"), what="trainprobe's probe prerequisites"),
    ReadSpec("pci", "gpu", lambda c, p: hostinfo.read_pci_gpus(c.root), _t("host_read_s"),
             what="/sys/bus/pci/devices"),
    ReadSpec("nvml", "gpu", _nvml, _t("gpu_read_s"), on_timeout="critical", what="NVML"),
    ReadSpec("gpubench", "active", _gpubench, _active_timeout, on_timeout="critical",
             what="the active GPU tier (torch)"),
)}


def select_checks(profile: dict[str, Any], tiers: tuple[str, ...], skip: list[str]) -> list[CheckSpec]:
    disabled = list(profile["checks"]["disable"]) + list(skip)
    no_gpu = int(profile["gpu"]["count"]) == 0
    out = []
    for spec in all_checks():
        if spec.tier not in tiers or matches(spec.id, disabled):
            continue
        if no_gpu and spec.tier in ("gpu", "active"):
            continue
        out.append(spec)
    return out


def load_replay(path: str) -> dict[str, Any]:
    try:
        with open(path) as fh:
            raw = json.load(fh)
    except OSError as exc:
        raise BadInput(f"cannot read replay file {path}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise BadInput(f"{path}: not a JSON file: {exc}") from None
    if not isinstance(raw, dict) or raw.get("schema") != RAW_SCHEMA:
        raise BadInput(f"{path}: not a preflight raw file (schema {RAW_SCHEMA}); save one with --save-raw")
    return raw


def run(ctx: Context, tiers: tuple[str, ...], skip: list[str] | None = None, deadline_s: float = 45.0,
        replay: dict[str, Any] | None = None) -> tuple[dict[str, Any], list[Record], list[Any]]:
    """Read (or replay), then judge. Returns (raw reads, records, threads abandoned still running)."""
    t0 = time.time()
    deadline = time.monotonic() + deadline_s
    checks = select_checks(ctx.profile, tiers, skip or [])
    needed = {r for c in checks for r in c.reads}
    abandoned: list[Any] = []
    if replay is not None:
        records = {k: v for k, v in replay.get("reads", {}).items() if k in needed}
        host = replay.get("host", {})
    else:
        host = hostinfo.host_identity(ctx.root)
        first = [READS[n] for n in READS if n in needed and READS[n].tier in ("host", "gpu")]
        records, abandoned = collect(first, ctx, deadline)
        later = [READS[n] for n in READS if n in needed and READS[n].tier == "active"]
        if later:
            more, ab2 = collect(later, ctx, deadline, prior=records)
            records.update(more)
            abandoned += ab2
    raw = {"schema": RAW_SCHEMA, "created_unix": round(t0, 3), "host": host,
           "context": {"root": ctx.root, "disk_paths": ctx.disk_paths, "gpus": ctx.gpus, "tiers": list(tiers)},
           "reads": records}
    if replay is not None:
        raw["replayed_from_created_unix"] = replay.get("created_unix")
    recs = evaluate(checks, Reads(records), ctx.profile, READS)
    return raw, recs, abandoned
