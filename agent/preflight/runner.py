"""What preflight reads, in which tier, under which timeout; and one run from reads to records.

Every read is a read of a probe in the registry (probes/host.py, probes/gpuhealth.py,
probes/gpubench.py). Each runs in its own thread under its own timeout (engine.collect) and records
into a capture of its own; the runner merges what answered into one Capture per probe, and the
checks see what that probe's parser makes of it. A bundle saved with `--save` holds those captures,
so a replay goes through the same parser and the same checks as the live run.
"""
from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from trainprobe.agent.preflight import Record
from trainprobe.agent.preflight.engine import RAW_SCHEMA, CheckSpec, Context, Reads, ReadSpec, all_checks, collect, evaluate
from trainprobe.agent.preflight.profile import matches
from trainprobe.probes.base import Capture, ReadingProbe, WatchSpec, merge_read, read_outcome, run_read
from trainprobe.probes.errors import BadInput
from trainprobe.probes.parsers import safejson
from trainprobe.probes.host import host_identity
from trainprobe.probes.registry import probe_classes


def _t(key: str):
    return lambda ctx, prior: float(ctx.profile["timeouts"][key])


def _active_timeout(ctx: Context, prior: dict[str, Any]) -> float:
    t = ctx.profile["timeouts"]
    nvml = (prior.get("nvml") or {}).get("data") or {}
    n = len(ctx.gpus) if ctx.gpus is not None else int(nvml.get("count") or 1)
    return float(t["active_s"]) + float(t["active_per_gpu_s"]) * max(1, n)


PROBES: dict[str, ReadingProbe] = {cls.name: cls() for cls in probe_classes("preflight")}
PROBE_OF_READ: dict[str, ReadingProbe] = {r: p for p in PROBES.values() for r in p.reads}

# read -> (tier, its timeout, the status of the checks that needed it when it hangs)
POLICY: dict[str, tuple[str, Any, str]] = {
    "cpus": ("host", _t("host_read_s"), "unknown"),
    "governors": ("host", _t("host_read_s"), "unknown"),
    "meminfo": ("host", _t("host_read_s"), "unknown"),
    "numa": ("host", _t("host_read_s"), "unknown"),
    "shm": ("host", _t("host_read_s"), "unknown"),
    "limits": ("host", _t("host_read_s"), "unknown"),
    "vm": ("host", _t("host_read_s"), "unknown"),
    "disk": ("host", _t("host_read_s"), "critical"),
    "kernel_log": ("host", _t("host_read_s"), "unknown"),
    "prereqs": ("host", _t("host_read_s"), "unknown"),
    "pci": ("gpu", _t("host_read_s"), "unknown"),
    "nvml": ("gpu", _t("gpu_read_s"), "critical"),
    "gpubench": ("active", _active_timeout, "critical"),
}


def watch_spec(ctx: Context, prior: dict[str, Any]) -> WatchSpec:
    """What a preflight probe's read is told: the root, the job's CPUs, GPUs and disks, the profile's settings."""
    t = ctx.profile["timeouts"]
    return WatchSpec(pid=os.getpid(), window_s=0.0, root=ctx.root, options={
        "job_cpus": ctx.job_cpus, "disk_paths": list(ctx.disk_paths), "gpus": ctx.gpus,
        "nvml_call_s": float(t["nvml_call_s"]), "active": dict(ctx.profile["active"]),
        # The child kills itself a little before the runner would abandon it, so its own message wins.
        "active_timeout_s": _active_timeout(ctx, prior) - 2.0})


def _probe_read(name: str):
    probe = PROBE_OF_READ[name]

    def fn(ctx: Context, prior: dict[str, Any]) -> Capture:
        if name == "gpubench":
            ctx.progress("running the active GPU tier (matmul check, GEMM rate, pinned copies on each GPU)")
        return run_read(probe, name, watch_spec(ctx, prior), threading.Event())
    return fn


READS: dict[str, ReadSpec] = {
    name: ReadSpec(name, tier, _probe_read(name), timeout, on_timeout, PROBE_OF_READ[name].reads[name])
    for name, (tier, timeout, on_timeout) in POLICY.items()}


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


@dataclass
class PreflightRun:
    """One run: the reads as checks see them (raw), the records, the captures behind the reads,
    and the read threads abandoned still running."""

    raw: dict[str, Any]
    records: list[Record]
    captures: list[Capture] = field(default_factory=list)
    abandoned: list[Any] = field(default_factory=list)


# -- from reads to captures, and back ---------------------------------------------------------------

def _merge(captures: dict[str, Capture], records: dict[str, dict[str, Any]], started: float) -> None:
    """Add each read of `records` (collect's output: a read's data is its own capture) to its probe's."""
    for name, rec in records.items():
        probe = PROBE_OF_READ[name]
        cap = captures.setdefault(probe.name, Capture(probe.name, started_unix=started))
        if isinstance(rec.get("data"), Capture):
            merge_read(cap, rec["data"], timeout_s=rec.get("timeout_s"))
        else:       # abandoned on its timeout, or broken: its record says why
            read_outcome(cap, name, error=rec.get("error"), timed_out=bool(rec.get("timed_out")),
                         seconds=rec.get("seconds", 0.0), timeout_s=rec.get("timeout_s"))


def parse_reads(captures: list[Capture]) -> dict[str, dict[str, Any]]:
    """The read records of preflight captures, through each probe's own parser."""
    out: dict[str, dict[str, Any]] = {}
    for cap in captures:
        probe = PROBES.get(cap.probe)
        if probe is not None:
            out.update(probe.parse(cap))
    return out


def _unavailable(specs: list[ReadSpec], ctx: Context) -> tuple[list[ReadSpec], dict[str, dict[str, Any]]]:
    """Ask each probe whether it can run here; the reads of one that cannot say why, unread."""
    spec = watch_spec(ctx, {})
    checked = {name: probe.check(spec) for name, probe in PROBES.items()}
    ok, skipped = [], {}
    for s in specs:
        av = checked[PROBE_OF_READ[s.name].name]
        if av.ok:
            ok.append(s)
        else:
            skipped[s.name] = {"data": None, "timed_out": False, "seconds": 0.0, "timeout_s": None,
                               "error": {"kind": "unavailable", "message": av.reason}}
    return ok, skipped


def _read_live(ctx: Context, needed: set[str], deadline: float) -> tuple[dict[str, Capture], list[Any]]:
    t0 = time.time()
    captures: dict[str, Capture] = {}
    abandoned: list[Any] = []
    prior: dict[str, Any] = {}
    for tiers in (("host", "gpu"), ("active",)):
        specs, skipped = _unavailable([READS[n] for n in READS if n in needed and READS[n].tier in tiers], ctx)
        if not specs and not skipped:
            continue
        got, ab = collect(specs, ctx, deadline, prior=prior)
        _merge(captures, {**got, **skipped}, t0)
        abandoned += ab
        prior = parse_reads(list(captures.values()))
    return captures, abandoned


def run(ctx: Context, tiers: tuple[str, ...], skip: list[str] | None = None, deadline_s: float = 45.0,
        replay: dict[str, Any] | None = None) -> PreflightRun:
    """Read (or replay), then judge."""
    t0 = time.time()
    checks = select_checks(ctx.profile, tiers, skip or [])
    needed = {r for c in checks for r in c.reads}
    captures: list[Capture] = []
    abandoned: list[Any] = []
    if replay is not None:
        records = {k: v for k, v in replay.get("reads", {}).items() if k in needed}
        host = replay.get("host", {})
    else:
        host = host_identity(ctx.root)
        by_probe, abandoned = _read_live(ctx, needed, time.monotonic() + deadline_s)
        captures = list(by_probe.values())
        records = parse_reads(captures)
    raw = {"schema": RAW_SCHEMA, "created_unix": round(t0, 3), "host": host,
           "context": {"root": ctx.root, "disk_paths": ctx.disk_paths, "gpus": ctx.gpus, "tiers": list(tiers)},
           "reads": records}
    if replay is not None:
        raw["replayed_from_created_unix"] = replay.get("created_unix")
    recs = evaluate(checks, Reads(records), ctx.profile, READS)
    return PreflightRun(raw, recs, captures, abandoned)


# -- saved runs: bundles and raw files ---------------------------------------------------------------

def bundle_context(raw: dict[str, Any]) -> dict[str, Any]:
    """What a preflight bundle's index holds besides its captures: the host and the run's context."""
    return {"command": "preflight", "created_unix": raw["created_unix"], "host": raw["host"], **raw["context"]}


def raw_from_bundle(path: str) -> dict[str, Any]:
    """A preflight bundle -> the reads as checks see them, through the probes' parsers."""
    from trainprobe.agent import bundle
    from trainprobe.probes.errors import ProbeError

    try:
        b = bundle.load(path)
    except bundle.BundleError as exc:
        raise BadInput(str(exc)) from None
    if b.context.get("command") != "preflight":
        raise BadInput(f"{path}: not a preflight bundle (a diagnosis? read it with `trainprobe report {path}`)")
    try:
        reads = parse_reads(b.captures)
    except ProbeError as exc:
        raise BadInput(f"{path}: {exc}") from None
    ctx = b.context
    return {"schema": RAW_SCHEMA, "created_unix": ctx.get("created_unix"), "host": ctx.get("host") or {},
            "context": {k: ctx.get(k) for k in ("root", "disk_paths", "gpus", "tiers")}, "reads": reads}


def load_replay(path: str) -> dict[str, Any]:
    """What --replay judges: a bundle (--save) or a raw file (--save-raw)."""
    from trainprobe.agent import bundle

    if bundle.is_bundle(path):
        return raw_from_bundle(path)
    from trainprobe.agent.inputs import open_input     # a regular file only, never a blocking open
    try:
        with open_input(path) as fh:
            raw = safejson.loads(fh.read(safejson.MAX_BYTES + 1), path)
    except OSError as exc:
        raise BadInput(f"cannot read replay file {path}: {exc.strerror}") from None
    except ValueError as exc:          # not JSON, or over safejson's caps: one line naming the path
        raise BadInput(f"not a JSON file: {exc}") from None
    if not isinstance(raw, dict) or raw.get("schema") != RAW_SCHEMA:
        raise BadInput(f"{path}: not a preflight raw file (schema {RAW_SCHEMA}) or bundle; save one with --save")
    return raw
