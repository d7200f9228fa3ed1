"""What every probe is: metadata, an availability check, a capture step and a pure parser.

A probe's `capture` touches the host and records raw text with its provenance into a Capture;
its `parse` is a pure function of that Capture. The same parser therefore reads a live host and a
replayed bundle. Probes never import `agent` or `reports`.
"""
from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

from probes import redact
from probes.errors import ProbeError, TimedOut, parser, translate_oserror

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
    """preexec_fn: the child gets `sig` if trainprobe dies, so nothing stays attached."""

    def preexec() -> None:
        try:
            libc = ctypes.CDLL("libc.so.6", use_errno=True)
            libc.prctl(1, sig)  # PR_SET_PDEATHSIG
        except OSError:
            pass

    return preexec


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
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                    errors="replace", env=env,
                                    preexec_fn=_set_parent_death_signal(signal.SIGKILL))
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
        self.note("command", " ".join(argv), proc.returncode, t0, secs)
        return CommandResult(argv, proc.returncode, out or "", err or "", secs, timed_out)

    def spawn(self, argv: list[str], stop_signal: int = signal.SIGINT, **kw: Any) -> subprocess.Popen:
        """Start a long-running command (py-spy record, perf stat) that the session can stop."""
        try:
            proc = subprocess.Popen(argv, preexec_fn=_set_parent_death_signal(stop_signal), **kw)
        except OSError as exc:
            raise translate_oserror(exc, argv[0]) from None
        proc.trainprobe_stop_signal = stop_signal  # type: ignore[attr-defined]
        proc.trainprobe_started = (time.time(), time.monotonic())  # type: ignore[attr-defined]
        with self._lock:
            self._procs.append(proc)
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
