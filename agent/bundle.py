"""Bundles: the raw evidence of one diagnosis, saved so it can be re-diagnosed offline.

A bundle holds every probe's Capture (raw text and provenance, as Capture.to_dict()), the
diagnosis context (host, target, window), the overhead and notes of the live run, and the report
the live run printed. `trainprobe report BUNDLE` re-runs the parsers and the rules on the
captures (agent.diagnosis.report_from), so the same findings come back on another machine.

Layout, as a directory or inside a .tar.gz (under one top folder):
    bundle.json            schema, tool, saved_unix, context, overhead, notes, captures (file names)
    captures/<probe>.json  Capture.to_dict() of each probe, skipped and failed ones included
    report.json            the report of the live run
"""
from __future__ import annotations

import io
import json
import os
import tarfile
import tempfile
import time
import zlib
from dataclasses import dataclass, field
from typing import Any

from agent import __version__
from probes.base import Capture

SCHEMA = "trainprobe.bundle/1"
INDEX = "bundle.json"
ARCHIVE_SUFFIXES = (".tar.gz", ".tgz")
MAX_MEMBER_BYTES = 2 << 30


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
    """Write a bundle (a directory, or a .tar.gz when the path says so). Returns the path."""
    check_target(path)
    files = _files(captures, context, report)
    try:
        if is_archive(path):
            top = os.path.basename(path)
            for suf in ARCHIVE_SUFFIXES:
                if top.endswith(suf):
                    top = top[: -len(suf)]
            fd, tmp = tempfile.mkstemp(prefix=".trainprobe-", suffix=".tar.gz", dir=os.path.dirname(os.path.abspath(path)))
            os.close(fd)
            try:
                with tarfile.open(tmp, "w:gz") as tar:
                    now = time.time()
                    for name, data in files.items():
                        info = tarfile.TarInfo(f"{top or 'bundle'}/{name}")
                        info.size, info.mtime, info.mode = len(data), now, 0o644
                        tar.addfile(info, io.BytesIO(data))
                mask = os.umask(0)
                os.umask(mask)
                os.chmod(tmp, 0o666 & ~mask)
                os.replace(tmp, path)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
        else:
            os.makedirs(os.path.join(path, "captures"), exist_ok=True)
            for old in os.listdir(os.path.join(path, "captures")):
                if old.endswith(".json"):
                    os.unlink(os.path.join(path, "captures", old))
            for name, data in sorted(files.items(), key=lambda kv: kv[0] == INDEX):  # the index last
                tmp = os.path.join(path, name + ".tmp")
                with open(tmp, "wb") as fh:
                    fh.write(data)
                os.replace(tmp, os.path.join(path, name))
    except OSError as exc:
        raise BundleError(f"cannot save the bundle to {path}: {exc.strerror or exc}") from None
    return path


def _read_archive(path: str) -> dict[str, bytes]:
    """Every regular file of the archive, by its path below the bundle's top folder (read in
    memory: nothing is extracted to disk, so member names cannot escape anywhere)."""
    out: dict[str, bytes] = {}
    try:
        with tarfile.open(path, "r:gz") as tar:
            members = [m for m in tar.getmembers() if m.isfile()]
            index = [m for m in members if m.name.rstrip("/").split("/")[-1] == INDEX]
            if not index:
                raise BundleError(f"{path} is not a trainprobe bundle (no {INDEX} inside)")
            prefix = index[0].name[: -len(INDEX)]
            for m in members:
                if not m.name.startswith(prefix):
                    continue
                if m.size > MAX_MEMBER_BYTES:
                    raise BundleError(f"{path}: {m.name} is larger than {MAX_MEMBER_BYTES >> 20} MiB")
                fh = tar.extractfile(m)
                if fh is not None:
                    out[m.name[len(prefix):]] = fh.read()
    except (tarfile.TarError, EOFError, OSError, zlib.error) as exc:
        why = " ".join(str(exc).split()) or type(exc).__name__
        raise BundleError(f"cannot read the bundle {path} (a gzip-compressed tar archive): {why}") from None
    return out


def _read_dir(path: str, names: list[str] | None = None) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    for name in [INDEX] + (names or []):
        full = os.path.join(path, name)
        if os.path.isfile(full):
            with open(full, "rb") as fh:
                out[name] = fh.read()
    return out


def load(path: str) -> Bundle:
    if not os.path.exists(path):
        raise BundleError(f"no such bundle: {path}")
    if os.path.isdir(path):
        if not os.path.isfile(os.path.join(path, INDEX)):
            raise BundleError(f"{path} is not a trainprobe bundle (no {INDEX}): save one with `diagnose --save`")
        try:
            files = _read_dir(path)
            index = json.loads(files[INDEX])
            files.update(_read_dir(path, list(index.get("captures", [])) + ["report.json"]))
        except (OSError, ValueError) as exc:
            raise BundleError(f"cannot read the bundle {path}: {exc}") from None
    else:
        if not is_archive(path):
            raise BundleError(f"{path} is not a trainprobe bundle (a directory or a .tar.gz)")
        files = _read_archive(path)
        try:
            index = json.loads(files[INDEX])
        except ValueError as exc:
            raise BundleError(f"cannot read the bundle {path}: {INDEX}: {exc}") from None
    if not isinstance(index, dict) or index.get("schema") != SCHEMA:
        raise BundleError(f"{path}: unknown bundle schema {index.get('schema') if isinstance(index, dict) else None!r}"
                          f" (this trainprobe reads {SCHEMA})")
    captures = []
    for name in index.get("captures", []):
        if name not in files:
            raise BundleError(f"{path}: {name} is listed but missing")
        try:
            captures.append(Capture.from_dict(json.loads(files[name])))
        except (ValueError, KeyError, TypeError) as exc:
            raise BundleError(f"{path}: {name} is not a capture: {exc}") from None
    report = None
    if "report.json" in files:
        try:
            report = json.loads(files["report.json"])
        except ValueError:
            report = None
    return Bundle(captures=captures, context=dict(index.get("context") or {}), overhead=dict(index.get("overhead") or {}),
                  notes=list(index.get("notes") or []), report=report, saved_unix=index.get("saved_unix"),
                  tool_version=(index.get("tool") or {}).get("version"), path=path)
