"""The tier runner: do the reads (each bounded by its own timeout), then judge them with the checks.

A read touches the host (one read of a preflight probe) and returns what it recorded; it runs in
its own daemon thread and is abandoned, not waited for, when it overruns its timeout, so a hung driver
call or a hung filesystem cannot hang preflight. A check is a pure function of the reads and the
profile, registered with @check; the engine, not the check, turns a missing or timed-out read into
the check's status and says which read it was.
"""
from __future__ import annotations

import importlib
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from trainprobe.agent.preflight import Record, Result
from trainprobe.agent.preflight.profile import matches
from trainprobe.probes.errors import ProbeError

RAW_SCHEMA = "trainprobe.preflight.raw/1"
CHECK_MODULES = (
    "trainprobe.agent.preflight.host_checks",
    "trainprobe.agent.preflight.prereq_checks",
    "trainprobe.agent.preflight.gpu_checks",
    "trainprobe.agent.preflight.active_checks",
)
TIERS = ("host", "gpu", "active")
CATEGORY_TIER = {"host": "host", "trainprobe": "host", "gpu": "gpu", "active": "active"}


@dataclass
class Context:
    """What the reads need to know: where the host is and what the job will use."""

    profile: dict[str, Any]
    root: str = "/"
    disk_paths: list[str] = field(default_factory=list)
    job_cpus: list[int] | None = None
    gpus: list[int] | None = None       # NVML indices to read; None: all
    progress: Callable[[str], None] = lambda msg: None


@dataclass(frozen=True)
class ReadSpec:
    name: str
    tier: str
    fn: Callable[[Context, dict[str, Any]], Any]          # (context, reads so far) -> what it read
    timeout_s: Callable[[Context, dict[str, Any]], float]
    on_timeout: str = "unknown"    # status of the checks that needed it, when it hangs
    what: str = ""                 # for messages: what it reads


@dataclass(frozen=True)
class CheckSpec:
    id: str
    category: str
    reads: tuple[str, ...]
    fn: Callable[["Reads", dict[str, Any]], "Result | list[Result]"]

    @property
    def tier(self) -> str:
        return CATEGORY_TIER[self.category]


CHECKS: list[CheckSpec] = []


def check(check_id: str, category: str, reads: tuple[str, ...]):
    """Register a check: a pure function (reads, profile) -> Result or [Result]."""
    def deco(fn):
        CHECKS.append(CheckSpec(check_id, category, reads, fn))
        return fn
    return deco


def all_checks() -> list[CheckSpec]:
    for mod in CHECK_MODULES:
        importlib.import_module(mod)
    return list(CHECKS)


class MissingRead(Exception):
    def __init__(self, name: str, rec: dict[str, Any] | None):
        self.name, self.rec = name, rec
        super().__init__(name)


class Reads:
    """The raw reads of one run (live or replayed), as checks see them."""

    def __init__(self, records: dict[str, dict[str, Any]]):
        self.records = records

    def get(self, name: str) -> dict[str, Any] | None:
        return self.records.get(name)

    def data(self, name: str) -> Any:
        rec = self.records.get(name)
        if rec is None or rec.get("error") is not None:
            raise MissingRead(name, rec)
        return rec.get("data")

    def error(self, name: str) -> str | None:
        rec = self.records.get(name)
        if rec is None:
            return "not read"
        err = rec.get("error")
        return err["message"] if err else None

    def seconds(self, names: tuple[str, ...]) -> float:
        return sum(float((self.records.get(n) or {}).get("seconds") or 0.0) for n in names)


# -- reading ---------------------------------------------------------------------------------------

class _Job:
    def __init__(self, spec: ReadSpec, ctx: Context, prior: dict[str, Any], timeout_s: float):
        self.spec, self.timeout_s = spec, timeout_s
        self.box: dict[str, Any] = {}
        self.started = time.monotonic()
        self.thread = threading.Thread(target=self._run, args=(ctx, prior), daemon=True,
                                       name=f"preflight-read-{spec.name}")

    def _run(self, ctx: Context, prior: dict[str, Any]) -> None:
        t0 = time.monotonic()
        try:
            self.box["data"] = self.spec.fn(ctx, prior)
        except ProbeError as exc:
            self.box["error"] = {"kind": exc.kind, "message": str(exc)}
        except Exception as exc:  # noqa: BLE001 - one broken read never sinks the report
            self.box["error"] = {"kind": "error", "message": f"{type(exc).__name__}: {exc}"}
        self.box["seconds"] = time.monotonic() - t0


def collect(specs: list[ReadSpec], ctx: Context, deadline: float, prior: dict[str, Any] | None = None
            ) -> tuple[dict[str, dict[str, Any]], list[threading.Thread]]:
    """Run the reads concurrently, each under its own timeout and the overall deadline.

    Returns the read records and the threads that were abandoned still running."""
    prior = dict(prior or {})
    jobs = []
    for spec in specs:
        t = max(0.05, min(spec.timeout_s(ctx, prior), deadline - time.monotonic()))
        jobs.append(_Job(spec, ctx, prior, t))
    for j in jobs:
        j.thread.start()
    out: dict[str, dict[str, Any]] = {}
    abandoned: list[threading.Thread] = []
    for j in jobs:
        j.thread.join(max(0.0, j.started + j.timeout_s - time.monotonic()))
        if j.thread.is_alive():
            abandoned.append(j.thread)
            out[j.spec.name] = {
                "data": None, "timed_out": True, "seconds": round(time.monotonic() - j.started, 6),
                "timeout_s": round(j.timeout_s, 3),
                "error": {"kind": "timed_out",
                          "message": f"{j.spec.what or j.spec.name} did not answer within {j.timeout_s:g} s"}}
            continue
        err = j.box.get("error")
        # A read that bounded itself (a killed child, a skipped NVML call) timed out just the same.
        out[j.spec.name] = {"data": j.box.get("data"), "error": err,
                            "timed_out": bool(err and err["kind"] == "timed_out"),
                            "seconds": round(j.box.get("seconds", 0.0), 6), "timeout_s": round(j.timeout_s, 3)}
    return out, abandoned


# -- judging ---------------------------------------------------------------------------------------

def _missing_result(spec: CheckSpec, miss: MissingRead, read_specs: dict[str, ReadSpec]) -> tuple[Result, bool]:
    rec = miss.rec
    rs = read_specs.get(miss.name)
    what = (rs.what if rs else "") or miss.name
    if rec is None:
        return Result("unknown", "not read", "-", f"{what} was not read in this run (not in the replay file?)",
                      remediation="run preflight live, or save a replay with every tier (--save-raw)"), False
    err = rec["error"]
    if rec.get("timed_out"):
        status = rs.on_timeout if rs else "unknown"
        return Result(status, f"timed out after {rec.get('timeout_s')} s", "an answer",
                      f"{err['message']}: check {spec.id} could not run",
                      remediation="a hung driver call or filesystem: look at dmesg; the job would hang there too"
                      if status == "critical" else "retry; raise [timeouts] in the profile if this host is slow",
                      source=what), True
    return Result("unknown", f"unreadable ({err['kind']})", "-", f"{what}: {err['message']}",
                  remediation="run as root" if err["kind"] == "permission_denied" else None, source=what), False


def evaluate(checks: list[CheckSpec], reads: Reads, profile: dict[str, Any],
             read_specs: dict[str, ReadSpec]) -> list[Record]:
    records: list[Record] = []
    informational = profile.get("checks", {}).get("informational", [])
    for spec in checks:
        t0 = time.monotonic()
        timed_out = False
        try:
            for name in spec.reads:  # a read that hung fails its checks, whether they read it or not
                rec = reads.get(name)
                if rec is not None and rec.get("timed_out"):
                    raise MissingRead(name, rec)
            res = spec.fn(reads, profile)
            results = res if isinstance(res, list) else [res]
        except MissingRead as miss:
            r, timed_out = _missing_result(spec, miss, read_specs)
            results = [r]
        except Exception as exc:  # noqa: BLE001 - a broken check is reported, the rest go on
            results = [Result("unknown", "check failed", "-", f"internal error in {spec.id}: "
                              f"{type(exc).__name__}: {exc}", remediation="report this as a trainprobe bug")]
        eval_s = time.monotonic() - t0
        base_s = reads.seconds(spec.reads)
        for r in results:
            dur = r.duration_s if r.duration_s is not None else base_s + eval_s
            records.append(Record(spec.id, spec.category, r, dur, timed_out,
                                  informational=matches(spec.id, informational)))
    return records
