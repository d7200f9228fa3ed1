"""The few environment variables trainprobe reads from a target, parsed as the untrusted input they are.

A job's user sets its own environment: LOCAL_RANK may be `-1`, `1e9` or ten kilobytes of digits,
SLURM_JOB_ID may be `../../etc/x` or hold a newline, CUDA_VISIBLE_DEVICES may list ten thousand
entries. Every value is parsed here, once, into something bounded and validated, or into
"unknown"; none reaches a path, a label or a printed command as the target wrote it.

- Ranks, local ranks and world sizes: ASCII digits only, below RANK_LIMIT.
- SLURM_JOB_ID: digits only (Slurm's job ids; an array task's own id is one too).
- CUDA_VISIBLE_DEVICES: read the way CUDA reads it, entry by entry up to the first one that names
  no device (CUDA ignores that one and every one after it), at most MAX_VISIBLE_DEVICES.
- Anything else (a node name): a token of [A-Za-z0-9._-], bounded.
"""
from __future__ import annotations

import re

UNKNOWN = "unknown"
RANK_LIMIT = 1 << 20                 # far above any real world size; a larger value is not a rank
MAX_VISIBLE_DEVICES = 64
MAX_TOKEN = 64
_SCAN_LIMIT = 4096                   # characters of a value ever looked at

RANK_KEYS = frozenset({"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "SLURM_PROCID", "SLURM_LOCALID",
                       "SLURM_NODEID", "SLURM_NTASKS"})
_JOB_ID = re.compile(r"[0-9]{1,20}")
# One entry of CUDA_VISIBLE_DEVICES: an ordinal, a (prefix of a) GPU UUID, a MIG device.
_DEVICE = re.compile(r"[0-9]{1,4}|GPU-[0-9A-Fa-f-]{1,36}|MIG-[0-9A-Za-z/-]{1,96}")
_PLAIN_CVD = re.compile(r"[0-9A-Za-z,/ _-]{0,256}")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def rank(value: str | None) -> int | None:
    """A rank, local rank or world size; None when absent or not a plain number below RANK_LIMIT."""
    if value is None:
        return None
    s = str(value)[:16].strip()
    if not s or len(s) > 7 or not (s.isascii() and s.isdigit()):
        return None
    n = int(s)
    return n if n < RANK_LIMIT else None


def slurm_job_id(value: str | None) -> str | None:
    """SLURM_JOB_ID: None when absent, the id when it is one, else "unknown"."""
    if value is None:
        return None
    s = str(value)[:32].strip()
    return s if _JOB_ID.fullmatch(s) else UNKNOWN


def token(value: object, max_len: int = MAX_TOKEN, fallback: str = UNKNOWN) -> str:
    """Any value as a token safe in a file name, a label and a terminal: characters outside
    [A-Za-z0-9._-] become "_", no leading dot or dash (no "..", no option), at most `max_len`."""
    s = _UNSAFE.sub("_", str(value)[:max_len]).lstrip(".-")
    return s or fallback


def visible_devices(value: str | None) -> list[str] | None:
    """CUDA_VISIBLE_DEVICES as CUDA reads it: None when unset; else its entries up to the first one
    that names no device (`-1`, `none`, garbage: CUDA sees nothing from there on), at most
    MAX_VISIBLE_DEVICES. [] means the process sees no GPU."""
    if value is None:
        return None
    out: list[str] = []
    for entry in str(value)[:_SCAN_LIMIT].split(","):
        entry = entry.strip()
        if not _DEVICE.fullmatch(entry):
            break
        out.append(entry)
        if len(out) >= MAX_VISIBLE_DEVICES:
            break
    return out


def cuda_visible_devices(value: str | None) -> str | None:
    """CUDA_VISIBLE_DEVICES to keep and show: as written when it is short and plain (`0,1`, `-1`,
    `GPU-6e4e17a9`), else the entries CUDA would use, joined."""
    if value is None:
        return None
    s = str(value)
    if _PLAIN_CVD.fullmatch(s):
        return s.strip()
    return ",".join(visible_devices(s) or [])


def normalize(name: str, value: str) -> str:
    """One variable read from a target's environ, in the bounded form kept in evidence."""
    if name in RANK_KEYS:
        n = rank(value)
        return UNKNOWN if n is None else str(n)
    if name == "SLURM_JOB_ID":
        return slurm_job_id(value) or UNKNOWN
    if name == "CUDA_VISIBLE_DEVICES":
        return cuda_visible_devices(value) or ""
    return token(value, max_len=255)
