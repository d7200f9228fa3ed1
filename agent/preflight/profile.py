"""Profiles: a node type's expectations, as data (TOML or JSON) merged over profiles/default.toml."""
from __future__ import annotations

import copy
import fnmatch
import json
import os
from typing import Any

from trainprobe.agent.inputs import open_input
from trainprobe.probes.errors import BadInput

PROFILE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "profiles")
# Sections whose keys are free-form (a table of names), not a fixed schema.
OPEN_TABLES = {("active", "peak_bf16_tflops")}


def _load_toml(path: str) -> dict[str, Any]:
    try:
        import tomllib  # noqa: PLC0415 - Python 3.11+
    except ImportError:
        try:
            import tomli as tomllib  # type: ignore[no-redef]  # noqa: PLC0415
        except ImportError:
            raise BadInput(f"{path}: reading TOML needs Python 3.11+ or `pip install tomli`; "
                           "a JSON profile works everywhere") from None
    try:
        with open_input(path) as fh:
            return tomllib.load(fh)
    except tomllib.TOMLDecodeError as exc:
        raise BadInput(f"{path}: not valid TOML: {exc}") from None


def load_file(path: str) -> dict[str, Any]:
    try:
        if path.endswith(".json"):
            with open_input(path) as fh:
                try:
                    return json.load(fh)
                except json.JSONDecodeError as exc:
                    raise BadInput(f"{path}: not valid JSON: {exc}") from None
        return _load_toml(path)
    except OSError as exc:
        raise BadInput(f"cannot read profile {path}: {exc.strerror}") from None


def available() -> list[str]:
    return sorted(os.path.splitext(f)[0] for f in os.listdir(PROFILE_DIR) if f.endswith((".toml", ".json")))


def resolve(name_or_path: str | None) -> str:
    """A profile name (profiles/NAME.toml|json) or a file path -> the file to read."""
    if not name_or_path:
        return os.path.join(PROFILE_DIR, "default.toml")
    if os.path.sep in name_or_path or name_or_path.endswith((".toml", ".json")) or os.path.exists(name_or_path):
        if not os.path.exists(name_or_path):
            raise BadInput(f"no profile file {name_or_path}")
        return name_or_path
    for ext in (".toml", ".json"):
        p = os.path.join(PROFILE_DIR, name_or_path + ext)
        if os.path.exists(p):
            return p
    raise BadInput(f"no profile named {name_or_path!r}; built in: {', '.join(available())} (or give a file)")


def _same_kind(default: Any, value: Any) -> bool:
    if isinstance(default, bool) or isinstance(value, bool):
        return isinstance(default, bool) and isinstance(value, bool)
    if isinstance(default, (int, float)):
        return isinstance(value, (int, float))
    return isinstance(value, type(default))


def merge(base: dict[str, Any], over: dict[str, Any], where: str, path: tuple[str, ...] = ()) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in over.items():
        key_path = path + (k,)
        dotted = ".".join(key_path)
        if path in OPEN_TABLES:
            out[k] = v
            continue
        if k not in base:
            raise BadInput(f"{where}: unknown profile key {dotted!r}")
        if isinstance(base[k], dict):
            if not isinstance(v, dict):
                raise BadInput(f"{where}: {dotted} must be a table")
            out[k] = merge(base[k], v, where, key_path)
        elif not _same_kind(base[k], v):
            raise BadInput(f"{where}: {dotted} = {v!r}: expected a {type(base[k]).__name__}")
        else:
            out[k] = v
    return out


def load(name_or_path: str | None = None) -> dict[str, Any]:
    """The default profile, overridden by the one named (or given as a file)."""
    default_path = os.path.join(PROFILE_DIR, "default.toml")
    base = load_file(default_path)
    path = resolve(name_or_path)
    prof = base if os.path.abspath(path) == default_path else merge(base, load_file(path), path)
    prof["source"] = path
    _validate(prof, path)
    return prof


def _validate(p: dict[str, Any], where: str) -> None:
    for key, allowed in (("host.memlock_status", ("warn", "critical")), ("gpu.busy_status", ("warn", "critical")),
                         ("host.swap", ("any", "off"))):
        sec, k = key.split(".")
        if p[sec][k] not in allowed:
            raise BadInput(f"{where}: {key} = {p[sec][k]!r}: one of {', '.join(allowed)}")


def matches(check_id: str, patterns: list[str]) -> bool:
    """'trainprobe.*' matches 'trainprobe.btf'; 'gpu' matches every 'gpu.*' check; ids match exactly."""
    for pat in patterns:
        if check_id == pat or fnmatch.fnmatchcase(check_id, pat) or check_id.startswith(pat.rstrip(".") + "."):
            return True
    return False
