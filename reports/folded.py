"""Brendan Gregg's folded ("collapsed") stack format: one line per distinct stack, frames root first
and separated by `;`, then a space and an integer count.

A profile here is a plain mapping {folded stack: count}. Counts are integers (speedscope's
importer accepts nothing else); trainprobe's own counts are microseconds of wall-clock time. A line
with two trailing numbers is the differential form (`stack before after`) that difffolded.pl
writes and flamegraph.pl reads.
"""
from __future__ import annotations

import re
from typing import Iterable, Mapping, TextIO

Profile = Mapping[str, int]
GROUPS = ("function", "line")       # how frames are told apart: by function, or by function and line
_LINE = re.compile(r"^(.* \([^()]*):\d+\)$")

class FoldedError(ValueError):
    """The text is not in the folded format."""


def clean_frame(name: str) -> str:
    """A frame name that cannot break the format: no `;`, no line break."""
    return name.replace(";", ":").replace("\r", " ").replace("\n", " ")


def _digits(s: str) -> bool:
    """ASCII digits only: str.isdigit() also accepts superscripts such as '¹', which int() refuses."""
    return s.isascii() and s.isdigit()


def _is_count(s: str) -> bool:
    if _digits(s):
        return True
    a, dot, b = s.partition(".")
    return bool(dot) and _digits(a) and _digits(b)


def _count(s: str) -> int:
    return int(s) if _digits(s) else int(round(float(s)))


def _split(line: str) -> tuple[str, str | None, str] | None:
    """`stack [before] count` -> (stack, before or None, count), splitting from the right (in C:
    a line can hold a kilobyte of frames)."""
    parts = line.rsplit(None, 1)
    if len(parts) == 1 and _is_count(parts[0]):
        return "", None, parts[0]            # an empty stack: time at the root itself
    if len(parts) != 2 or not _is_count(parts[1]):
        return None
    head = parts[0].rsplit(None, 1)
    if len(head) == 2 and _is_count(head[1]):
        return head[0], head[1], parts[1]
    return parts[0], None, parts[1]


def parse(text: str | Iterable[str]) -> dict[str, int]:
    """Folded text -> {stack: count}; repeated stacks add up. Decimal counts are rounded.

    A two-count (differential) line contributes its second count, the profile it was sized by.
    Blank lines are skipped; any other line that does not end in a count is an error.
    """
    lines = text.splitlines() if isinstance(text, str) else text
    out: dict[str, int] = {}
    for no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        got = _split(line)
        if got is None:
            raise FoldedError(f"line {no} is not `frame;frame;... COUNT`: {line.rstrip()[:80]!r}")
        stack, _before, n_s = got
        n = _count(n_s)
        if n:
            out[stack] = out.get(stack, 0) + n
    return out


def parse_diff(text: str) -> tuple[dict[str, int], dict[str, int]]:
    """Two-count folded text (`stack before after`) -> (before, after)."""
    before: dict[str, int] = {}
    after: dict[str, int] = {}
    for no, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        got = _split(line)
        if got is None or got[1] is None:
            raise FoldedError(f"line {no} is not `frame;frame;... BEFORE AFTER`: {line.rstrip()[:80]!r}")
        stack, a_s, b_s = got
        a, b = _count(a_s), _count(b_s)  # type: ignore[arg-type]
        if a:
            before[stack] = before.get(stack, 0) + a
        if b:
            after[stack] = after.get(stack, 0) + b
    return before, after


def dumps(profile: Profile) -> str:
    """{stack: count} -> folded text, one line per stack, sorted (so equal profiles give equal text)."""
    return "".join(f"{stack} {int(n)}\n" for stack, n in sorted(profile.items()) if n > 0)


def dumps_diff(before: Profile, after: Profile) -> str:
    """The differential form: every stack of either profile with both counts (0 where absent)."""
    keys = sorted(set(before) | set(after))
    return "".join(f"{k} {int(before.get(k, 0))} {int(after.get(k, 0))}\n" for k in keys)


def function_label(label: str) -> str:
    """`name (path.py:LINE)` -> `name (path.py)`: a Python frame without its line number (as py-spy's
    --nolineno); any other frame as it is."""
    m = _LINE.match(label)
    return m.group(1) + ")" if m else label


def group(profile: Profile, by: str = "function") -> dict[str, int]:
    """`profile` with frames told apart `by` "function" (the lines of one function merge into one
    frame, their counts added) or by "line" (as sampled: one frame per line number)."""
    if by == "line":
        return dict(profile)
    if by != "function":
        raise ValueError(f"group must be one of {', '.join(GROUPS)}")
    out: dict[str, int] = {}
    memo: dict[str, str] = {}
    for stack, n in profile.items():
        key = memo.get(stack)
        if key is None:
            key = memo[stack] = ";".join(function_label(f) for f in stack.split(";")) if stack else stack
        out[key] = out.get(key, 0) + n
    return out


def write(profile: Profile, stream: TextIO) -> None:
    stream.write(dumps(profile))


def total(profile: Profile) -> int:
    return sum(profile.values())
