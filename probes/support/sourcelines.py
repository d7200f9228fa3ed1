"""Source lines of user-code leaf frames, read only as the target's own user could read them.

A frame's file name is chosen by the target (`compile(src, "/etc/shadow", "exec")` names a frame
after any file), and trainprobe often runs as root. So a source line is read only:

- through `/proc/PID/root`, resolving the path ourselves one component at a time (O_PATH and
  O_NOFOLLOW; symbolic links are followed by hand, inside the target's root, at most 40): no
  absolute link, `..`, or /proc magic link leads outside the target's view of the file system;
- from a regular file (opened O_NONBLOCK, then `fstat` on the open descriptor: a FIFO, a device
  or a socket is never read), of at most MAX_FILE_BYTES;
- when the target's own user could read it: its fs uid, fs gid and supplementary groups (from
  /proc/PID/status) against the owner, group and mode of the file and of every directory on the
  way (search permission). ACLs are not consulted: a file readable only through an ACL is skipped.

Anything else gives no source line and a note saying why (`skipped`: path -> reason).
Cost: one open and one bounded read per distinct user-code file of the leaf frames.
"""
from __future__ import annotations

import errno
import os
import stat
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from trainprobe.probes.parsers import procfs, pystacks

MAX_FILE_BYTES = 4 << 20        # a source file larger than this is not read
MAX_FILES = 256                 # distinct files read per trace
MAX_SYMLINKS = 40               # as the kernel's own limit (ELOOP)


@dataclass(frozen=True)
class Creds:
    """Whose rights a read is checked against."""

    uid: int
    gid: int
    groups: frozenset[int]

    @classmethod
    def of_process(cls, pid: int, root: str = "/") -> "Creds":
        st = procfs.parse_status(procfs.read_text(root, f"proc/{pid}/status"))
        uids, gids = st.get("Uid", "").split(), st.get("Gid", "").split()
        if len(uids) < 4 or len(gids) < 4:
            raise ValueError(f"/proc/{pid}/status has no Uid/Gid lines")
        groups = frozenset(int(g) for g in st.get("Groups", "").split() if g.isdigit())
        return cls(int(uids[3]), int(gids[3]), groups | {int(gids[3])})   # fs uid/gid decide file access

    @classmethod
    def of_invoker(cls) -> "Creds":
        """The user who ran trainprobe (the one behind sudo, if any)."""
        uid = int(os.environ.get("SUDO_UID", os.getuid()))
        gid = int(os.environ.get("SUDO_GID", os.getgid()))
        groups = frozenset({gid} | (set() if "SUDO_UID" in os.environ else set(os.getgroups())))
        return cls(uid, gid, groups)


class Skip(Exception):
    """Why one file was not read."""


def _may(st: os.stat_result, creds: Creds, bit: int) -> bool:
    """DAC check of one permission bit (4 read, 1 search) for `creds`; root passes (DAC override)."""
    if creds.uid == 0:
        return True
    if st.st_uid == creds.uid:
        return bool(st.st_mode & (bit << 6))
    if st.st_gid in creds.groups:
        return bool(st.st_mode & (bit << 3))
    return bool(st.st_mode & bit)


def open_in_root(root_dir: str, path: str, creds: Creds) -> int:
    """Open `path` (absolute, as the target sees it) below `root_dir` for reading, as `creds` could.

    Returns a file descriptor of a regular file; raises Skip with the reason otherwise.
    """
    if not path.startswith("/"):
        raise Skip("not an absolute path")
    flags_path = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        root_fd = os.open(root_dir, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise Skip(f"cannot open the target's root: {exc.strerror}") from None
    fds = [root_fd]          # the directories walked so far; fds[-1] is the current one
    pending = [c for c in path.split("/") if c not in ("", ".")]
    links = 0
    try:
        while pending:
            comp = pending.pop(0)
            if comp == "..":
                if len(fds) > 1:
                    os.close(fds.pop())
                continue
            cur = fds[-1]
            if not _may(os.fstat(cur), creds, 1):
                raise Skip("the target's user cannot search a directory on the way")
            try:
                fd = os.open(comp, flags_path, dir_fd=cur)
            except OSError as exc:
                raise Skip(exc.strerror or "cannot open") from None
            st = os.fstat(fd)
            if stat.S_ISLNK(st.st_mode):
                os.close(fd)
                links += 1
                if links > MAX_SYMLINKS:
                    raise Skip("too many levels of symbolic links")
                try:
                    target = os.readlink(comp, dir_fd=cur)
                except OSError as exc:
                    raise Skip(exc.strerror or "cannot read a link") from None
                parts = [c for c in target.split("/") if c not in ("", ".")]
                if target.startswith("/"):
                    while len(fds) > 1:
                        os.close(fds.pop())
                pending = parts + pending
                continue
            if stat.S_ISDIR(st.st_mode):
                if not pending:
                    os.close(fd)
                    raise Skip("a directory")
                fds.append(fd)
                continue
            if pending:
                os.close(fd)
                raise Skip("not a directory on the way")
            os.close(fd)
            if not stat.S_ISREG(st.st_mode):
                raise Skip("not a regular file")
            try:
                real = os.open(comp, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_NOCTTY | os.O_CLOEXEC,
                               dir_fd=cur)
            except OSError as exc:
                raise Skip(exc.strerror or "cannot open") from None
            st = os.fstat(real)
            if not stat.S_ISREG(st.st_mode):      # replaced between the two opens
                os.close(real)
                raise Skip("not a regular file")
            if not _may(st, creds, 4):
                os.close(real)
                raise Skip("the target's user may not read it")
            if st.st_size > MAX_FILE_BYTES:
                os.close(real)
                raise Skip(f"larger than {MAX_FILE_BYTES >> 20} MiB")
            return real
        raise Skip("a directory")
    finally:
        for fd in fds:
            os.close(fd)


def read_lines(root_dir: str, path: str, creds: Creds) -> list[str]:
    fd = open_in_root(root_dir, path, creds)
    try:
        chunks, n = [], 0
        while n <= MAX_FILE_BYTES:
            try:
                b = os.read(fd, 1 << 16)
            except OSError as exc:
                if exc.errno == errno.EAGAIN:
                    raise Skip("would block") from None
                raise Skip(exc.strerror or "read failed") from None
            if not b:
                break
            chunks.append(b)
            n += len(b)
        if n > MAX_FILE_BYTES:
            raise Skip(f"larger than {MAX_FILE_BYTES >> 20} MiB")
    finally:
        os.close(fd)
    return b"".join(chunks).decode("utf-8", errors="replace").splitlines()


def leaf_frames(events: list[dict[str, Any]]) -> set[tuple[str, int]]:
    """(file, line) of every user-code leaf frame in a py-spy chrometrace."""
    leaves: set[tuple[str, int]] = set()
    depth: dict[tuple[Any, Any], list[tuple[str, int]]] = defaultdict(list)
    for ev in events if isinstance(events, list) else []:
        if not isinstance(ev, dict):
            continue
        key = (ev.get("pid"), ev.get("tid"))
        args = ev.get("args") if isinstance(ev.get("args"), dict) else {}
        if ev.get("ph") == "B":
            fn = args.get("filename")
            try:
                ln = int(args.get("line") or 0)
            except (TypeError, ValueError):
                ln = 0
            depth[key].append((fn if isinstance(fn, str) else "", ln))
        elif ev.get("ph") == "E" and depth[key]:
            fn, ln = depth[key][-1]
            if fn and not pystacks.is_library(fn):
                leaves.add((fn, ln))
            depth[key].pop()
    return leaves


def read_leaf_sources(events: list[dict[str, Any]], pid: int | None = None, root: str = "/",
                      cwd: str | None = None, remap: dict[str, str] | None = None,
                      creds: Creds | None = None, rec: Any = None) -> tuple[dict[str, str], dict[str, str]]:
    """Source lines of the user-code leaf frames -> ({"file:line": source}, {path: why skipped}).

    With `pid`, files are read through /proc/PID/root as the target's user; without one (an imported
    trace), through `root` as the user who ran trainprobe. `remap` maps a path prefix of the
    machine that ran the job to a local one (imported traces only).
    """
    import time

    root_dir = procfs.path(root, f"proc/{pid}/root") if pid else root
    skipped: dict[str, str] = {}
    out: dict[str, str] = {}
    if creds is None:
        try:
            creds = Creds.of_process(pid, root) if pid else Creds.of_invoker()
        except Exception as exc:  # noqa: BLE001 - unknown rights: read nothing
            return {}, {"*": f"the target's user and groups are unknown ({exc}): no source lines read"}
    if pid and cwd is None:
        try:
            cwd = os.readlink(procfs.path(root, f"proc/{pid}/cwd"))
        except OSError:
            cwd = None
    cache: dict[str, list[str] | None] = {}
    for fn, ln in sorted(leaf_frames(events)):
        path = fn
        for a, b in (remap or {}).items():
            if path.startswith(a):
                path = b + path[len(a):]
                break
        if not path.startswith("/"):
            if not cwd:
                skipped.setdefault(fn, "a relative path and the target's working directory is unknown")
                continue
            path = os.path.join(cwd, path)
        if path not in cache:
            if len(cache) >= MAX_FILES:
                skipped.setdefault(path, f"more than {MAX_FILES} distinct files")
                continue
            t0 = time.time()
            try:
                cache[path] = read_lines(root_dir, path, creds)
                if rec is not None:
                    rec.note("file", f"{root_dir}{path}", 0, t0, time.time() - t0)
            except Skip as exc:
                cache[path] = None
                skipped[path] = str(exc)
                if rec is not None:
                    rec.note("file", f"{root_dir}{path} (not read: {exc})", -1, t0, time.time() - t0)
            except OSError as exc:
                cache[path] = None
                skipped[path] = exc.strerror or str(exc)
        lines = cache.get(path)
        if lines is not None and 0 < ln <= len(lines):
            out[f"{fn}:{ln}"] = lines[ln - 1].strip()
    return out, skipped
