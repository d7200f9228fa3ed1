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

import io
import json
import os
import re
import stat
import tarfile
import time
import zlib
from dataclasses import dataclass, field
from typing import Any

from trainprobe.agent import __version__
from trainprobe.probes.parsers import redact
from trainprobe.probes.base import Capture

SCHEMA = "trainprobe.bundle/1"
INDEX = "bundle.json"
ARCHIVE_SUFFIXES = (".tar.gz", ".tgz")
# A bundle comes from another machine or another user: untrusted. Its members are read in memory,
# so their sizes are capped (a gzip bomb stops at the cap, with a clear error).
MAX_MEMBER_BYTES = 256 << 20
MAX_TOTAL_BYTES = 1 << 30
MAX_MEMBERS = 512
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
    """Every regular file of the archive, by its path below the bundle's top folder (read in
    memory: nothing is extracted to disk, so member names cannot escape anywhere). Links and
    other special members are ignored; sizes are capped."""
    out: dict[str, bytes] = {}
    try:
        with tarfile.open(path, "r:gz") as tar:
            members = []
            total = 0
            for n, m in enumerate(tar):
                if n >= MAX_MEMBERS:
                    raise BundleError(f"{path}: more than {MAX_MEMBERS} members: not a trainprobe bundle")
                if m.name.startswith("/") or ".." in m.name.split("/"):
                    raise BundleError(f"{path}: unsafe member name {m.name!r} (absolute or with ..)")
                if not m.isfile():
                    continue
                if m.size > MAX_MEMBER_BYTES:
                    raise BundleError(f"{path}: {m.name} is larger than {MAX_MEMBER_BYTES >> 20} MiB")
                total += m.size
                if total > MAX_TOTAL_BYTES:
                    raise BundleError(f"{path}: larger than {MAX_TOTAL_BYTES >> 20} MiB in all")
                members.append(m)
            index = [m for m in members if m.name.rstrip("/").split("/")[-1] == INDEX]
            if not index:
                raise BundleError(f"{path} is not a trainprobe bundle (no {INDEX} inside)")
            prefix = index[0].name[: -len(INDEX)]
            for m in members:
                if not m.name.startswith(prefix) or not valid_member(m.name[len(prefix):]):
                    continue
                fh = tar.extractfile(m)
                if fh is not None:
                    out[m.name[len(prefix):]] = fh.read(MAX_MEMBER_BYTES + 1)
    except (tarfile.TarError, EOFError, OSError, zlib.error) as exc:
        why = " ".join(str(exc).split()) or type(exc).__name__
        raise BundleError(f"cannot read the bundle {path} (a gzip-compressed tar archive): {why}") from None
    return out


def _read_member(path: str, name: str, budget: list[int]) -> bytes | None:
    """One member of a directory bundle: a regular file reached without following a link."""
    if not valid_member(name):
        raise BundleError(f"{path}: unsafe member name {name!r} in {INDEX} (only captures/<name>.json)")
    d = path
    for comp in name.split("/")[:-1]:
        d = os.path.join(d, comp)
        if os.path.islink(d) or not os.path.isdir(d):
            raise BundleError(f"{path}: {comp}/ is a link or not a directory")
    full = os.path.join(path, name)
    try:
        fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise BundleError(f"{path}: cannot open {name}: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise BundleError(f"{path}: {name} is not a regular file")
        if st.st_size > MAX_MEMBER_BYTES:
            raise BundleError(f"{path}: {name} is larger than {MAX_MEMBER_BYTES >> 20} MiB")
        budget[0] -= st.st_size
        if budget[0] < 0:
            raise BundleError(f"{path}: larger than {MAX_TOTAL_BYTES >> 20} MiB in all")
        with os.fdopen(fd, "rb") as fh:
            fd = -1
            return fh.read(MAX_MEMBER_BYTES + 1)
    finally:
        if fd >= 0:
            os.close(fd)


def _read_dir(path: str, names: list[str] | None = None, budget: list[int] | None = None) -> dict[str, bytes]:
    budget = budget if budget is not None else [MAX_TOTAL_BYTES]
    out: dict[str, bytes] = {}
    for name in [INDEX] + (names or []):
        data = _read_member(path, name, budget)
        if data is not None:
            out[name] = data
    return out


def load(path: str) -> Bundle:
    if not os.path.exists(path):
        raise BundleError(f"no such bundle: {path}")
    if os.path.isdir(path):
        if not os.path.isfile(os.path.join(path, INDEX)):
            raise BundleError(f"{path} is not a trainprobe bundle (no {INDEX}): save one with `diagnose --save`")
        try:
            budget = [MAX_TOTAL_BYTES]
            files = _read_dir(path, budget=budget)
            index = json.loads(files[INDEX])
            names = index.get("captures", []) if isinstance(index, dict) else []
            if not isinstance(names, list) or len(names) > MAX_MEMBERS:
                raise BundleError(f"{path}: {INDEX} lists no valid captures")
            files.update(_read_dir(path, list(names) + ["report.json"], budget))
        except (OSError, ValueError, RecursionError, KeyError) as exc:
            raise BundleError(f"cannot read the bundle {path}: {exc}") from None
    else:
        if not is_archive(path):
            raise BundleError(f"{path} is not a trainprobe bundle (a directory or a .tar.gz)")
        files = _read_archive(path)
        try:
            index = json.loads(files[INDEX])
        except (ValueError, RecursionError, KeyError) as exc:
            raise BundleError(f"cannot read the bundle {path}: {INDEX}: {exc}") from None
    if not isinstance(index, dict) or index.get("schema") != SCHEMA:
        raise BundleError(f"{path}: unknown bundle schema {index.get('schema') if isinstance(index, dict) else None!r}"
                          f" (this trainprobe reads {SCHEMA})")
    names = index.get("captures", [])
    if not isinstance(names, list) or not all(valid_member(n) for n in names):
        raise BundleError(f"{path}: {INDEX} lists an unsafe or invalid capture name (only captures/<name>.json)")
    captures = []
    for name in names:
        if name not in files:
            raise BundleError(f"{path}: {name} is listed but missing")
        try:
            doc = json.loads(files[name])
            if not isinstance(doc, dict) or not isinstance(doc.get("artifacts", {}), dict):
                raise TypeError("not a JSON object with artifacts")
            cap = Capture.from_dict(doc)
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
            raise BundleError(f"{path}: {name} is not a capture: {exc}") from None
        # Bundles saved by an older trainprobe, or redaction patterns given now (--redact).
        cap.artifacts = {k: redact.artifact(k, v) if isinstance(v, str) else v for k, v in cap.artifacts.items()}
        cap.provenance = redact.value(cap.provenance)
        captures.append(cap)
    report = None
    if "report.json" in files:
        try:
            report = redact.value(json.loads(files["report.json"]))
        except (ValueError, RecursionError):
            report = None
    context, overhead, notes, tool = (index.get(k) for k in ("context", "overhead", "notes", "tool"))
    if not all(isinstance(x, (dict, type(None))) for x in (context, overhead, tool)) or \
            not isinstance(notes, (list, type(None))):
        raise BundleError(f"{path}: {INDEX} is malformed (context, overhead, tool must be objects, notes a list)")
    return Bundle(captures=captures, context=redact.value(dict(context or {})), overhead=dict(overhead or {}),
                  notes=[str(n) for n in redact.value(list(notes or []))], report=report,
                  saved_unix=index.get("saved_unix"), tool_version=(tool or {}).get("version"), path=path)
