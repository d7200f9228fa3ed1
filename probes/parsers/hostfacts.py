"""Pure parsers of a node's health reads (probes/host.py): /proc/meminfo, /proc/PID/limits, the
/dev/shm mount, kernel-log records, capability masks.

Each is a function of the text (or the JSON-able raw value) the host probe recorded, so the same
parser judges a live host, a captured tree and a replayed preflight bundle. Nothing here decides
whether a value is good: thresholds live in agent/preflight.
"""
from __future__ import annotations

import re
from typing import Any

from trainprobe.probes.errors import parser


# -- memory -----------------------------------------------------------------------------------

@parser("host parse_meminfo")
def parse_meminfo(text: str) -> dict[str, int]:
    """/proc/meminfo -> {field: bytes} (values given in kB are converted; counts stay counts)."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        if ":" not in line:
            continue
        k, v = line.split(":", 1)
        parts = v.split()
        if not parts:
            continue
        try:
            n = int(parts[0])
        except ValueError:
            continue
        out[k.strip()] = n * 1024 if len(parts) > 1 and parts[1] == "kB" else n
    return out


@parser("host parse_size_option")
def parse_size_option(opt: str) -> int | None:
    """tmpfs size= option ('65536k', '64m', '32g', '1234') -> bytes; percentages -> None."""
    m = re.fullmatch(r"(\d+)([kmgtKMGT]?)", opt.strip())
    if not m:
        return None
    mult = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}[m.group(2).lower()]
    return int(m.group(1)) * mult


@parser("host parse_shm")
def parse_shm(raw: dict[str, Any]) -> dict[str, Any]:
    """-> {mounted, fstype, size_bytes, free_bytes, source}. statvfs wins over the mount option."""
    lines = raw.get("mount_lines") or []
    st = raw.get("statvfs")
    if not lines and not st:
        return {"mounted": False, "fstype": None, "size_bytes": None, "free_bytes": None, "source": None}
    fields = lines[-1].split() if lines else []
    fstype = fields[2] if len(fields) > 2 else None
    size = None
    if len(fields) > 3:
        for opt in fields[3].split(","):
            if opt.startswith("size="):
                size = parse_size_option(opt[5:])
    if st:
        return {"mounted": True, "fstype": fstype, "size_bytes": st["total"], "free_bytes": st["avail"],
                "source": "statvfs(/dev/shm)"}
    return {"mounted": bool(lines), "fstype": fstype, "size_bytes": size, "free_bytes": None,
            "source": "/proc/self/mounts size="}



_LIMIT_NAMES = {"Max locked memory": "memlock", "Max open files": "nofile", "Max processes": "nproc",
                "Max stack size": "stack", "Max core file size": "core"}


@parser("host parse_limits")
def parse_limits(text: str) -> dict[str, dict[str, Any]]:
    """-> {memlock: {soft, hard, unit}, nofile: {...}}; 'unlimited' is None."""
    out: dict[str, dict[str, Any]] = {}
    for line in text.splitlines()[1:]:
        for label, key in _LIMIT_NAMES.items():
            if line.startswith(label):
                parts = line[len(label):].split()
                if len(parts) >= 2:
                    def val(s: str) -> int | None:
                        return None if s == "unlimited" else int(s)
                    out[key] = {"soft": val(parts[0]), "hard": val(parts[1]),
                                "unit": parts[2] if len(parts) > 2 else None}
    return out


def bracketed(text: str | None) -> str | None:
    """'always [madvise] never' -> 'madvise'."""
    if not text:
        return None
    m = re.search(r"\[([^\]]+)\]", text)
    return m.group(1) if m else text.strip()



# -- kernel log -------------------------------------------------------------------------------

_KMSG_RE = re.compile(r"^(\d+),(\d+),(\d+),[^;]*;(.*)$")
_XID_RE = re.compile(r"NVRM: Xid \(PCI:([0-9A-Fa-f:.]+)\): (\d+)(?:, (.*))?")
_SXID_RE = re.compile(r"SXid \(PCI:([0-9A-Fa-f:.]+)\): (\d+)")


@parser("host parse_kmsg_line")
def parse_kmsg_line(line: str) -> dict[str, Any] | None:
    m = _KMSG_RE.match(line)
    if not m:
        return None
    return {"priority": int(m.group(1)) & 7, "seq": int(m.group(2)), "usec": int(m.group(3)),
            "text": m.group(4).replace("\\x0a", " ")}


def classify_kernel_events(raw: dict[str, Any]) -> list[dict[str, Any]]:
    """Kernel-log lines -> events {kind, code, device, text, age_s}; kinds: xid, sxid,
    fallen_off_bus, mce, edac_ue, edac_ce, aer_uncorrected, io_error. Pure."""
    uptime = raw.get("uptime_s")
    recs = [r for r in (parse_kmsg_line(ln) for ln in raw.get("lines", [])) if r]
    events: list[dict[str, Any]] = []
    # Newer drivers split "fallen off the bus" across several NVRM records with one timestamp.
    joined: dict[int, str] = {}
    for r in recs:
        if "NVRM" in r["text"]:
            joined[r["usec"]] = (joined.get(r["usec"], "") + " " + r["text"].replace("NVRM:", " ")).strip()

    def age(usec: int) -> float | None:
        return round(uptime - usec / 1e6, 1) if uptime is not None else None

    for r in recs:
        t = r["text"]
        ev: dict[str, Any] | None = None
        m = _XID_RE.search(t)
        if m:
            ev = {"kind": "xid", "code": int(m.group(2)), "device": m.group(1)}
        elif _SXID_RE.search(t):
            m2 = _SXID_RE.search(t)
            ev = {"kind": "sxid", "code": int(m2.group(2)), "device": m2.group(1)}
        elif re.search(r"Machine Check|mce: \[Hardware Error\]", t):
            ev = {"kind": "mce", "code": None, "device": None}
        elif re.search(r"EDAC.*\bUE\b", t):
            ev = {"kind": "edac_ue", "code": None, "device": None}
        elif re.search(r"EDAC.*\bCE\b", t):
            ev = {"kind": "edac_ce", "code": None, "device": None}
        elif re.search(r"AER:.*Uncorrect", t):
            ev = {"kind": "aer_uncorrected", "code": None, "device": (t.split(":", 1)[0] or None)}
        elif re.search(r"I/O error", t):
            ev = {"kind": "io_error", "code": None, "device": None}
        if ev is None and "NVRM" in t:
            whole = re.sub(r"\s+", " ", joined.get(r["usec"], ""))
            if "fallen off the bus" in whole and not any(
                    e["kind"] == "fallen_off_bus" and e["usec"] == r["usec"] for e in events):
                m3 = re.search(r"GPU ([0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.\d)", whole)
                ev = {"kind": "fallen_off_bus", "code": 79, "device": m3.group(1) if m3 else None}
                t = whole
        if ev is not None:
            ev.update({"text": t[:300], "usec": r["usec"], "age_s": age(r["usec"])})
            events.append(ev)
    return events


# -- capabilities -----------------------------------------------------------------------------

CAP_SYS_PTRACE = 19
CAP_SYS_ADMIN = 21
CAP_PERFMON = 38


def has_cap(cap_eff_hex: str | None, cap: int) -> bool:
    try:
        return bool(int(cap_eff_hex or "0", 16) >> cap & 1)
    except ValueError:
        return False
