"""Choosing and validating the process to diagnose. Turns probe errors into the contract's exit codes."""
from __future__ import annotations

from dataclasses import dataclass

from trainprobe.probes.errors import PermissionDenied, ProbeError, TargetGone
from trainprobe.probes.support.target import Candidate, ProcessInfo, can_ptrace, find_training_processes, inspect

EXIT_OK = 0
EXIT_BAD_INPUT = 2
EXIT_TARGET_GONE = 3
EXIT_NOT_PERMITTED = 4
EXIT_INTERRUPTED = 130


class UserError(Exception):
    """One clear line for the user and the exit code that goes with it."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


def exit_code_for(exc: ProbeError) -> int:
    if isinstance(exc, PermissionDenied):
        return EXIT_NOT_PERMITTED
    if isinstance(exc, TargetGone):
        return EXIT_TARGET_GONE
    return EXIT_BAD_INPUT


@dataclass
class Resolved:
    info: ProcessInfo
    how: str            # "given" or "discovered"


def validate(pid: int, root: str = "/") -> ProcessInfo:
    try:
        info = inspect(pid, root)
    except ProbeError as exc:
        raise UserError(str(exc), exit_code_for(exc)) from None
    if info.kernel_thread:
        raise UserError(f"PID {pid} is a kernel thread ({info.comm}), not a training process", EXIT_BAD_INPUT)
    if info.zombie:
        raise UserError(f"PID {pid} is a zombie (it exited and its parent has not reaped it); nothing to attach to",
                        EXIT_BAD_INPUT)
    if not info.is_python:
        raise UserError(f"PID {pid} ({info.comm}) is not a Python process; give the PID of the training script",
                        EXIT_BAD_INPUT)
    try:
        ok, why = can_ptrace(info, root)
    except PermissionDenied as exc:
        raise UserError(str(exc), EXIT_NOT_PERMITTED) from None
    if not ok:
        raise UserError(f"not permitted: {why}", EXIT_NOT_PERMITTED)
    return info


def resolve(pid: int | None, root: str = "/") -> Resolved:
    if pid is not None:
        return Resolved(validate(pid, root), "given")
    cands = find_training_processes(root)
    if not cands:
        raise UserError("no training process found (no Python process on this host has loaded torch); "
                        "give one with --pid", EXIT_BAD_INPUT)
    if len(cands) > 1 and not _dominant(cands):
        lines = "; ".join(f"{c.pid} ({c.cpu_cores:.1f} cores) {c.cmdline[:60]}" for c in cands[:5])
        raise UserError(f"several training processes found, choose one with --pid: {lines}", EXIT_BAD_INPUT)
    return Resolved(validate(cands[0].pid, root), "discovered")


def _dominant(cands: list[Candidate]) -> bool:
    """The busiest tree clearly leads: at least 0.5 cores and twice the next one."""
    a, b = cands[0].cpu_cores, cands[1].cpu_cores
    return a >= 0.5 and a >= 2.0 * b
