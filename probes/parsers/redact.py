"""Redaction of secrets in what the target hands over (argv, environment, thread and frame names).

Applied where the data enters trainprobe (procfs.parse_cmdline/parse_argv, every artifact a probe
records through its Recorder, every provenance line), and once more where anything leaves it
(reports.output, the terminal renderer), so no renderer ever sees a secret:

- the value of an option or `NAME=value` pair whose name looks like a credential (key, token,
  secret, password, passwd, pwd, auth, credential, cookie; any case, `-` or `_`):
  `--api-key=XYZ`, `--hf-token XYZ`, `password=XYZ`, `DB_PASSWORD=XYZ`, `api_key = "XYZ"`;
- the user-info of a URL: `https://user:pass@host/` -> `https://***@host/`;
- whatever matches a pattern the operator adds with `--redact REGEX` (repeatable).

A redacted value is replaced by `***`; the name stays, so a reader sees that something was there.
"""
from __future__ import annotations

import functools
import json
import re
from typing import Any, Iterable

MASK = "***"

_WORD = r"(?:key|token|secret|passw(?:or)?d|pwd|auth|credentials?|cookie)(?![a-z])"
_NAME = rf"[A-Za-z0-9_.\-]*?{_WORD}[A-Za-z0-9_.\-]*"
# Characters that end a value inside free text: whitespace, quotes, escapes, and what HTML, JSON
# or a shell put around a word.
_STOP = r"\s\"'\\,;&<>`|)(\]\["


@functools.lru_cache(maxsize=None)
def _rules() -> tuple[re.Pattern[str], re.Pattern[str], tuple[tuple[re.Pattern[str], str], ...]]:
    """The rules, compiled on first use (most runs never meet a string that needs them, and their
    compilation is a few ms of the agent's start-up)."""
    # An argv element that is only an option name (the value is the next element): --hf-token
    opt_only = re.compile(rf"^--?(?:[A-Za-z0-9]+[-_])*?{_NAME}$", re.IGNORECASE)
    # NAME=value / --name=value inside one argv element: everything after `=` is the value.
    arg_pair = re.compile(rf"^(--?)?({_NAME})(=)(.+)$", re.IGNORECASE | re.DOTALL)
    text_rules = (
        # URL user-info
        (re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*://)[^/\s:@\"'<>]+(?::[^/\s@\"'<>]*)?@"), r"\1" + MASK + "@"),
        # name = "quoted value" (source lines, configs)
        (re.compile(rf"(\b{_NAME}\s*=\s*)(\"[^\"\n]*\"|'[^'\n]*')", re.IGNORECASE),
         r'\1"' + MASK + '"'),
        # name=value, --name=value (the value ends at whitespace or a quote)
        (re.compile(rf"(\b{_NAME}\s*=\s*)(?!\*\*\*)([^{_STOP}]+)", re.IGNORECASE), r"\1" + MASK),
        # --name value (an option followed by its value as the next word)
        (re.compile(rf"((?<![\w-])--?{_NAME}\s+)(?!\*\*\*)([^{_STOP}\-][^{_STOP}]*)", re.IGNORECASE), r"\1" + MASK),
    )
    return opt_only, arg_pair, text_rules


# Cheap test first: most strings (frame names, file names) hold nothing a rule could match.
_HINTS = ("key", "token", "secret", "passw", "pwd", "auth", "credential", "cookie", "://")
_MAYBE = re.compile("|".join(_HINTS), re.IGNORECASE)


def _maybe(s: str) -> bool:
    """Whether a rule could match `s`. ASCII text (nearly all of it: traces, argv, file names) is
    lowered and searched with `in`, 20-50x faster than the case-blind regex on a 300 KB trace;
    other text goes through the regex, whose case folding covers what lower() does not."""
    if s.isascii():
        low = s.lower()
        return any(h in low for h in _HINTS)
    return _MAYBE.search(s) is not None

_extra: list[re.Pattern[str]] = []


class RedactPatternError(ValueError):
    """A --redact pattern that is not a valid regular expression."""


def compile_patterns(patterns: Iterable[str]) -> list[re.Pattern[str]]:
    out = []
    for p in patterns:
        try:
            out.append(re.compile(p))
        except re.error as exc:
            raise RedactPatternError(f"--redact {p!r} is not a valid regular expression: {exc}") from None
    return out


def configure(patterns: Iterable[str] = ()) -> list[str]:
    """Set the operator's extra patterns (`--redact`) for this process. Returns them as given."""
    global _extra
    given = list(patterns)
    _extra = compile_patterns(given)
    return given


def extra_patterns() -> list[str]:
    return [p.pattern for p in _extra]


def text(s: str) -> str:
    """Redact free text: a command line, a thread or frame name, a line of a log or of HTML."""
    if not s or not isinstance(s, str):
        return s
    if not _maybe(s):
        for rx in _extra:
            s = rx.sub(MASK, s)
        return s
    for rx, repl in _rules()[2]:
        s = rx.sub(repl, s)
    for rx in _extra:
        s = rx.sub(MASK, s)
    return s


def argv(args: Iterable[str]) -> list[str]:
    """Redact an argv list element by element (a value may be the element after its option)."""
    out: list[str] = []
    hide_next = False
    for a in args:
        if hide_next and not a.startswith("-"):
            out.append(MASK)
            hide_next = False
            continue
        hide_next = False
        if not _maybe(a):              # neither rule can match without a credential word
            out.append(text(a))
            continue
        opt_only, arg_pair, _ = _rules()
        m = arg_pair.match(a)
        if m:
            out.append(f"{m.group(1) or ''}{m.group(2)}={MASK}")
            continue
        if opt_only.match(a) and a.startswith("-"):
            hide_next = True
            out.append(text(a))
            continue
        out.append(text(a))
    return out


def value(obj: Any) -> Any:
    """Redact every string (and every key) inside a JSON-like value."""
    if isinstance(obj, str):
        return text(obj)
    if isinstance(obj, dict):
        return {(text(k) if isinstance(k, str) else k): value(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [value(v) for v in obj]
    return obj


def json_text(s: str) -> str:
    """Redact a JSON document string by string (so escaped quotes cannot hide a value); text that is
    not JSON is redacted as free text."""
    if not _maybe(s) and not any(rx.search(s) for rx in _extra):
        return s
    try:
        doc = json.loads(s)
    except (ValueError, RecursionError):
        return text(s)
    red = value(doc)
    if red == doc:
        return s
    return json.dumps(red)


def artifact(name: str, s: str) -> str:
    """Redact one raw artifact a probe records, by its kind."""
    if not isinstance(s, str):
        return s
    if name.endswith(".json"):
        return json_text(s)
    return text(s)
