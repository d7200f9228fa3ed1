"""The error taxonomy every probe and reader speaks.

Raw OSErrors are translated here, at the boundary where the system is touched, so callers see
one of five kinds and a message a user can act on.
"""
from __future__ import annotations

import errno
import functools
from typing import Any, Callable, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


class ProbeError(Exception):
    """Base class: something about the host or the target stopped a read or a probe."""

    kind = "error"


class Unavailable(ProbeError):
    """The host lacks a feature or a tool (no PMU, no bcc, no NVIDIA driver)."""

    kind = "unavailable"


class PermissionDenied(ProbeError):
    """The user lacks the rights (ptrace, perf_event_paranoid, root for eBPF)."""

    kind = "permission_denied"


class TimedOut(ProbeError):
    """A command or a read did not answer within its timeout."""

    kind = "timed_out"


class TargetGone(ProbeError):
    """The process being watched exited (or became a zombie)."""

    kind = "target_gone"


class BadInput(ProbeError):
    """The user asked for something that cannot be: no such PID, not a Python process."""

    kind = "bad_input"


def translate_oserror(exc: OSError, what: str) -> ProbeError:
    """Map an OSError raised while touching `what` to the taxonomy."""
    if isinstance(exc, (FileNotFoundError, ProcessLookupError)) or exc.errno in (errno.ENOENT, errno.ESRCH):
        return TargetGone(f"{what}: no longer exists")
    if isinstance(exc, PermissionError) or exc.errno in (errno.EACCES, errno.EPERM):
        return PermissionDenied(f"{what}: permission denied")
    return ProbeError(f"{what}: {exc.strerror or exc}")


def translate_psutil_error(exc: Exception, what: str) -> ProbeError:
    """Map psutil's exceptions to the taxonomy: a zombie or a vanished process is gone, access
    denied is a permission problem, psutil's timeout is a timeout."""
    import psutil

    table = (  # most specific first: ZombieProcess is a NoSuchProcess
        (psutil.ZombieProcess, TargetGone, "the process is a zombie (it exited; its parent has not reaped it)"),
        (psutil.NoSuchProcess, TargetGone, "no longer exists"),
        (psutil.AccessDenied, PermissionDenied, "permission denied"),
        (psutil.TimeoutExpired, TimedOut, "did not answer in time"),
    )
    for psutil_cls, ours, words in table:
        if isinstance(exc, psutil_cls):
            return ours(f"{what}: {words}")
    if isinstance(exc, OSError):
        return translate_oserror(exc, what)
    return ProbeError(f"{what}: {exc}")


class MalformedInput(BadInput, ValueError):
    """Text handed over by a target or a host (a /proc file, perf's output, a capture in a bundle)
    that a parser cannot read. Also a ValueError, so callers that tolerate bad values keep doing so."""

    kind = "bad_input"


# What a pure parser may stumble on when its input is not what the kernel or tool would write.
_PARSE_ERRORS = (ValueError, IndexError, KeyError, TypeError, AttributeError, OverflowError, ZeroDivisionError,
                 RecursionError, UnicodeError)


def parser(what: str) -> Callable[[F], F]:
    """Decorator for a parser of untrusted text: a malformed input raises MalformedInput (one line
    naming `what`), never a bare exception that would end as a traceback."""

    def deco(fn: F) -> F:
        @functools.wraps(fn)
        def wrapped(*a: Any, **kw: Any) -> Any:
            try:
                return fn(*a, **kw)
            except ProbeError:
                raise
            except _PARSE_ERRORS as exc:
                msg = " ".join(f"{type(exc).__name__}: {exc}".split())[:200]
                raise MalformedInput(f"{what}: malformed input ({msg})") from None

        return wrapped  # type: ignore[return-value]

    return deco
