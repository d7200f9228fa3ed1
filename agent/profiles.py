"""Profiles ({folded stack: microseconds}) from py-spy captures, and saved profiles read back.

The py-spy probe stores its raw chrometrace in the Capture; this module folds it into profiles
for the flame graphs: the whole process (all threads merged, or one root per thread or process
as py-spy's --threads and --subprocesses do), the training thread alone, the DataLoader workers.
It also reads a profile saved earlier (folded text, speedscope JSON, a py-spy chrometrace, a
trainprobe bundle) for `flamegraph --diff BEFORE`.
"""
from __future__ import annotations

import gzip
import os
import zlib
from dataclasses import dataclass
from typing import Any

from trainprobe.probes.parsers import pystacks, safejson
from trainprobe.probes.base import Capture
from trainprobe.probes.pyspy import split_traces
from trainprobe.reports import folded, speedscope

MAX_PROFILE_CHARS = 512 << 20   # a saved profile larger than this (decompressed) is refused
UNIT = "us"       # trainprobe's folded counts: integer microseconds of wall-clock time


class ProfileError(ValueError):
    """A saved profile that cannot be read: one line for the user."""


@dataclass
class Stacks:
    """The threads py-spy saw, split the way the py-spy evidence splits them."""

    main_pid: int
    traces: list[pystacks.ThreadTrace]
    training: pystacks.ThreadTrace | None
    workers: list[pystacks.ThreadTrace]
    others: list[pystacks.ThreadTrace]


def pyspy_capture(captures: list[Capture]) -> Capture | None:
    for c in captures:
        if c.probe == "pyspy" and c.artifacts.get("chrometrace.json"):
            return c
    return None


def stacks_of(cap: Capture) -> Stacks:
    try:
        events = safejson.loads(cap.artifacts["chrometrace.json"], "chrometrace.json")
    except (KeyError, ValueError) as exc:
        raise ProfileError(f"the py-spy capture holds no readable chrometrace ({exc})") from None
    traces = pystacks.read_chrometrace(events)
    main_pid = int(cap.meta.get("pid") or (traces[0].pid if traces else 0))
    training, workers, others = split_traces(traces, main_pid)
    return Stacks(main_pid, traces, training, workers, others)


def process_profile(st: Stacks, threads: bool = False, subprocesses: bool = False) -> dict[str, int]:
    """py-spy's view: the main process (and, with `subprocesses`, its children), threads merged
    unless `threads`."""
    traces = st.traces if subprocesses else [t for t in st.traces if t.pid == st.main_pid]
    return pystacks.fold_traces(traces, threads=threads, processes=subprocesses)


def training_profile(st: Stacks) -> dict[str, int]:
    return pystacks.fold_traces([st.training]) if st.training else {}


def workers_profile(st: Stacks) -> dict[str, int]:
    """All DataLoader workers' threads merged: the shares are of the workers' total time."""
    return pystacks.fold_traces(st.workers)


def thread_title(t: pystacks.ThreadTrace) -> str:
    bits = [f"PID {t.pid}"]
    if t.name:
        bits.append(t.name)
    if t.os_tid:
        bits.append(f"TID {t.os_tid}")
    return ", ".join(bits)


# -- saved profiles ------------------------------------------------------------------------------

def _read_text(path: str) -> str:
    import io
    from trainprobe.agent.inputs import open_input     # a regular file only, never a blocking open
    try:
        with open_input(path) as raw, (gzip.open(raw, "rt", errors="replace") if path.endswith(".gz")
                                       else io.TextIOWrapper(raw, errors="replace")) as fh:
            text = fh.read(MAX_PROFILE_CHARS + 1)
    except (OSError, EOFError, zlib.error) as exc:
        raise ProfileError(f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from None
    if len(text) > MAX_PROFILE_CHARS:
        raise ProfileError(f"{path} is larger than {MAX_PROFILE_CHARS >> 20} MiB (decompressed)")
    return text


def load_profile(path: str, threads: bool = False, subprocesses: bool = False) -> tuple[dict[str, int], str]:
    """`_load_profile`, with credentials in frame and process names redacted (probes.parsers.redact): a
    saved profile may come from an older trainprobe or from a tool that never redacted."""
    from trainprobe.probes.parsers import redact

    prof, desc = _load_profile(path, threads, subprocesses)
    out: dict[str, int] = {}
    for k, v in prof.items():
        k = redact.text(k)
        out[k] = out.get(k, 0) + v
    return out, desc


def _load_profile(path: str, threads: bool = False, subprocesses: bool = False) -> tuple[dict[str, int], str]:
    """A saved profile -> ({folded stack: count}, what it is, in words).

    Accepts a trainprobe bundle (directory or .tar.gz), folded text (one or two counts per line;
    a two-count line is read as its second count), speedscope JSON (all its profiles merged), a
    py-spy chrometrace (.json or .json.gz) or a saved py-spy Capture (Capture.to_dict()).
    """
    from trainprobe.agent import bundle

    if not os.path.exists(path):
        raise ProfileError(f"no such file or directory: {path}")
    if bundle.is_bundle(path):
        try:
            b = bundle.load(path)
        except bundle.BundleError as exc:
            raise ProfileError(str(exc)) from None
        cap = pyspy_capture(b.captures)
        if cap is None:
            raise ProfileError(f"the bundle {path} holds no py-spy stacks")
        return process_profile(stacks_of(cap), threads, subprocesses), f"bundle {path}"
    text = _read_text(path)
    stripped = text.lstrip()
    if stripped.startswith(("{", "[")):
        try:
            doc: Any = safejson.loads(text, path)
        except ValueError as exc:      # over a cap or not JSON: safejson's one line names the path
            raise ProfileError(str(exc)) from None
        if isinstance(doc, dict) and doc.get("$schema") == speedscope.SCHEMA:
            merged: dict[str, int] = {}
            for _name, prof, _unit in speedscope.read(doc, path_label=pystacks.short_path):
                for k, v in prof.items():
                    merged[k] = merged.get(k, 0) + v
            return merged, f"speedscope profile {path}"
        if isinstance(doc, dict) and doc.get("probe") == "pyspy":
            cap = Capture.from_dict(doc)
            return process_profile(stacks_of(cap), threads, subprocesses), f"py-spy capture {path}"
        if isinstance(doc, list) and (not doc or isinstance(doc[0], dict) and "ph" in doc[0]):
            traces = pystacks.read_chrometrace(doc)
            main_pid = min((t.pid for t in traces), default=0)
            if not subprocesses:
                traces = [t for t in traces if t.pid == main_pid]
            return pystacks.fold_traces(traces, threads=threads, processes=subprocesses), f"py-spy chrometrace {path}"
        raise ProfileError(f"{path}: JSON, but neither a speedscope file, a py-spy chrometrace nor a capture")
    try:
        prof = folded.parse(text)
    except folded.FoldedError as exc:
        raise ProfileError(f"{path}: {exc}") from None
    if not prof:
        raise ProfileError(f"{path} holds no stacks")
    return prof, f"folded stacks {path}"
