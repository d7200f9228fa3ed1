"""Bundles: the raw evidence of one diagnosis or preflight run, saved so it can be judged offline.

A bundle holds every probe's Capture (raw text and provenance, as Capture.to_dict()), the
run's context (diagnosis: host, target, window; preflight: `"command": "preflight"`, host, tiers),
the overhead and notes of the live run, and the report the live run printed. `trainprobe report
BUNDLE` re-runs the parsers and the rules on a diagnosis's captures (agent.diagnosis.report_from),
so the same findings come back on another machine; `trainprobe preflight --replay BUNDLE` re-runs
the preflight probes' parsers and the checks (agent.preflight.runner).

Layout, as a directory or inside a .tar.gz (under one top folder):
    bundle.json            schema, tool, saved_unix, context, overhead, notes, captures (file names)
    captures/<probe>.json  Capture.to_dict() of each probe, skipped and failed ones included
    report.json            the report of the live run
"""
from __future__ import annotations

import errno
import io
import json
import os
import re
import stat
import tarfile
import time
from dataclasses import dataclass, field
from typing import Any

from trainprobe.agent import __version__
from trainprobe.probes.parsers import redact, safejson
from trainprobe.probes.base import Capture

SCHEMA = "trainprobe.bundle/1"
INDEX = "bundle.json"
ARCHIVE_SUFFIXES = (".tar.gz", ".tgz")
# A bundle comes from another machine or another user: untrusted. Its members are read in memory,
# so their sizes are capped (a gzip bomb stops at the cap, with a clear error).
MAX_MEMBER_BYTES = 256 << 20
MAX_TOTAL_BYTES = 1 << 30
MAX_MEMBERS = 512
# Every JSON document of a bundle (members, and the JSON artifacts inside captures) together: the
# values they may hold, so a few MB of `[{},{},...]` cannot become GBs of objects (safejson).
MAX_BUNDLE_VALUES = 4_000_000
_MEMBER = re.compile(r"^(bundle\.json|report\.json|captures/[A-Za-z0-9_.\-]{1,80}\.json)$")


class BundleError(Exception):
    """A path that is not a bundle, or that cannot be written: one line for the user."""


@dataclass
class Bundle:
    captures: list[Capture]
    context: dict[str, Any]
    overhead: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    report: dict[str, Any] | None = None
    saved_unix: float | None = None
    tool_version: str | None = None
    path: str = ""


def is_archive(path: str) -> bool:
    return path.endswith(ARCHIVE_SUFFIXES)


def is_bundle(path: str) -> bool:
    if os.path.isdir(path):
        return os.path.isfile(os.path.join(path, INDEX))
    return os.path.isfile(path) and is_archive(path)


def check_target(path: str) -> None:
    """Before a run: can a bundle be written at `path`? Raises BundleError with the reason."""
    from trainprobe.reports import output
    why = output.check_path(path, directory=not is_archive(path))
    if why:
        raise BundleError(why.replace("cannot write", "cannot save the bundle to", 1))
    parent = os.path.dirname(os.path.abspath(path)) or "."
    if not os.path.isdir(parent):
        raise BundleError(f"cannot save the bundle to {path}: {parent} is not a directory")
    if not os.access(parent, os.W_OK):
        raise BundleError(f"cannot save the bundle to {path}: {parent} is not writable")
    if is_archive(path):
        if os.path.isdir(path):
            raise BundleError(f"cannot save the bundle to {path}: it is a directory")
        return
    if os.path.exists(path):
        if not os.path.isdir(path):
            raise BundleError(f"cannot save the bundle to {path}: a file is there (name it .tar.gz for an archive)")
        if os.listdir(path) and not os.path.isfile(os.path.join(path, INDEX)):
            raise BundleError(f"cannot save the bundle to {path}: a directory with other files is there")


def _files(captures: list[Capture], context: dict[str, Any], report: dict[str, Any] | None) -> dict[str, bytes]:
    names = []
    files: dict[str, bytes] = {}
    for cap in captures:
        name = f"captures/{cap.probe}.json"
        names.append(name)
        files[name] = json.dumps(cap.to_dict(), default=str).encode()
    index = {
        "schema": SCHEMA, "tool": {"name": "trainprobe", "version": __version__}, "saved_unix": round(time.time(), 3),
        "context": context, "overhead": (report or {}).get("overhead", {}), "notes": context.get("session_notes", (report or {}).get("notes", [])),
        "captures": names,
    }
    files[INDEX] = json.dumps(index, indent=2, default=str).encode()
    if report is not None:
        files["report.json"] = json.dumps(report, indent=2, default=str).encode()
    return files


def save(path: str, captures: list[Capture], context: dict[str, Any], report: dict[str, Any] | None = None) -> str:
    """Write a bundle (a directory, or a .tar.gz when the path says so). Returns the path.

    Every file is written through reports.output: atomic, mode 0600 (a bundle holds the target's
    stacks and command line), given back to the user behind sudo."""
    from trainprobe.reports import output

    check_target(path)
    files = _files(captures, context, report)
    try:
        if is_archive(path):
            top = os.path.basename(path)
            for suf in ARCHIVE_SUFFIXES:
                if top.endswith(suf):
                    top = top[: -len(suf)]
            buf = io.BytesIO()
            with tarfile.open(fileobj=buf, mode="w:gz") as tar:
                now = time.time()
                for name, data in files.items():
                    info = tarfile.TarInfo(f"{top or 'bundle'}/{name}")
                    info.size, info.mtime, info.mode = len(data), now, 0o600
                    tar.addfile(info, io.BytesIO(data))
            output.write(path, buf.getvalue(), private=True)
        else:
            output.make_dir(path)
            output.make_dir(os.path.join(path, "captures"))
            for old in os.listdir(os.path.join(path, "captures")):
                if old.endswith(".json"):
                    os.unlink(os.path.join(path, "captures", old))
            for name, data in sorted(files.items(), key=lambda kv: kv[0] == INDEX):  # the index last
                output.write(os.path.join(path, name), data, private=True)
    except OSError as exc:
        raise BundleError(f"cannot save the bundle to {path}: {exc.strerror or exc}") from None
    return path


def valid_member(name: Any) -> bool:
    """A member name a bundle may hold: bundle.json, report.json or captures/<name>.json; nothing
    absolute, no `..`, no other directory."""
    return isinstance(name, str) and bool(_MEMBER.match(name)) and ".." not in name


def _read_archive(path: str) -> dict[str, bytes]:
    """The bundle's members, by their path below the bundle's top folder, read in memory by the
    bounded tar reader (agent.tarread): nothing is extracted to disk, so member names cannot escape
    anywhere, and every header and size is checked before what it announces is read."""
    from trainprobe.agent import tarread

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise BundleError(f"cannot read the bundle {path}: {exc.strerror or exc}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise BundleError(f"cannot read the bundle {path}: not a regular file")
        with os.fdopen(fd, "rb") as fh:
            fd = -1
            members = tarread.read(fh, _wanted, MAX_MEMBER_BYTES, MAX_TOTAL_BYTES, MAX_MEMBERS)
    except tarread.TarRefused as exc:
        raise BundleError(f"cannot read the bundle {path} (a gzip-compressed tar archive): {exc}") from None
    except OSError as exc:
        raise BundleError(f"cannot read the bundle {path}: {exc.strerror or exc}") from None
    finally:
        if fd >= 0:
            os.close(fd)
    index = [n for n in members if n.split("/")[-1] == INDEX]
    if not index:
        raise BundleError(f"{path} is not a trainprobe bundle (no {INDEX} inside)")
    if len(index) > 1:
        raise BundleError(f"{path}: more than one {INDEX} inside ({', '.join(sorted(index)[:3])}): not one bundle")
    prefix = index[0][: -len(INDEX)]
    return {n[len(prefix):]: data for n, data in members.items()
            if n.startswith(prefix) and valid_member(n[len(prefix):])}


def _wanted(name: str) -> bool:
    """An archive member worth keeping in memory: a bundle member below some top folder."""
    parts = name.split("/")
    return any(valid_member("/".join(parts[i:])) for i in range(max(0, len(parts) - 2), len(parts)))


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def open_dir(path: str, rel: str = "", dir_fd: int | None = None) -> int:
    """A directory descriptor for `path` (as named: a link the user named is theirs to follow), then
    down `rel` one component at a time, never through a link: raises BundleError."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError as exc:
        raise BundleError(f"cannot open {path}: {exc.strerror or exc}") from None
    for comp in [c for c in rel.split("/") if c]:
        try:
            nxt = os.open(comp, _DIR_FLAGS, dir_fd=fd)
        except OSError as exc:
            why = "a link or not a directory" if exc.errno in (errno.ELOOP, errno.ENOTDIR) else exc.strerror
            raise BundleError(f"{path}: {rel}: {comp}/ is {why}") from None
        finally:
            os.close(fd)
        fd = nxt
    return fd


def read_file_at(dir_fd: int, name: str, label: str, max_bytes: int, budget: list[int] | None = None) -> bytes | None:
    """One file below dir_fd (`a/b.json`): each directory and the file itself opened without
    following a link, the file a regular one with a single link (a hard link could be any file
    of this host), at most max_bytes. None when it is not there; BundleError for anything else."""
    parts = name.split("/")
    d = dir_fd
    try:
        for comp in parts[:-1]:
            try:
                nxt = os.open(comp, _DIR_FLAGS, dir_fd=d)
            except FileNotFoundError:
                return None
            except OSError as exc:
                why = "a link or not a directory" if exc.errno in (errno.ELOOP, errno.ENOTDIR) else exc.strerror
                raise BundleError(f"{label}: {comp}/ is {why}") from None
            if d != dir_fd:
                os.close(d)
            d = nxt
        try:
            fd = os.open(parts[-1], _FILE_FLAGS, dir_fd=d)
        except FileNotFoundError:
            return None
        except OSError as exc:
            why = "a symbolic link" if exc.errno == errno.ELOOP else (exc.strerror or str(exc))
            raise BundleError(f"{label}: cannot open {name}: {why}") from None
    finally:
        if d != dir_fd:
            os.close(d)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise BundleError(f"{label}: {name} is not a regular file")
        if st.st_nlink != 1:
            raise BundleError(f"{label}: {name} has {st.st_nlink} hard links (a bundle's files have one)")
        if st.st_size > max_bytes:
            raise BundleError(f"{label}: {name} is larger than {max_bytes >> 20} MiB")
        if budget is not None:
            budget[0] -= st.st_size
            if budget[0] < 0:
                raise BundleError(f"{label}: larger than {MAX_TOTAL_BYTES >> 20} MiB in all")
        chunks, left = [], max_bytes + 1
        while left > 0:
            b = os.read(fd, min(left, 1 << 20))
            if not b:
                break
            chunks.append(b)
            left -= len(b)
        data = b"".join(chunks)
        if len(data) > max_bytes:
            raise BundleError(f"{label}: {name} is larger than {max_bytes >> 20} MiB")
        return data
    except OSError as exc:
        raise BundleError(f"{label}: cannot read {name}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)


def _read_member(path: str, dir_fd: int, name: str, budget: list[int]) -> bytes | None:
    """One member of a directory bundle: a regular file reached without following a link."""
    if not valid_member(name):
        raise BundleError(f"{path}: unsafe member name {name!r} in {INDEX} (only captures/<name>.json)")
    return read_file_at(dir_fd, name, path, MAX_MEMBER_BYTES, budget)


def _json(data: bytes, what: str, values: list[int]) -> Any:
    """A member's JSON through the bounded loader; the bundle's documents share one value budget."""
    try:
        return safejson.loads(data, what, MAX_MEMBER_BYTES, budget=values)
    except safejson.JSONLimitError as exc:
        raise BundleError(str(exc)) from None


_PROBE = re.compile(r"^[A-Za-z0-9_.\-]{1,80}$")


def _capture(doc: Any, what: str, values: list[int]) -> Capture:
    """A Capture from a member's JSON, its declared shape checked (a wrong type is refused here,
    not found by a parser); the JSON artifacts are held to the same caps as the members."""
    if not isinstance(doc, dict):
        raise BundleError(f"{what} is not a capture (not a JSON object)")
    probe, status, reason = doc.get("probe"), doc.get("status", "ok"), doc.get("reason")
    started, seconds = doc.get("started_unix", 0.0), doc.get("seconds", 0.0)
    artifacts, provenance, meta = doc.get("artifacts", {}), doc.get("provenance", []), doc.get("meta", {})
    bad = [k for k, ok in (
        ("probe", isinstance(probe, str) and bool(_PROBE.match(probe))), ("status", isinstance(status, str)),
        ("reason", isinstance(reason, (str, type(None)))),
        ("started_unix", isinstance(started, (int, float)) and not isinstance(started, bool)),
        ("seconds", isinstance(seconds, (int, float)) and not isinstance(seconds, bool)),
        ("artifacts", isinstance(artifacts, dict) and all(isinstance(k, str) and isinstance(v, str)
                                                         for k, v in artifacts.items())),
        ("provenance", isinstance(provenance, list)), ("meta", isinstance(meta, dict))) if not ok]
    if bad:
        raise BundleError(f"{what} is not a capture: {', '.join(bad)} of the wrong type")
    for name, text in artifacts.items():
        if name.endswith((".json", ".jsonl")):
            try:
                n = safejson.check(text, f"{what}: artifact {name}", MAX_MEMBER_BYTES,
                                   max_values=min(safejson.MAX_VALUES, values[0]))
            except safejson.JSONLimitError as exc:
                raise BundleError(str(exc)) from None
            values[0] -= n
    return Capture(probe=probe, status=status, reason=reason, started_unix=started, seconds=seconds,
                   artifacts=dict(artifacts), provenance=list(provenance), meta=dict(meta))


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


# The context's declared shape, as diagnosis and preflight write it: key -> (type, its fields' types).
_CONTEXT = {"host": (dict, {"cpus": (int, type(None)), "numa_nodes": (int, type(None)), "hostname": (str, type(None)),
                            "gpus": (list, type(None))}),
            "target": (dict, {"pid": (int, type(None)), "cmdline": (str, type(None)), "workers": (list, type(None))}),
            "window": (dict, {"start_unix": (int, float), "seconds": (int, float)}),
            "session_notes": (list, {}), "tiers": (list, {}), "command": (str, {})}


def _check_context(path: str, context: dict[str, Any]) -> None:
    """A context of the wrong shape is refused here, with the key, not found later by a rule."""
    for key, (kind, fields) in _CONTEXT.items():
        if key not in context:
            continue
        v = context[key]
        if not isinstance(v, kind):
            raise BundleError(f"{path}: {INDEX} is malformed (context.{key} must be a {kind.__name__})")
        for f, kinds in fields.items():
            if f in v and (not isinstance(v[f], kinds) or isinstance(v[f], bool)):
                raise BundleError(f"{path}: {INDEX} is malformed (context.{key}.{f} has the wrong type)")
    if not all(isinstance(n, str) for n in context.get("session_notes") or []):
        raise BundleError(f"{path}: {INDEX} is malformed (context.session_notes must be a list of text)")


def load(path: str) -> Bundle:
    """A bundle, a directory or a .tar.gz, from anyone: BundleError (one line) for anything that is
    not one within the caps."""
    if not os.path.exists(path):
        raise BundleError(f"no such bundle: {path}")
    if os.path.isdir(path):
        if not os.path.lexists(os.path.join(path, INDEX)):
            raise BundleError(f"{path} is not a trainprobe bundle (no {INDEX}): save one with `diagnose --save`")
        fd = open_dir(path)
        try:
            return load_at(fd, path)
        finally:
            os.close(fd)
    if not is_archive(path):
        raise BundleError(f"{path} is not a trainprobe bundle (a directory or a .tar.gz)")
    files = _read_archive(path)
    return _from_members(path, files.get)


def load_at(dir_fd: int, path: str) -> Bundle:
    """A directory bundle by its open directory (a job bundle's node bundle is reached this way,
    never through a link); `path` names it in messages."""
    budget = [MAX_TOTAL_BYTES]
    return _from_members(path, lambda name: _read_member(path, dir_fd, name, budget))


def _from_members(path: str, member: Any) -> Bundle:
    values = [MAX_BUNDLE_VALUES]
    raw = member(INDEX)
    if raw is None:
        raise BundleError(f"{path} is not a trainprobe bundle (no {INDEX} inside)")
    index = _json(raw, f"{path}: {INDEX}", values)
    if not isinstance(index, dict) or index.get("schema") != SCHEMA:
        raise BundleError(f"{path}: unknown bundle schema {index.get('schema') if isinstance(index, dict) else None!r}"
                          f" (this trainprobe reads {SCHEMA})")
    names = index.get("captures", [])
    if not isinstance(names, list) or len(names) > MAX_MEMBERS or not all(valid_member(n) for n in names):
        raise BundleError(f"{path}: {INDEX} lists an unsafe or invalid capture name (only captures/<name>.json)")
    if len(set(names)) != len(names):
        raise BundleError(f"{path}: {INDEX} lists a capture twice")
    captures = []
    for name in names:
        data = member(name)
        if data is None:
            raise BundleError(f"{path}: {name} is listed but missing")
        cap = _capture(_json(data, f"{path}: {name}", values), f"{path}: {name}", values)
        # Bundles saved by an older trainprobe, or redaction patterns given now (--redact).
        cap.artifacts = {k: redact.artifact(k, v) for k, v in cap.artifacts.items()}
        cap.provenance = redact.value(cap.provenance)
        captures.append(cap)
    report = None
    data = member("report.json")
    if data is not None:
        try:
            report = redact.value(_json(data, f"{path}: report.json", values))
        except BundleError:
            report = None                       # the live run's report is optional: only compared
        findings = report.get("findings", []) if isinstance(report, dict) else None
        if not isinstance(findings, list) or not all(isinstance(f, dict) and isinstance(f.get("id"), str)
                                                     for f in findings):
            report = None
    context, overhead, notes, tool = (index.get(k) for k in ("context", "overhead", "notes", "tool"))
    if not all(isinstance(x, (dict, type(None))) for x in (context, overhead, tool)) or \
            not isinstance(notes, (list, type(None))):
        raise BundleError(f"{path}: {INDEX} is malformed (context, overhead, tool must be objects, notes a list)")
    _check_context(path, context or {})
    saved, version = index.get("saved_unix"), (tool or {}).get("version")
    return Bundle(captures=captures, context=redact.value(dict(context or {})), overhead=dict(overhead or {}),
                  notes=[str(n) for n in redact.value(list(notes or []))], report=report,
                  saved_unix=saved if isinstance(saved, (int, float)) and not isinstance(saved, bool) else None,
                  tool_version=version if isinstance(version, str) else None, path=path)
