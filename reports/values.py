"""How every view writes a value: the bottom of reports/ (forms in output.py -> renderers -> here).

- `fmt_value` writes a number, a flag, a missing value, a list or a mapping the same way in the
  terminal, HTML, job and preflight views: yes/no, "-" for none, a share with two decimals, a
  derived figure to 3 significant digits, a speedup as `2.00x`, a mapping as `key value, key value`.
- `short_reason` is the short form of a probe's reason (the terminal's `probes:` line); the long
  one stays in the JSON report.
- `worth_acting` says whether a finding's expected speedup is large enough to act on; a finding
  below that limit is shown muted as "not worth acting on" in every view (the headline's limit).
- `terminal_safe` and `terminal_safe_value` escape control characters in strings from the target.

This module imports nothing from the rest of reports/, so every renderer may import it.
"""
from __future__ import annotations

import re
import textwrap
from typing import Any, Mapping

# A host-side fix below this expected speedup is not worth acting on: the headline's limit
# (agent/ranking.py SMALL_GAIN) and compute.bound's (agent/rules/compute_bound.py WORTH_ACTING),
# the same number; tests/unit/test_report_views.py checks that the three agree.
WORTH_ACTING_X = 1.10
NOT_WORTH_WORDS = "not worth acting on"
SHORT_REASON_CHARS = 60


def _number(v: float) -> str:
    """A number to 3 significant digits, without an exponent below a million."""
    if isinstance(v, int):
        return str(v)
    if v != v or v in (float("inf"), float("-inf")):
        return str(v)
    a = abs(v)
    if a == 0:
        return "0"
    if a < 0.01:
        return f"{v:.2g}"
    if a <= 1.0:
        return f"{v:.2f}"
    if a < 999.5:
        return f"{v:.3g}"
    return f"{v:,.0f}"


def fmt_value(v: Any, unit: str | None = None) -> str:
    """One value as every view writes it: a flag as yes/no, a missing value as "-", a list as its
    items and a mapping as `key value` pairs (each written by this function), a number by its
    `unit`: "%" a share (0.42 -> 42%), "x" a speedup (2.00x), "s" a duration (12.5 ms, 3.20 s),
    none: two decimals up to 1, 3 significant digits below 1000, then whole numbers with
    thousands separators."""
    if isinstance(v, bool):
        return "yes" if v else "no"
    if v is None:
        return "-"
    if isinstance(v, Mapping):
        return ", ".join(f"{k} {_nested(x, unit)}" for k, x in v.items()) or "-"
    if isinstance(v, (list, tuple)):
        return ", ".join(_nested(x, unit) for x in v) or "-"
    if not isinstance(v, (int, float)):
        return str(v)
    if unit == "%":
        return f"{100 * v:.0f}%"
    if unit == "x":
        return f"{v:.2f}x"
    if unit == "s":
        return f"{v * 1000:.1f} ms" if v < 1 else f"{v:.2f} s"
    return _number(v)


def _nested(v: Any, unit: str | None) -> str:
    s = fmt_value(v, unit)
    return f"({s})" if isinstance(v, (Mapping, list, tuple)) and "," in s else s


def slowdown_text(finding: Mapping[str, Any]) -> str:
    """'would slow the job: about 0.70x (0.62-0.79x)' where a finding's fix is expected to cost (its
    `expected_change`, the whole interval below 1.0x), else ''."""
    ch, iv = finding.get("expected_change"), finding.get("expected_change_interval")
    if ch is None:
        return ""
    return f"would slow the job: about {float(ch):.2f}x" + (f" ({fmt_interval(iv)})" if iv else "")


def fmt_interval(iv: Any) -> str:
    """An expected speedup's interval, as `3.11-12.93x` (the digits of `fmt_value(x, "x")`)."""
    try:
        lo, hi = float(iv[0]), float(iv[1])
    except (TypeError, ValueError, IndexError, KeyError):
        return "-"
    return f"{lo:.2f}-{hi:.2f}x"


def worth_acting(finding: Mapping[str, Any]) -> bool:
    """Whether a finding's fix is expected to gain at least WORTH_ACTING_X (compute.bound, a
    verdict with no fix, counts as worth showing as it is)."""
    if finding.get("id") == "compute.bound":
        return True
    try:
        return float(finding.get("expected_speedup") or 1.0) >= WORTH_ACTING_X
    except (TypeError, ValueError):
        return True


# A reason's first clause ends at the first of these (a colon that introduces the remedy, a
# parenthesis with details, a semicolon that adds a second fact).
_CLAUSE_END = re.compile(r":\s|\s\(|;\s|\.\s")


def short_reason(probe: Mapping[str, Any]) -> str | None:
    """A probe's reason in a few words: its own `short_reason` when it gives one, else the first
    clause of `reason` (`perf not found on PATH: install perf (Debian: ...)` -> `perf not found on
    PATH`), at most SHORT_REASON_CHARS characters."""
    s = probe.get("short_reason") or probe.get("reason")
    if not s:
        return None
    s = " ".join(str(s).split())
    if not probe.get("short_reason"):
        m = _CLAUSE_END.search(s, 8)
        if m:
            s = s[:m.start()]
    return textwrap.shorten(s, SHORT_REASON_CHARS, placeholder=" ...")


# -- the terminal --------------------------------------------------------------------------------
# Target-controlled strings (argv, thread names, frame names, file names) may hold ANSI escapes or
# control characters that would move the cursor, rewrite earlier lines or retitle the terminal.
# They are shown escaped (`\x1b`), along with C1 controls, Unicode bidirectional overrides and lone
# surrogates (which no UTF-8 stream can carry).
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
_CONTROL_NL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff\n]")
# Fields whose text the rules write over several lines (code to change, a wrapper script).
MULTILINE_FIELDS = frozenset({"change", "command", "script"})


def _esc(m: re.Match[str]) -> str:
    c = m.group(0)
    return {"\n": "\\n", "\t": "\\t", "\r": "\\r"}.get(c) or (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")


def terminal_safe(s: str, multiline: bool = False) -> str:
    """`s` with control characters and escapes shown escaped (newlines kept when `multiline`)."""
    if not isinstance(s, str):
        return s
    return (_CONTROL if multiline else _CONTROL_NL).sub(_esc, s)


def terminal_safe_value(obj: Any, key: str | None = None) -> Any:
    """terminal_safe applied to every string of a report (and to its keys)."""
    if isinstance(obj, str):
        return terminal_safe(obj, multiline=key in MULTILINE_FIELDS)
    if isinstance(obj, dict):
        return {terminal_safe(k) if isinstance(k, str) else k: terminal_safe_value(v, k if isinstance(k, str) else None)
                for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [terminal_safe_value(v, key) for v in obj]
    return obj


def encode_text(s: str) -> bytes:
    """A text form as UTF-8 bytes; a lone surrogate (a name from a file system or a profile that
    was not valid UTF-8) is written as a visible `\\udcxx` escape instead of failing the write."""
    return s.encode("utf-8", "backslashreplace")


def printable(s: str, encoding: str | None) -> str:
    """`s` as a stream of `encoding` can write it: what the encoding cannot carry (a lone surrogate
    in UTF-8; anything outside ASCII on an ASCII terminal) becomes a visible backslash escape."""
    enc = encoding or "utf-8"
    try:
        s.encode(enc)
        return s
    except (UnicodeEncodeError, LookupError):
        try:
            return s.encode(enc, "backslashreplace").decode(enc)
        except LookupError:
            return encode_text(s).decode("utf-8")
