"""Every output of trainprobe, in one place: which renderer draws each form, how a value is
written in every view, and the one way a file is written.

- Forms: `FORMS` maps (document kind, format) -> its renderer, all with one signature
  `render(doc, stream)`. Commands pick a form by name (`emit` to a stream, `save` to a file) and
  never import a renderer themselves, so each option (`--json`, `--html FILE`, `-o FILE`,
  `--format`, `--prometheus FILE`, `--textfile PATH`) means the same renderer everywhere.
- Values: `fmt_value` writes a number, a flag or a missing value the same way in the terminal,
  HTML, job and preflight views (yes/no, "-" for none, the same digits).
- Files: a temporary file is created with mkstemp (O_EXCL, an unpredictable name) in the
  destination's own directory, written, flushed, given its final mode, then renamed over the
  destination: a reader never sees half a file, and a link planted at the destination is
  replaced, not followed. `private=True` (reports, bundles, flame graphs, raw captures: they hold
  the target's stacks and command line) gives mode 0600; `private=False` (metrics files other tools
  read) gives 0644. Run as root under sudo, the file (and a directory this module creates) is
  chowned to SUDO_UID/SUDO_GID, so the operator's own directory holds no root-owned output.
- The terminal: strings from the target are shown with their control characters escaped.
"""
from __future__ import annotations

import errno
import io
import json
import os
import re
import stat
import tempfile
from dataclasses import dataclass
from typing import Any, Callable, Mapping, TextIO, TypedDict

PRIVATE_MODE = 0o600
PUBLIC_MODE = 0o644
PRIVATE_DIR_MODE = 0o700


def _sudo_owner() -> tuple[int, int] | None:
    if os.geteuid() != 0:
        return None
    uid, gid = os.environ.get("SUDO_UID"), os.environ.get("SUDO_GID")
    if not uid or not uid.isdigit():
        return None
    return int(uid), int(gid) if gid and gid.isdigit() else -1


def give_back(path_or_fd: str | int) -> None:
    """chown to the user behind sudo, if any (a no-op otherwise)."""
    owner = _sudo_owner()
    if owner is None:
        return
    if isinstance(path_or_fd, int):
        os.fchown(path_or_fd, *owner)
    else:
        os.chown(path_or_fd, *owner, follow_symlinks=False)


def _stream_target(path: str) -> bool:
    """Whether `path` names a stream to write into rather than a file to replace: /dev/null, a
    terminal, a pipe (`-o /dev/stdout` in a pipeline). Renaming over those would put a regular file
    where the device was (as root, /dev/null itself). Any other existing non-regular file (a block
    device, a socket) is refused."""
    try:
        st = os.stat(path)                      # follows links: /dev/stdout -> /proc/self/fd/1 -> pipe
    except OSError:
        return False
    if stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode):
        return False
    if stat.S_ISFIFO(st.st_mode):
        return True
    real = os.path.realpath(path)
    if stat.S_ISCHR(st.st_mode) and (real in ("/dev/null", "/dev/tty") or real.startswith("/dev/pts/")):
        return True
    raise OSError(errno.EINVAL, "not a regular file, a terminal, a pipe or /dev/null", path)


def write(path: str, data: str | bytes, private: bool = True) -> str:
    """Write `data` to `path` atomically with the mode and owner described above. Raises OSError."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    if _stream_target(path):
        with open(path, "wb") as fh:
            fh.write(data)
        return path
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)[:40]}.", suffix=".tmp", dir=d)
    try:
        os.fchmod(fd, PRIVATE_MODE if private else PUBLIC_MODE)
        give_back(fd)
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
        os.fsync(fd)
        os.close(fd)
        fd = -1
        os.replace(tmp, path)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


def make_dir(path: str, private: bool = True) -> str:
    """Create a directory (and no parents) for outputs; an existing one is kept as it is."""
    try:
        os.mkdir(path, PRIVATE_DIR_MODE if private else 0o755)
    except FileExistsError:
        if not os.path.isdir(path) or os.path.islink(path):
            raise NotADirectoryError(20, "not a directory", path) from None
        return path
    os.chmod(path, PRIVATE_DIR_MODE if private else 0o755)
    give_back(path)
    return path


def check_path(path: str) -> str | None:
    """Before a run: the reason a file cannot be written at `path`, or None."""
    parent = os.path.dirname(os.path.abspath(path)) or "."
    if os.path.isdir(path):
        return f"cannot write {path}: it is a directory"
    if not os.path.isdir(parent):
        return f"cannot write {path}: {parent} is not a directory"
    if not os.access(parent, os.W_OK):
        return f"cannot write {path}: {parent} is not writable"
    return None


# -- values --------------------------------------------------------------------------------------
def fmt_value(v: Any, unit: str | None = None) -> str:
    """One value as every view writes it: a flag as yes/no, a missing value as "-", a list or a
    mapping as JSON, a number by its `unit`: "%" a share (0.42 -> 42%), "x" a speedup (2.00x),
    "s" a duration (12.5 ms, 3.20 s), none: two decimals up to 1, three digits below 1000, then
    whole numbers with thousands separators."""
    if isinstance(v, bool):
        return "yes" if v else "no"
    if v is None:
        return "-"
    if isinstance(v, (list, dict)):
        return json.dumps(v, default=str)
    if not isinstance(v, (int, float)):
        return str(v)
    if unit == "%":
        return f"{100 * v:.0f}%"
    if unit == "x":
        return f"{v:.2f}x"
    if unit == "s":
        return f"{v * 1000:.1f} ms" if v < 1 else f"{v:.2f} s"
    if isinstance(v, int):
        return str(v)
    if 0 < abs(v) <= 1.0:
        return f"{v:.2f}"
    return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"


# -- forms: which renderer draws which output ------------------------------------------------------
Renderer = Callable[[Any, TextIO], None]


class ProfileDoc(TypedDict):
    """The document of the flame-graph forms (kind "profile"): folded stacks and their labels."""
    profile: dict[str, int]
    title: str
    subtitle: str
    unit: str                           # of the counts: "us" (microseconds of wall-clock time)
    before: dict[str, int] | None       # the profile to draw the difference against
    exporter: str                       # "trainprobe@VERSION", written into speedscope files


@dataclass(frozen=True)
class Form:
    """One output form: its renderer and how a file of it is written."""
    render: Renderer
    private: bool = True                # the file holds the target's stacks or argv: mode 0600
    extensions: tuple[str, ...] = ()    # file names that choose this form when no format is given


def _json(doc: Mapping[str, Any], stream: TextIO) -> None:
    from trainprobe.reports import jsonout
    jsonout.render(doc, stream)


def _text(report: Mapping[str, Any], stream: TextIO) -> None:
    from trainprobe.reports import text
    text.render(report, stream)


def _html(report: Mapping[str, Any], stream: TextIO) -> None:
    """The report with the timeline and flame graphs (agent/visuals.py) under its `visuals` key."""
    from trainprobe.reports import html
    html.render(report, stream, report.get("visuals"))


def _job_text(report: Mapping[str, Any], stream: TextIO) -> None:
    from trainprobe.reports import job_text
    job_text.render(report, stream)


def _job_html(report: Mapping[str, Any], stream: TextIO) -> None:
    from trainprobe.reports import job_html
    stream.write(job_html.render(report))


def _preflight_text(report: Mapping[str, Any], stream: TextIO) -> None:
    from trainprobe.reports import preflight_text
    preflight_text.render(report, stream)


def _preflight_text_verbose(report: Mapping[str, Any], stream: TextIO) -> None:
    from trainprobe.reports import preflight_text
    preflight_text.render(report, stream, verbose=True)


def _preflight_prometheus(report: Mapping[str, Any], stream: TextIO) -> None:
    from trainprobe.reports import prometheus
    stream.write(prometheus.render(report))


def _watch_prometheus(doc: Mapping[str, Any], stream: TextIO) -> None:
    from trainprobe.reports import watch_metrics
    stream.write(watch_metrics.render(doc))


def _svg(doc: ProfileDoc, stream: TextIO) -> None:
    from trainprobe.reports import flamegraph
    stream.write(flamegraph.render(doc["profile"], title=doc["title"], subtitle=doc["subtitle"], unit=doc["unit"],
                                   before=doc["before"]).svg)


def _flame_html(doc: ProfileDoc, stream: TextIO) -> None:
    from trainprobe.reports import html
    html.render_flamegraph_page(doc["profile"], stream, doc["title"], doc["subtitle"], unit=doc["unit"],
                                before=doc["before"])


def _speedscope(doc: ProfileDoc, stream: TextIO) -> None:
    from trainprobe.reports import speedscope
    speedscope.write(speedscope.split_by_root(doc["profile"]), stream, name=doc["title"],
                     unit=speedscope.UNIT_NAMES.get(doc["unit"], "none"), exporter=doc["exporter"])


def _folded(doc: ProfileDoc, stream: TextIO) -> None:
    from trainprobe.reports import folded
    before = doc["before"]
    stream.write(folded.dumps_diff(before, doc["profile"]) if before is not None else folded.dumps(doc["profile"]))


# (kind of document, format) -> Form. Kinds: "report" (a diagnosis, docs/report-contract.md), "job"
# (a Slurm job's merged report), "preflight", "profile" (a ProfileDoc), "watch" (watch's metrics),
# "demo" (the demo's before/after summary).
FORMS: dict[tuple[str, str], Form] = {
    ("report", "text"): Form(_text),
    ("report", "json"): Form(_json),
    ("report", "html"): Form(_html),
    ("job", "text"): Form(_job_text),
    ("job", "json"): Form(_json),
    ("job", "html"): Form(_job_html),
    ("preflight", "text"): Form(_preflight_text),
    ("preflight", "text-verbose"): Form(_preflight_text_verbose),
    ("preflight", "json"): Form(_json),
    ("preflight", "prometheus"): Form(_preflight_prometheus, private=False),    # node_exporter reads it
    ("profile", "svg"): Form(_svg, extensions=(".svg",)),
    ("profile", "html"): Form(_flame_html, extensions=(".html", ".htm")),
    ("profile", "speedscope"): Form(_speedscope, extensions=(".json",)),
    ("profile", "folded"): Form(_folded, extensions=(".folded", ".collapsed", ".txt")),
    ("watch", "prometheus"): Form(_watch_prometheus, private=False),            # node_exporter reads it
    ("demo", "json"): Form(_json),
}


def form(kind: str, fmt: str) -> Form:
    try:
        return FORMS[(kind, fmt)]
    except KeyError:
        raise ValueError(f"no {fmt!r} output for a {kind} document; there is: {', '.join(formats(kind))}") from None


def formats(kind: str) -> tuple[str, ...]:
    """The formats a kind of document can be written in, in the order they were declared."""
    return tuple(f for k, f in FORMS if k == kind)


def format_for(kind: str, fmt: str | None, path: str | None, default: str) -> str:
    """The format asked for; else the one the file name's extension names; else `default`."""
    if fmt:
        return fmt
    ext = os.path.splitext(path or "")[1].lower()
    return next((f for f in formats(kind) if ext and ext in FORMS[(kind, f)].extensions), default)


def emit(kind: str, fmt: str, doc: Any, stream: TextIO) -> None:
    """Draw `doc` in one form onto a stream (stdout, stderr)."""
    form(kind, fmt).render(doc, stream)


def save(kind: str, fmt: str, doc: Any, path: str) -> str:
    """Draw `doc` in one form into the file `path`, atomically, with the form's mode. Raises OSError."""
    f = form(kind, fmt)
    buf = io.StringIO()
    f.render(doc, buf)
    return write(path, buf.getvalue(), private=f.private)


# -- the terminal --------------------------------------------------------------------------------
# Target-controlled strings (argv, thread names, frame names, file names) may hold ANSI escapes or
# control characters that would move the cursor, rewrite earlier lines or retitle the terminal.
# They are shown escaped (`\x1b`), along with C1 controls and Unicode bidirectional overrides.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_CONTROL_NL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\n]")
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
