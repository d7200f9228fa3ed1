"""Every output of trainprobe, in one place: which renderer draws each form, how a value is
written in every view, and the one way a file is written.

- Forms: `FORMS` maps (document kind, format) -> its renderer, all with one signature
  `render(doc, stream)`. Commands pick a form by name (`emit` to a stream, `save` to a file) and
  never import a renderer themselves, so each option (`--json`, `--html FILE`, `-o FILE`,
  `--format`, `--prometheus FILE`, `--textfile PATH`) means the same renderer everywhere.
- Values are written by reports/values.py (`fmt_value`, `terminal_safe`), the module under every
  renderer: this module imports the renderers, and no renderer imports this module. A text form
  is encoded with every lone surrogate written as a visible `\\udcxx` escape, never refused.
- Files: a path is resolved without following links that another user owns; a new file is created
  beside the destination (O_CREAT|O_EXCL|O_NOFOLLOW, an unpredictable name), written, fsynced, given
  its final mode, then renamed over the destination: a reader never sees half a file, and a link
  or file planted at the destination is replaced, not written through. Only this run's own
  descriptors (/dev/stdout), /dev/null, its terminal and its own FIFOs are written into, and never
  with a blocking open; another user's FIFO and any other device are refused (see "files" below).
  `private=True` (reports, bundles, flame graphs, raw captures: they hold the target's stacks and
  command line) gives mode 0600; `private=False` (metrics files other tools read) gives 0644. Run
  as root under sudo, the file (and a directory this module creates) is chowned to
  SUDO_UID/SUDO_GID, so the operator's own directory holds no root-owned output.
"""
from __future__ import annotations

import errno
import io
import os
import re
import select
import stat
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, NotRequired, TextIO, TypedDict

# Re-exported: the commands and the CLI write values and escape strings through these names.
from trainprobe.reports.values import (MULTILINE_FIELDS, encode_text, fmt_value, printable,  # noqa: F401
                                       terminal_safe, terminal_safe_value)

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


# -- files -----------------------------------------------------------------------------------------
# trainprobe runs as root beside the job's user, who may create anything in /tmp or in a directory
# they own: a FIFO where the report is to go (to read it, or to hang the agent in open()), a link to
# a root file, a link to a directory of root's. So a path is resolved here one component at a time
# (a link is followed only when root, this user or the user behind sudo owns it), the destination is
# looked at without following it (lstat), and then:
# - /dev/stdout, /dev/stderr, /dev/fd/N are the agent's own descriptors, written as they are;
# - /dev/null, the controlling terminal, and a terminal or FIFO that this user owns are streams:
#   opened O_WRONLY|O_NOFOLLOW|O_NONBLOCK (a FIFO nobody reads fails at once instead of blocking),
#   checked again with fstat, written with a bound on how long a reader may take nothing;
# - anything else is a file: a new one is created beside it (O_CREAT|O_EXCL|O_NOFOLLOW, a random
#   name), written, fsynced and renamed over the destination, which replaces a planted link or file
#   instead of writing through it. Another user's FIFO, other devices and sockets are refused.
STREAM_STALL_S = 30.0             # a reader that takes nothing for this long: the write fails
FIFO_READER_WAIT_S = 2.0          # this user's FIFO whose reader is still starting (`cat p & ... -o p`)
_MAX_LINKS = 40
_OWN_FD_PATH = re.compile(r"/(?:dev/fd|proc/self/fd)/([0-9]{1,6})")
_STD_PATHS = {"/dev/stdout": 1, "/dev/stderr": 2}
_TTY_MAJORS = frozenset({4} | set(range(136, 144)))       # virtual consoles and serial lines, pseudo-terminals
_DEV_NULL, _DEV_TTY = (1, 3), (5, 0)


def _own_uids() -> frozenset[int]:
    """The users whose files are this run's own: the effective user and the user behind sudo."""
    owner = _sudo_owner()
    return frozenset({os.geteuid()} | ({owner[0]} if owner else set()))


def _refused(code: int, why: str, path: str) -> OSError:
    return OSError(code, why, path)


def _own_descriptor(path: str) -> int | None:
    """The agent's own open descriptor that `path` names (/dev/stdout, /dev/fd/3), or None."""
    p = os.path.normpath(path)
    fd = _STD_PATHS.get(p)
    m = _OWN_FD_PATH.fullmatch(p)
    if m:
        fd = int(m.group(1))
    if fd is None:
        return None
    try:
        os.fstat(fd)
    except OSError:
        raise _refused(errno.EBADF, f"descriptor {fd} is not open", path) from None
    return fd


def _open_dir(dirpath: str) -> int:
    """An O_PATH descriptor of the directory `dirpath`, reached one component at a time: a link is
    followed only when root or one of this run's users owns it, whatever fs.protected_symlinks says."""
    trusted = _own_uids() | {0}
    todo = [c for c in dirpath.split("/") if c]
    cur = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    seen, links = "", 0
    try:
        while todo:
            comp = todo.pop(0)
            if comp == ".":
                continue
            shown = f"{seen}/{comp}"
            try:
                st = os.stat(comp, dir_fd=cur, follow_symlinks=False)
            except (FileNotFoundError, NotADirectoryError):
                raise _refused(errno.ENOTDIR, f"{dirpath} is not a directory", dirpath) from None
            if stat.S_ISLNK(st.st_mode):
                links += 1
                if links > _MAX_LINKS:
                    raise _refused(errno.ELOOP, f"{dirpath}: too many links", dirpath)
                if st.st_uid not in trusted:
                    raise _refused(errno.EPERM, f"{shown} is a link owned by uid {st.st_uid}: links of other "
                                                "users are not followed", dirpath)
                target = os.readlink(comp, dir_fd=cur)
                if target.startswith("/"):
                    os.close(cur)
                    cur = -1
                    cur = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
                todo = [c for c in target.split("/") if c] + todo
                seen = shown
                continue
            if not stat.S_ISDIR(st.st_mode):
                raise _refused(errno.ENOTDIR, f"{dirpath} is not a directory", dirpath)
            nxt = os.open(comp, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=cur)
            os.close(cur)
            cur, seen = nxt, shown
        return cur
    except BaseException:
        if cur >= 0:
            os.close(cur)
        raise


@dataclass
class _Dest:
    """Where an output goes: the directory (an O_PATH descriptor) and the name in it, and what is
    there now (lstat; None when nothing is); or one of the agent's own descriptors."""
    dir_fd: int
    name: str
    st: os.stat_result | None
    own_fd: int = -1

    def close(self) -> None:
        if self.dir_fd >= 0:
            os.close(self.dir_fd)
            self.dir_fd = -1


def _locate(path: str) -> _Dest:
    fd = _own_descriptor(path)
    if fd is not None:
        return _Dest(-1, path, None, fd)
    parent, name = os.path.split(os.path.abspath(path))
    if not name:
        raise _refused(errno.EISDIR, "it is a directory", path)
    dfd = _open_dir(parent)
    try:
        st: os.stat_result | None = os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        st = None
    except BaseException:
        os.close(dfd)
        raise
    return _Dest(dfd, name, st)


def _kind(dest: _Dest, path: str) -> str:
    """"own" (an own descriptor), "stream" (written into) or "file" (replaced); raises when refused."""
    st = dest.st
    if dest.own_fd >= 0:
        return "own"
    if st is None or stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode):
        return "file"
    if stat.S_ISDIR(st.st_mode):
        raise _refused(errno.EISDIR, "it is a directory", path)
    if stat.S_ISFIFO(st.st_mode):
        if st.st_uid not in _own_uids():
            raise _refused(errno.EPERM, f"it is a FIFO owned by uid {st.st_uid}, another user: the output is not "
                                        "sent to it (remove it or choose another path)", path)
        return "stream"
    if stat.S_ISCHR(st.st_mode):
        dev = (os.major(st.st_rdev), os.minor(st.st_rdev))
        if dev in (_DEV_NULL, _DEV_TTY) or (dev[0] in _TTY_MAJORS and st.st_uid in _own_uids()):
            return "stream"
        raise _refused(errno.EPERM, "it is a device other than /dev/null or this user's terminal", path)
    raise _refused(errno.EINVAL, "not a regular file, a terminal, a pipe or /dev/null", path)


def _open_stream(dest: _Dest, path: str) -> int:
    """Open what _kind called a stream without ever blocking, and check it is still that."""
    assert dest.st is not None
    fifo = stat.S_ISFIFO(dest.st.st_mode)
    deadline = time.monotonic() + FIFO_READER_WAIT_S
    while True:
        try:
            fd = os.open(dest.name, os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC,
                         dir_fd=dest.dir_fd)
            break
        except OSError as exc:
            if exc.errno != errno.ENXIO or not fifo:
                raise
            if time.monotonic() >= deadline:
                raise _refused(errno.ENXIO, "it is a FIFO that no process reads", path) from None
            time.sleep(0.02)
    st = os.fstat(fd)
    same = (st.st_dev, st.st_ino, stat.S_IFMT(st.st_mode), st.st_uid) == \
        (dest.st.st_dev, dest.st.st_ino, stat.S_IFMT(dest.st.st_mode), dest.st.st_uid)
    if not same or (stat.S_ISCHR(st.st_mode) and os.major(st.st_rdev) in _TTY_MAJORS and not os.isatty(fd)):
        os.close(fd)
        raise _refused(errno.EAGAIN, "it changed while it was being opened", path)
    return fd


def _write_all(fd: int, data: bytes, path: str, stall_s: float | None) -> None:
    view = memoryview(data)
    poller = None
    while view:
        try:
            n = os.write(fd, view)
        except BlockingIOError:
            n = 0
        if n:
            view = view[n:]
            continue
        if poller is None:
            poller = select.poll()
            poller.register(fd, select.POLLOUT)
        if not poller.poll(int((stall_s or STREAM_STALL_S) * 1000)):
            raise _refused(errno.ETIMEDOUT, f"its reader took nothing for {stall_s or STREAM_STALL_S:g} s", path)


def _replace_file(dest: _Dest, path: str, data: bytes, mode: int) -> None:
    fd, tmp = -1, ""
    for _ in range(100):
        tmp = f".{dest.name[:40]}.{os.urandom(8).hex()}.tmp"   # secrets.token_hex, without importing OpenSSL
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, PRIVATE_MODE,
                         dir_fd=dest.dir_fd)
            break
        except FileExistsError:
            continue
    else:
        raise _refused(errno.EEXIST, "no free temporary name beside it", path)
    try:
        os.fchmod(fd, mode)
        give_back(fd)
        _write_all(fd, data, path, None)
        os.fsync(fd)
        os.close(fd)
        fd = -1
        try:
            os.replace(tmp, dest.name, src_dir_fd=dest.dir_fd, dst_dir_fd=dest.dir_fd)
        except PermissionError:
            st = dest.st
            if st is not None and st.st_uid not in _own_uids():
                raise _refused(errno.EPERM, f"it belongs to uid {st.st_uid} in a sticky directory, where only its "
                                            "owner may replace it: remove it or choose another path", path) from None
            raise
        try:
            dfd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=dest.dir_fd)
        except OSError:
            return                                      # a directory this user may not read: not synced
        try:
            os.fsync(dfd)
        except OSError:
            pass
        finally:
            os.close(dfd)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        try:
            os.unlink(tmp, dir_fd=dest.dir_fd)
        except OSError:
            pass
        raise


def write(path: str, data: str | bytes, private: bool = True) -> str:
    """Write `data` to `path` as described above: atomically as a file with the mode and owner of its
    kind, or into this run's own stream. Raises OSError, whose strerror is one line for the user."""
    if isinstance(data, str):
        data = encode_text(data)
    dest = _locate(path)
    try:
        kind = _kind(dest, path)
        if kind == "own":
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except (OSError, ValueError):
                    pass
            _write_all(dest.own_fd, data, path, None)
        elif kind == "stream":
            fd = _open_stream(dest, path)
            try:
                _write_all(fd, data, path, STREAM_STALL_S)
            finally:
                os.close(fd)
        else:
            _replace_file(dest, path, data, PRIVATE_MODE if private else PUBLIC_MODE)
    finally:
        dest.close()
    return path


def make_dir(path: str, private: bool = True, parents: bool = False) -> str:
    """Create a directory for outputs (and, with `parents`, the missing ones above it). An existing
    one is kept as it is when this run's user owns it; a link, a file or another user's directory
    (whose owner could swap what is written into it) is refused."""
    mode = PRIVATE_DIR_MODE if private else 0o755
    parent, name = os.path.split(os.path.abspath(path))
    if not name:
        return path
    if parents and not os.path.lexists(parent):
        make_dir(parent, private, parents=True)
    dfd = _open_dir(parent)
    try:
        try:
            os.mkdir(name, mode, dir_fd=dfd)
        except FileExistsError:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            if not stat.S_ISDIR(st.st_mode):
                raise NotADirectoryError(errno.ENOTDIR, "not a directory", path) from None
            if st.st_uid not in _own_uids():
                raise _refused(errno.EPERM, f"it is a directory of uid {st.st_uid}, another user", path) from None
            return path
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
        try:
            os.fchmod(fd, mode)
            give_back(fd)
        finally:
            os.close(fd)
    finally:
        os.close(dfd)
    return path


def check_path(path: str, directory: bool = False) -> str | None:
    """Before a run: the reason an output cannot be written at `path` (a file, or with `directory`
    a directory of outputs), or None. Nothing is opened or created."""
    try:
        dest = _locate(path)
    except OSError as exc:
        return f"cannot write {path}: {exc.strerror or exc}"
    try:
        st = dest.st
        if directory:
            if st is not None and stat.S_ISDIR(st.st_mode) and st.st_uid not in _own_uids():
                return f"cannot write {path}: it is a directory of uid {st.st_uid}, another user"
            kind = "file"
        else:
            kind = _kind(dest, path)
        if kind == "file" and not os.access(os.path.dirname(os.path.abspath(path)) or ".", os.W_OK):
            return f"cannot write {path}: {os.path.dirname(os.path.abspath(path))} is not writable"
    except OSError as exc:
        return f"cannot write {path}: {exc.strerror or exc}"
    finally:
        dest.close()
    return None


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
    group: NotRequired[str]             # "function" (default) or "line": how frames are told apart
    waiting: NotRequired[dict[str, int] | None]   # the part of `profile` in stacks that end in a blocking call
    threads: NotRequired[list[dict[str, Any]] | None]  # each thread's on-CPU / run-queue / off-CPU seconds


def _grouped(doc: ProfileDoc) -> tuple[dict[str, int], dict[str, int] | None, dict[str, int] | None]:
    """(profile, before, waiting) with frames told apart as the document asks (folded.group)."""
    from trainprobe.reports import folded
    by = doc.get("group") or "line"
    before, waiting = doc["before"], doc.get("waiting")
    return (folded.group(doc["profile"], by), None if before is None else folded.group(before, by),
            None if not waiting else folded.group(waiting, by))


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
    profile, before, waiting = _grouped(doc)
    stream.write(flamegraph.render(profile, title=doc["title"], subtitle=doc["subtitle"], unit=doc["unit"],
                                   before=before, waiting=waiting, threads=doc.get("threads")).svg)


def _flame_html(doc: ProfileDoc, stream: TextIO) -> None:
    """Both groupings in one page (a control switches them), the document's shown first."""
    from trainprobe.reports import html
    html.render_flamegraph_page(doc["profile"], stream, doc["title"], doc["subtitle"], unit=doc["unit"],
                                before=doc["before"], group=doc.get("group") or "line",
                                waiting=doc.get("waiting"), threads=doc.get("threads"))


def _speedscope(doc: ProfileDoc, stream: TextIO) -> None:
    from trainprobe.reports import speedscope
    profile, _before, _waiting = _grouped(doc)
    speedscope.write(speedscope.split_by_root(profile), stream, name=doc["title"],
                     unit=speedscope.UNIT_NAMES.get(doc["unit"], "none"), exporter=doc["exporter"])


def _folded(doc: ProfileDoc, stream: TextIO) -> None:
    from trainprobe.reports import folded
    profile, before, _waiting = _grouped(doc)
    stream.write(folded.dumps_diff(before, profile) if before is not None else folded.dumps(profile))


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
    """Draw `doc` in one form onto a stream (stdout, stderr). A character the stream's encoding
    cannot carry (a lone surrogate from a name that was not UTF-8) is written as a visible escape."""
    buf = _StreamBuffer(stream)
    form(kind, fmt).render(doc, buf)
    stream.write(printable(buf.getvalue(), getattr(stream, "encoding", None)))


class _StreamBuffer(io.StringIO):
    """A form drawn for `stream`, held until it is escaped for the stream's encoding: a renderer
    still asks the stream itself whether it is a terminal (colours)."""

    def __init__(self, stream: TextIO):
        super().__init__()
        self._stream = stream

    def isatty(self) -> bool:
        try:
            return bool(self._stream.isatty())
        except (AttributeError, ValueError, OSError):
            return False


def save(kind: str, fmt: str, doc: Any, path: str) -> str:
    """Draw `doc` in one form into the file `path`, atomically, with the form's mode. Raises OSError."""
    f = form(kind, fmt)
    buf = io.StringIO()
    f.render(doc, buf)
    return write(path, buf.getvalue(), private=f.private)
