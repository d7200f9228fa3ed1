"""What every probe is: metadata, an availability check, a capture step and a pure parser.

A probe's `capture` touches the host and records raw text with its provenance into a Capture;
its `parse` is a pure function of that Capture. The same parser therefore reads a live host and a
replayed bundle. Probes never import `agent` or `reports`.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Dict, Optional, TypedDict

from trainprobe.probes.parsers import redact
from trainprobe.probes.errors import ProbeError, TimedOut, parser, translate_oserror

STATUSES = ("ok", "skipped", "failed", "timeout")


@dataclass(frozen=True)
class Availability:
    ok: bool
    reason: str | None = None

    @classmethod
    def yes(cls) -> "Availability":
        return cls(True, None)

    @classmethod
    def no(cls, reason: str) -> "Availability":
        return cls(False, reason)


@dataclass
class WatchSpec:
    """What the session asks every probe to watch, and for how long."""

    pid: int
    window_s: float
    rate_hz: int = 25
    child_pids: tuple[int, ...] = ()
    native: bool = False
    root: str = "/"
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class JobShape:
    """What the planner knows of the job before the window: its size and the CPUs it may use."""

    pid: int
    processes: tuple[int, ...] = ()        # the target and its descendants (DataLoader workers, ranks)
    children: dict[int, int] = field(default_factory=dict)   # descendant pid -> parent pid
    threads: int = 1                       # threads of the target process
    # threads of the target that used a CPU lately or over their life (None: not read); at most one
    # means no other thread can hold the GIL for long, and the GIL sampler is not planned
    busy_threads: int | None = None
    ranks: tuple[int, ...] = ()            # children that are ranks of a launcher (LOCAL_RANK set)
    cpu_capacity: float = 1.0              # CPUs the job may use: affinity, capped by its cgroup quota
    cpu_capacity_basis: str = ""

    @property
    def direct_children(self) -> int:
        """Processes whose parent is the target (its DataLoader workers, or a launcher's ranks)."""
        return sum(1 for p in self.processes[1:] if self.children.get(p) == self.pid)


WORKER_THREADS = 3              # threads of a process of the job beyond the target, before it is read


def expected_job_threads(job: JobShape) -> int:
    """The job's threads before the window: the target's, and WORKER_THREADS for each other process
    (a DataLoader worker: its main thread and its queues' feeder threads)."""
    return max(job.threads, 1) + WORKER_THREADS * max(0, len(job.processes) - 1)


@dataclass
class ProbeCost:
    """A probe's expected cost over one window: the whole of it, its children included."""

    cpu_s: float
    rss_mb: float
    basis: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"cpu_seconds": round(self.cpu_s, 4), "rss_mb": round(self.rss_mb, 1), "basis": self.basis}


@dataclass
class Capture:
    """Raw output of one probe over one window, with where every byte came from."""

    probe: str
    status: str = "ok"
    reason: str | None = None
    started_unix: float = 0.0
    seconds: float = 0.0
    artifacts: dict[str, str] = field(default_factory=dict)
    provenance: list[dict[str, Any]] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "probe": self.probe, "status": self.status, "reason": self.reason,
            "started_unix": self.started_unix, "seconds": self.seconds,
            "artifacts": self.artifacts, "provenance": self.provenance, "meta": self.meta,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Capture":
        return cls(
            probe=d["probe"], status=d.get("status", "ok"), reason=d.get("reason"),
            started_unix=d.get("started_unix", 0.0), seconds=d.get("seconds", 0.0),
            artifacts=dict(d.get("artifacts", {})), provenance=list(d.get("provenance", [])),
            meta=dict(d.get("meta", {})),
        )


def _set_parent_death_signal(sig: int) -> Callable[[], None]:
    """preexec_fn: the child gets `sig` if trainprobe dies, so nothing stays attached. A Python
    preexec_fn makes CPython fork the whole agent (page tables, copy-on-write faults, Python code in
    the child: about 6 ms of CPU a spawn here) where it would otherwise vfork (1 ms); `_spawn_argv`
    avoids it where setpriv can set the signal instead."""
    import ctypes

    def preexec() -> None:
        try:
            libc = ctypes.CDLL("libc.so.6", use_errno=True)
            libc.prctl(1, sig)  # PR_SET_PDEATHSIG
        except OSError:
            pass

    return preexec


_SETPRIV_PATHS = ("/usr/bin/setpriv", "/bin/setpriv")
_setpriv: list[str | None] = []         # found once per process: [path or None]


def _setpriv_binary() -> str | None:
    """util-linux's setpriv when it knows --pdeathsig (2.33 and later: the option's name is in the
    binary's option table), else None."""
    if not _setpriv:
        found = None
        for path in _SETPRIV_PATHS:
            try:
                with open(path, "rb") as fh:
                    if b"pdeathsig" in fh.read(4 << 20) and os.access(path, os.X_OK):
                        found = path
                        break
            except OSError:
                continue
        _setpriv.append(found)
    return _setpriv[0]


def _spawn_argv(argv: list[str], sig: int, kw: dict[str, Any]) -> tuple[list[str], dict[str, Any]]:
    """The argv and Popen keywords that start `argv` with the parent-death signal `sig` set.

    Where the command is an executable file named by its path and setpriv is there, setpriv sets
    the signal and execs the command in the same process (same PID), and CPython may vfork: about
    2.8 ms of CPU a spawn instead of 6 (measured: 40 spawns of /bin/true from a process holding the
    agent's imports). setpriv sets the signal once it runs, so a child started in the last
    millisecond before the agent is killed may miss it (the preexec_fn has no such window); every
    long-running child of a probe ends on its own anyway (py-spy --duration, perf --interval-count).
    Otherwise (a bare command name, whose absence must stay an OSError; a child
    that changes its user or groups, which CPython forks for anyway) the preexec_fn sets it."""
    exe = str(argv[0]) if argv else ""
    setpriv = _setpriv_binary()
    if (setpriv and os.path.isabs(exe) and os.path.isfile(exe) and os.access(exe, os.X_OK)
            and not any(kw.get(k) is not None for k in ("user", "group", "extra_groups", "preexec_fn"))):
        return [setpriv, "--pdeathsig", signal.Signals(sig).name, "--", *map(str, argv)], kw
    return list(argv), {**kw, "preexec_fn": _set_parent_death_signal(sig)}


def _popen(argv: list[str], sig: int, **kw: Any) -> "TrackedPopen":
    """A TrackedPopen of `argv` that dies with the agent (`sig`); its `args` are `argv` as given."""
    real, kw = _spawn_argv(argv, sig, kw)
    proc = TrackedPopen(real, **kw)
    proc.args = list(argv)
    return proc


def which(name: str) -> str | None:
    """shutil.which(name) for a command name, without importing shutil (and with it bz2, lzma and
    zlib: about 6 ms of the agent's start-up here)."""
    for d in os.environ.get("PATH", os.defpath).split(os.pathsep):
        path = os.path.join(d or ".", name)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def private_dir(prefix: str) -> str:
    """tempfile.mkdtemp(prefix=prefix) without importing tempfile (shutil, random: about 12 ms of
    the agent's start-up here): a new directory of mode 0700 under $TMPDIR or /tmp."""
    for base in (os.environ.get("TMPDIR"), "/tmp"):
        if not base or not os.path.isdir(base):
            continue
        for _ in range(100):
            path = os.path.join(base, prefix + os.urandom(6).hex())
            try:
                os.mkdir(path, 0o700)
                return path
            except FileExistsError:
                continue
            except OSError:
                break
    import tempfile
    return tempfile.mkdtemp(prefix=prefix)


def remove_private_dir(path: str) -> None:
    """shutil.rmtree(path, ignore_errors=True) for a directory of files a probe wrote there."""
    try:
        names = os.listdir(path)
    except OSError:
        return
    for name in names:
        try:
            os.unlink(os.path.join(path, name))
        except IsADirectoryError:
            import shutil
            shutil.rmtree(os.path.join(path, name), ignore_errors=True)
        except OSError:
            pass
    try:
        os.rmdir(path)
    except OSError:
        pass


class TrackedPopen(subprocess.Popen):
    """A Popen that keeps the child's rusage (wait4) when it is reaped, whichever call reaps it.

    The agent's overhead counts every process it started: this is where a child's CPU time and
    peak RSS (its own and its waited-for descendants') are taken, at the moment it is reaped.
    """

    rusage: Any = None

    def _wait4(self, pid: int, flags: int) -> tuple[int, int]:
        rpid, sts, ru = os.wait4(pid, flags)
        if rpid == self.pid:
            self.rusage = ru
        return rpid, sts

    def _try_wait(self, wait_flags: int) -> tuple[int, int]:   # used by wait()
        try:
            return self._wait4(self.pid, wait_flags)
        except ChildProcessError:
            return self.pid, 0

    def poll(self) -> int | None:
        return self._internal_poll(_waitpid=self._wait4)


@dataclass
class ChildCost:
    """What one child process of a probe cost, taken from its rusage when it was reaped."""

    argv0: str
    cpu_s: float
    max_rss_mb: float
    long_running: bool


@dataclass
class CommandResult:
    argv: list[str]
    rc: int | None
    stdout: str
    stderr: str
    seconds: float
    timed_out: bool = False


class Recorder:
    """The only door through which a probe's capture touches the host.

    Every file read and every command run is recorded (path or argv, exit code, start, duration),
    and every child process it starts is tracked so the session can stop it.
    """

    def __init__(self, capture: Capture, stop: threading.Event):
        self.capture = capture
        self.stop = stop
        self._procs: list[subprocess.Popen] = []
        self._lock = threading.Lock()
        self.children: list[ChildCost] = []
        self._untracked_procs: list[TrackedPopen] = []

    # -- cost -------------------------------------------------------------------------------
    def _account(self, proc: subprocess.Popen, long_running: bool) -> None:
        ru = getattr(proc, "rusage", None)
        if ru is None:
            return
        argv = proc.args if isinstance(proc.args, (list, tuple)) else [str(proc.args)]
        cost = ChildCost(os.path.basename(str(argv[0])), ru.ru_utime + ru.ru_stime, ru.ru_maxrss / 1024.0,
                         long_running)
        with self._lock:
            if proc in self._untracked_procs:
                self._untracked_procs.remove(proc)
            self.children.append(cost)
            proc.rusage = None          # counted once

    def children_cost(self) -> dict[str, Any]:
        """CPU and an upper bound of the peak RSS of every child reaped so far.

        Long-running children (spawn) may overlap: their peaks add up. Short commands (run) are
        sequential within a probe: the largest of them counts once.
        """
        for p in list(self._untracked_procs):
            if p.poll() is not None:
                self._account(p, True)
        with self._lock:
            kids = list(self.children)
        spawned = sum(c.max_rss_mb for c in kids if c.long_running)
        short = max((c.max_rss_mb for c in kids if not c.long_running), default=0.0)
        return {"children": len(kids), "children_cpu_seconds": round(sum(c.cpu_s for c in kids), 4),
                "children_max_rss_mb": round(spawned + short, 1),
                "by_command": _by_command(kids)}

    # -- provenance -------------------------------------------------------------------------
    def note(self, kind: str, what: str, rc: int | None, started: float, seconds: float) -> None:
        with self._lock:
            self.capture.provenance.append(
                {"kind": kind, "what": redact.text(what), "rc": rc, "started_unix": round(started, 6),
                 "seconds": round(seconds, 6)})

    def add(self, name: str, text: str) -> None:
        """Store a raw artifact; credentials in it are redacted here, before anything else sees it."""
        self.capture.artifacts[name] = redact.artifact(name, text)

    # -- files ------------------------------------------------------------------------------
    def read_file(self, path: str, artifact: str | None = None, record: bool = True) -> str:
        """Read a text file; store it as an artifact (default: named by its path)."""
        t0 = time.time()
        try:
            with open(path, "r", errors="replace") as fh:
                text = fh.read()
        except OSError as exc:
            if record:
                self.note("file", path, -1, t0, time.time() - t0)
            raise translate_oserror(exc, path) from None
        if record:
            self.note("file", path, 0, t0, time.time() - t0)
        self.add(artifact or path, text)
        return text

    # -- commands ---------------------------------------------------------------------------
    def run(self, argv: list[str], timeout_s: float, env: dict[str, str] | None = None) -> CommandResult:
        """Run a command to completion with a timeout; never raises on a non-zero exit."""
        t0, m0 = time.time(), time.monotonic()
        try:
            proc = _popen(argv, signal.SIGKILL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          errors="replace", env=env)
        except OSError as exc:
            self.note("command", " ".join(argv), None, t0, 0.0)
            raise translate_oserror(exc, argv[0]) from None
        with self._lock:
            self._procs.append(proc)
        timed_out = False
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            proc.kill()
            out, err = proc.communicate()
        finally:
            with self._lock:
                if proc in self._procs:
                    self._procs.remove(proc)
        secs = time.monotonic() - m0
        self._account(proc, long_running=False)
        self.note("command", " ".join(argv), proc.returncode, t0, secs)
        return CommandResult(argv, proc.returncode, out or "", err or "", secs, timed_out)

    def spawn(self, argv: list[str], stop_signal: int = signal.SIGINT, **kw: Any) -> subprocess.Popen:
        """Start a long-running command (py-spy record, perf stat) that the session can stop."""
        try:
            proc = _popen(argv, stop_signal, **kw)
        except OSError as exc:
            raise translate_oserror(exc, argv[0]) from None
        proc.trainprobe_stop_signal = stop_signal  # type: ignore[attr-defined]
        proc.trainprobe_started = (time.time(), time.monotonic())  # type: ignore[attr-defined]
        with self._lock:
            self._procs.append(proc)
            self._untracked_procs.append(proc)
        return proc

    def finish(self, proc: subprocess.Popen, grace_s: float) -> int | None:
        """Wait for a spawned command; after `grace_s`, send its stop signal, then kill it."""
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            self._signal(proc, getattr(proc, "trainprobe_stop_signal", signal.SIGINT))
            try:
                proc.wait(timeout=3.0)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        t0, m0 = getattr(proc, "trainprobe_started", (time.time(), time.monotonic()))
        argv = proc.args if isinstance(proc.args, list) else [str(proc.args)]
        self.note("command", " ".join(map(str, argv)), proc.returncode, t0, time.monotonic() - m0)
        self._account(proc, long_running=True)
        with self._lock:
            if proc in self._procs:
                self._procs.remove(proc)
        return proc.returncode

    @staticmethod
    def _signal(proc: subprocess.Popen, sig: int) -> None:
        try:
            proc.send_signal(sig)
        except (ProcessLookupError, OSError):
            pass

    def stop_all(self) -> None:
        """Ask every child to stop (its own stop signal), then kill what is left."""
        with self._lock:
            procs = list(self._procs)
        for p in procs:
            if p.poll() is None:
                self._signal(p, getattr(p, "trainprobe_stop_signal", signal.SIGINT))
        deadline = time.monotonic() + 3.0
        for p in procs:
            try:
                p.wait(timeout=max(0.05, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                try:
                    p.wait(timeout=2.0)
                except subprocess.TimeoutExpired:
                    pass
            if p.returncode is not None:
                self._account(p, long_running=True)

    def live_children(self) -> list[int]:
        with self._lock:
            return [p.pid for p in self._procs if p.poll() is None]

    def wait_window(self, deadline_monotonic: float) -> bool:
        """Sleep until the window ends or the session asks to stop. True if stopped early."""
        return self.stop.wait(max(0.0, deadline_monotonic - time.monotonic()))


class Probe:
    """Base class. Subclasses set the metadata and implement check, capture and parse."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    needs: ClassVar[tuple[str, ...]] = ()
    cost: ClassVar[str] = ""
    timeout_s: ClassVar[float] = 10.0     # allowed beyond the window before the probe is abandoned
    default_enabled: ClassVar[bool] = True
    # The commands that run this probe: diagnose watches a process over a window; preflight reads
    # the node before a job starts (ReadingProbe).
    commands: ClassVar[tuple[str, ...]] = ("diagnose",)
    # The measured cost model (docs/cost.md), capture and parse: CPU-s = fixed + per_s * window +
    # per_process * (processes - 1); RSS of its children.
    cost_cpu_s_fixed: ClassVar[float] = 0.0
    cost_cpu_s_per_s: ClassVar[float] = 0.0
    cost_cpu_s_per_process: ClassVar[float] = 0.0   # each process of the job beyond the target
    cost_cpu_s_per_thread: ClassVar[float] = 0.0    # each thread of the job (expected_job_threads)
    cost_rss_mb: ClassVar[float] = 0.0
    # Probes whose cost follows a setting (a sampling rate, a poll interval) say so: the session gives
    # them what is left of the budget, in this order, through `fit_budget`.
    adjustable: ClassVar[bool] = False
    budget_priority: ClassVar[int] = 100
    # The share of the probe's cost spent in native children (py-spy, not Python): the CLI's start-up
    # gauges the interpreter's speed, so the plan scales only the rest by it (agent/cost.py).
    native_share: ClassVar[float] = 0.0
    # The TypedDict (probes/schema.py) of what `parse` returns: tests check every replayed capture
    # against it, and evidence read back from JSON gets its declared key types from it.
    evidence_schema: ClassVar[Any] = None

    def estimate_cost(self, spec: WatchSpec, job: JobShape) -> ProbeCost:
        """This probe's CPU-s and RSS over the window, before it runs (the default: the class model)."""
        extra = max(0, len(job.processes) - 1)
        threads = expected_job_threads(job)
        return ProbeCost(self.cost_cpu_s_fixed + self.cost_cpu_s_per_s * spec.window_s
                         + self.cost_cpu_s_per_process * extra + self.cost_cpu_s_per_thread * threads,
                         self.cost_rss_mb, f"measured model, {extra + 1} process(es)"
                         + (f", about {threads} threads" if self.cost_cpu_s_per_thread else ""))

    def adds_nothing(self, spec: WatchSpec, job: JobShape) -> str | None:
        """Why this probe would add no evidence on this host (the budget then leaves it out, saying
        so; naming it with --probes runs it anyway), or None."""
        return None

    def fit_budget(self, spec: WatchSpec, job: JobShape, cpu_s: float) -> ProbeCost | None:
        """Adjustable probes: choose settings (in spec.options) that cost at most `cpu_s` and return
        the cost; None when no useful setting fits (the session then skips the probe, with the reason)."""
        cost = self.estimate_cost(spec, job)
        return cost if cost.cpu_s <= cpu_s else None

    def __init_subclass__(cls, **kw: Any) -> None:
        # A capture may come from a bundle someone else saved: a malformed one is MalformedInput.
        super().__init_subclass__(**kw)
        fn = cls.__dict__.get("parse")
        if isinstance(fn, staticmethod):
            cls.parse = staticmethod(parser(f"{cls.name or cls.__name__} capture")(fn.__func__))  # type: ignore[method-assign]

    def check(self, spec: WatchSpec) -> Availability:
        """Can this probe run here, now, against this target? If not, one actionable line."""
        return Availability.yes()

    def capture(self, spec: WatchSpec, rec: Recorder, deadline_monotonic: float) -> None:
        raise NotImplementedError

    @staticmethod
    def parse(capture: Capture) -> dict[str, Any]:
        raise NotImplementedError


def _by_command(kids: list[ChildCost]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for c in kids:
        d = out.setdefault(c.argv0, {"runs": 0, "cpu_seconds": 0.0, "max_rss_mb": 0.0})
        d["runs"] += 1
        d["cpu_seconds"] = round(d["cpu_seconds"] + c.cpu_s, 4)
        d["max_rss_mb"] = round(max(d["max_rss_mb"], c.max_rss_mb), 1)
    return out


def target_exists(spec: WatchSpec) -> Availability:
    """The check of a probe that needs nothing but the target's /proc entries."""
    if not os.path.isdir(os.path.join(spec.root, "proc", str(spec.pid))):
        return Availability.no(f"process {spec.pid} does not exist")
    return Availability.yes()


def describe(probe: Probe) -> dict[str, Any]:
    return {"name": probe.name, "description": probe.description, "needs": list(probe.needs),
            "cost": probe.cost, "timeout_s": probe.timeout_s}


def guarded(fn: Callable[..., Any], *a: Any, **kw: Any) -> tuple[Any, ProbeError | None]:
    """Run fn; return (result, None) or (None, ProbeError) for any failure of the host."""
    try:
        return fn(*a, **kw), None
    except ProbeError as exc:
        return None, exc
    except subprocess.TimeoutExpired as exc:
        return None, TimedOut(str(exc))
    except OSError as exc:
        return None, translate_oserror(exc, getattr(exc, "filename", None) or "system call")


# -- probes made of reads (preflight) ---------------------------------------------------------------

class ReadRecord(TypedDict):
    """One read of a ReadingProbe as the checks see it (ReadingProbe.parse gives one per read).
    Optional, not `X | None`: the evidence-schema checker reads typing's forms."""

    data: Any                           # the read's raw value; None when it did not answer
    error: Optional[Dict[str, str]]     # {kind, message} in the probes.errors taxonomy
    timed_out: bool
    seconds: float
    timeout_s: Optional[float]          # the timeout it ran under (the runner's)


def reads_schema(name: str, reads: dict[str, str]) -> Any:
    """A ReadingProbe's evidence schema: a ReadRecord for each read it may have done."""
    return TypedDict(name, {r: ReadRecord for r in reads}, total=False)  # type: ignore[operator]


class ReadingProbe(Probe):
    """A probe made of named reads of the node, each of which can run (and time out) on its own.

    Preflight runs every read in its own thread under its own timeout (agent/preflight), so a hung
    driver call fails the checks that needed that read and nothing else. A read touches the host
    through the Recorder and returns its raw value; `run_read` stores that value as an artifact
    (text as `<read>`, anything else as `<read>.json`) and its outcome in `meta["reads"]`, and
    `parse` gives back one record per read, the same from a live run and from a bundle.
    """

    commands = ("preflight",)
    default_enabled = False
    reads: ClassVar[dict[str, str]] = {}       # read name -> what it reads, in words for messages

    def read(self, name: str, spec: WatchSpec, rec: Recorder) -> Any:
        """Do one read (its settings are in spec.options) and return its raw JSON-able value."""
        raise NotImplementedError

    def capture(self, spec: WatchSpec, rec: Recorder, deadline_monotonic: float) -> None:
        for name in self.reads:
            merge_read(rec.capture, run_read(self, name, spec, rec.stop))

    @staticmethod
    def parse(capture: Capture) -> dict[str, ReadRecord]:
        """-> {read: ReadRecord}: the value of every read that answered, from its artifact; for the
        others, why not. A malformed capture names its probe."""
        return parser(f"{capture.probe} capture")(_parse_reads)(capture)


def _parse_reads(capture: Capture) -> dict[str, ReadRecord]:
    out: dict[str, ReadRecord] = {}
    for name, outcome in dict(capture.meta.get("reads") or {}).items():
        err = outcome.get("error")
        if err is not None and not (isinstance(err.get("kind"), str) and isinstance(err.get("message"), str)):
            raise ValueError(f"read {name}: its error is not {{kind, message}}")
        data = None
        if not err:
            if f"{name}.json" in capture.artifacts:
                data = json.loads(capture.artifacts[f"{name}.json"])
            else:
                data = capture.artifacts[name]
        out[str(name)] = ReadRecord(data=data, error=err, timed_out=bool(outcome.get("timed_out")),
                                    seconds=float(outcome.get("seconds") or 0.0), timeout_s=outcome.get("timeout_s"))
    return out


def run_read(probe: ReadingProbe, name: str, spec: WatchSpec, stop: threading.Event) -> Capture:
    """One read into a capture of its own (a read abandoned on its timeout writes only there)."""
    part = Capture(probe.name, started_unix=time.time())
    rec = Recorder(part, stop)
    m0 = time.monotonic()
    outcome: dict[str, Any] = {"error": None, "timed_out": False}
    try:
        value = probe.read(name, spec, rec)
        rec.add(name if isinstance(value, str) else f"{name}.json",
                value if isinstance(value, str) else json.dumps(value, default=str))
    except ProbeError as exc:
        # A read that bounds itself (a killed child, a hung NVML call) timed out all the same.
        outcome.update(error={"kind": exc.kind, "message": str(exc)}, timed_out=exc.kind == "timed_out")
    outcome["seconds"] = round(time.monotonic() - m0, 6)
    if outcome["error"] is None:
        rec.note("read", probe.reads.get(name, name), 0, part.started_unix, outcome["seconds"])
    part.seconds = outcome["seconds"]
    part.meta["reads"] = {name: outcome}
    return part


def merge_read(into: Capture, part: Capture, **outcome: Any) -> None:
    """Add one read's capture to its probe's; `outcome` (timed_out, timeout_s) is the runner's word."""
    into.artifacts.update(part.artifacts)
    into.provenance.extend(part.provenance)
    reads = into.meta.setdefault("reads", {})
    for name, rec in part.meta.get("reads", {}).items():
        reads[name] = {**rec, **outcome}
    into.seconds = round(into.seconds + part.seconds, 6)


def read_outcome(into: Capture, name: str, **outcome: Any) -> None:
    """Record a read that gave no capture (it was abandoned, or its probe cannot run here)."""
    into.meta.setdefault("reads", {})[name] = {"error": None, "timed_out": False, "seconds": 0.0, **outcome}
