"""speedscope's JSON file format (https://www.speedscope.app/file-format-schema.json): sampled profiles.

One file holds a list of frames shared by all its profiles and, per profile, the stacks as lists
of frame indices (root first) with one weight each. A Python frame label `name (path.py:LINE)`
becomes {"name", "file", "line"}, so speedscope can show where each frame lives.
"""
from __future__ import annotations

import json
import re
from typing import Any, Mapping, Sequence, TextIO

SCHEMA = "https://www.speedscope.app/file-format-schema.json"
UNITS = ("none", "nanoseconds", "microseconds", "milliseconds", "seconds", "bytes")
UNIT_NAMES = {"ns": "nanoseconds", "us": "microseconds", "ms": "milliseconds", "s": "seconds"}
_PY_FRAME = re.compile(r"^(.*) \(([^()]*):(\d+)\)$")
_PY_FUNCTION = re.compile(r"^(.*) \(([^()]*\.pyw?|<[^()]*>)\)$")     # grouped by function: no line


def frame_of(label: str) -> dict[str, Any]:
    m = _PY_FRAME.match(label)
    if m:
        return {"name": m.group(1), "file": m.group(2), "line": int(m.group(3))}
    m = _PY_FUNCTION.match(label)
    if m:
        return {"name": m.group(1), "file": m.group(2)}
    return {"name": label}


def label_of(frame: Mapping[str, Any]) -> str:
    name = str(frame.get("name", "")).replace(";", ":")
    if frame.get("file") and frame.get("line") is None:
        return f"{name} ({frame['file']})".replace("\n", " ")
    if frame.get("file"):
        return f"{name} ({frame['file']}:{int(frame.get('line') or 0)})".replace("\n", " ")
    return name.replace("\n", " ")


def _is_pseudo(frame: str) -> bool:
    return frame.startswith(("process ", "thread ("))


def split_by_root(profile: Mapping[str, int]) -> list[tuple[str, dict[str, int]]]:
    """One profile per process/thread root (speedscope shows one at a time), roots stripped."""
    groups: dict[str, dict[str, int]] = {}
    for key, n in profile.items():
        parts = key.split(";")
        i = 0
        while i < len(parts) and _is_pseudo(parts[i]):
            i += 1
        name = " / ".join(parts[:i]) or "all threads"
        rest = ";".join(parts[i:])
        g = groups.setdefault(name, {})
        g[rest] = g.get(rest, 0) + n
    return sorted(groups.items())


def document(profiles: Sequence[tuple[str, Mapping[str, int]]], name: str = "trainprobe profile",
             unit: str = "microseconds", exporter: str = "trainprobe") -> dict[str, Any]:
    """[(profile name, {folded stack: weight}), ...] -> a speedscope file (a dict ready for json)."""
    if unit not in UNITS:
        raise ValueError(f"unit must be one of {UNITS}")
    frames: list[dict[str, Any]] = []
    index: dict[str, int] = {}
    out_profiles = []
    for pname, prof in profiles:
        samples: list[list[int]] = []
        weights: list[int] = []
        for stack, w in sorted(prof.items()):
            if w <= 0:
                continue
            ids = []
            for lab in stack.split(";") if stack else []:
                i = index.get(lab)
                if i is None:
                    i = index[lab] = len(frames)
                    frames.append(frame_of(lab))
                ids.append(i)
            if not ids:
                continue            # no frame to show (the time a thread had no Python frame)
            samples.append(ids)
            weights.append(int(w))
        out_profiles.append({"type": "sampled", "name": pname, "unit": unit, "startValue": 0,
                             "endValue": sum(weights), "samples": samples, "weights": weights})
    return {"$schema": SCHEMA, "shared": {"frames": frames}, "profiles": out_profiles, "name": name,
            "activeProfileIndex": 0, "exporter": exporter}


def write(profiles: Sequence[tuple[str, Mapping[str, int]]], stream: TextIO, **kw: Any) -> None:
    json.dump(document(profiles, **kw), stream, separators=(",", ":"))
    stream.write("\n")


def read(doc: Mapping[str, Any], path_label=None) -> list[tuple[str, dict[str, int], str]]:
    """A speedscope file -> [(profile name, {folded stack: weight}, unit)] for its sampled profiles.

    `path_label` may rewrite each frame's file before it becomes a label (to match the labels of
    another profile). Evented profiles are folded by summing the time each stack was open.
    """
    if doc.get("$schema") != SCHEMA:
        raise ValueError("not a speedscope file (no $schema " + SCHEMA + ")")
    shared = doc.get("shared", {}).get("frames", [])
    labels = []
    for fr in shared:
        fr = dict(fr)
        if path_label and fr.get("file"):
            fr["file"] = path_label(fr["file"])
        labels.append(label_of(fr))
    out = []
    for p in doc.get("profiles", []):
        prof: dict[str, int] = {}
        if p.get("type") == "sampled":
            for stack, w in zip(p.get("samples", []), p.get("weights", [])):
                key = ";".join(labels[i] for i in stack)
                prof[key] = prof.get(key, 0) + int(round(w))
        elif p.get("type") == "evented":
            opened: list[int] = []
            last = p.get("startValue", 0)
            for ev in p.get("events", []):
                at = ev["at"]
                if opened and at > last:
                    key = ";".join(labels[i] for i in opened)
                    prof[key] = prof.get(key, 0) + int(round(at - last))
                last = at
                if ev["type"] == "O":
                    opened.append(ev["frame"])
                elif opened:
                    opened.pop()
        out.append((str(p.get("name", "")), prof, str(p.get("unit", "none"))))
    return out
