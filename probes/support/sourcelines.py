"""Source lines of user-code leaf frames, read only as the target's own user could read them.

A frame's file name is chosen by the target (`compile(src, "/proc/1/maps", "exec")` names a frame
after any file), and trainprobe often runs as root. So a source line is read only (safeopen):

- through `/proc/PID/root`, resolving the path one component at a time (O_PATH and O_NOFOLLOW;
  symbolic links followed by hand, inside the target's root, at most 40);
- from a regular file (never a FIFO, a device or a socket) of 1 byte to MAX_FILE_BYTES, on a real
  file system: never procfs, sysfs, cgroupfs, debugfs, tracefs, bpffs, securityfs, configfs or
  another pseudo file system (fstatfs f_type), and the same inode when read as when checked;
- with the target's own rights: when trainprobe's rights differ from the target's (root, or
  capabilities) and it may change its ids, the files are opened and read by a short-lived child
  process that runs as the target's fs uid, fs gid and groups (from /proc/PID/status), so the
  kernel itself decides every search and the open. Where that child cannot be started (trainprobe
  may not change its ids, or no python3 is executable by that user), the same walk runs here and
  checks those ids by hand against the owner, group and mode of the file and of every directory on
  the way (ACLs not consulted).

Anything else gives no source line and a note saying why (`skipped`: path -> reason).
Cost: one open and one bounded read per distinct user-code file of the leaf frames, plus, as root,
one python3 start (about 20 ms) per trace.
"""
from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from trainprobe.probes.errors import ProbeError
from trainprobe.probes.parsers import procfs, pystacks
from trainprobe.probes.support import safeopen
from trainprobe.probes.support.safeopen import Skip

MAX_FILE_BYTES = 4 << 20        # a source file larger than this is not read
MAX_FILES = 256                 # distinct files read per trace
MAX_SYMLINKS = safeopen.MAX_SYMLINKS
READER_TIMEOUT_S = 10.0         # the child that reads as the target's user, all files together
MAX_ANSWER_BYTES = 16 << 20     # what that child may send back
CAP_SETGID, CAP_SETUID = 6, 7
# The child runs this file's text, handed over on its stdin; its command line stays short.
_BOOT = "import sys;exec(compile(sys.stdin.buffer.read(int(sys.argv[1])),'trainprobe-safeopen','exec'))"
_INTERPRETERS = ("/usr/bin/python3", "/usr/local/bin/python3", "/bin/python3")
_working_interpreter: dict[int, str] = {}     # uid -> the python3 that started as that user


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


def _effective_caps() -> int:
    try:
        return int(procfs.parse_status(procfs.read_text("/", "proc/self/status")).get("CapEff", "0"), 16)
    except Exception:  # noqa: BLE001 - unknown: assume some, so the rights are checked
        return -1


def _rights_differ(creds: Creds) -> bool:
    """Whether this process's own rights are not the target's (other ids, or any capability)."""
    if os.geteuid() == 0 and creds.uid == 0:
        return False                      # the target is root too: nothing to take away
    own_groups = frozenset(os.getgroups()) | {os.getegid()}
    return (creds.uid, creds.gid, creds.groups) != (os.geteuid(), os.getegid(), own_groups) or _effective_caps() != 0


def _may_change_ids() -> bool:
    caps = _effective_caps()
    return os.geteuid() == 0 or (caps > 0 and caps >> CAP_SETUID & 1 and caps >> CAP_SETGID & 1)


def _open_root(root_dir: str) -> int:
    try:
        return os.open(root_dir, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise Skip(f"cannot open the target's root: {exc.strerror}") from None


def open_in_root(root_dir: str, path: str, creds: Creds) -> int:
    """Open `path` (absolute, as the target sees it) below `root_dir` in this process, checking
    `creds` by hand. Returns a file descriptor of a regular file; raises Skip with the reason."""
    root_fd = _open_root(root_dir)
    try:
        return safeopen.open_below(root_fd, path, (creds.uid, creds.groups), MAX_FILE_BYTES)
    finally:
        os.close(root_fd)


def read_lines(root_dir: str, path: str, creds: Creds) -> list[str]:
    """Every line of one file, read in this process with `creds` checked by hand (see open_in_root)."""
    root_fd = _open_root(root_dir)
    try:
        return safeopen.read_lines(root_fd, path, (creds.uid, creds.groups), MAX_FILE_BYTES)
    finally:
        os.close(root_fd)


def _exchange(proc: subprocess.Popen, data: bytes, deadline: float) -> bytes:
    """Write `data` to the child's stdin and read its stdout to EOF, within the deadline and the
    answer's size limit (the child runs as the target's user: its answer is untrusted)."""
    assert proc.stdin is not None and proc.stdout is not None
    win, rout = proc.stdin.fileno(), proc.stdout.fileno()
    os.set_blocking(win, False)
    sel = selectors.DefaultSelector()
    sel.register(win, selectors.EVENT_WRITE)
    sel.register(rout, selectors.EVENT_READ)
    view, out = memoryview(data), bytearray()
    try:
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                raise Skip(f"the reader did not answer within {READER_TIMEOUT_S:g} s")
            for key, _ in sel.select(left):
                if key.fd == win:
                    try:
                        view = view[os.write(win, view[:1 << 16]):]
                    except BlockingIOError:
                        continue
                    except OSError:            # it exited or closed its stdin early
                        view = view[len(view):]
                    if not view:
                        sel.unregister(win)
                        proc.stdin.close()
                else:
                    chunk = os.read(rout, 1 << 16)
                    if not chunk:
                        sel.unregister(rout)
                    out += chunk
                    if len(out) > MAX_ANSWER_BYTES:
                        raise Skip("the reader answered too much")
    finally:
        sel.close()
    return bytes(out)


def _parse_answer(raw: bytes, creds: Creds, wanted: list[tuple[str, list[int]]]) -> list[dict[int, str] | str]:
    doc = json.loads(raw)
    files = doc.get("files") if isinstance(doc, dict) else None
    if doc.get("uid") != creds.uid or not isinstance(files, list) or len(files) != len(wanted):
        raise ValueError("not an answer to the request")
    out: list[dict[int, str] | str] = []
    for (_path, lines_wanted), item in zip(wanted, files):
        if isinstance(item, dict) and isinstance(item.get("skip"), str):
            out.append(item["skip"][:200])
        elif isinstance(item, dict) and isinstance(item.get("lines"), dict):
            got = {}
            for k, v in item["lines"].items():
                if isinstance(v, str) and k.isdigit() and int(k) in lines_wanted:
                    got[int(k)] = v[:safeopen.MAX_LINE_CHARS]
            out.append(got)
        else:
            raise ValueError("not an answer to the request")
    return out


def _read_as_target(root_fd: int, wanted: list[tuple[str, list[int]]], creds: Creds,
                    rec: Any) -> list[dict[int, str] | str]:
    """The lines wanted, opened and read by a child running as the target's user; raises
    ProbeError where no such child could be started or it gave no answer."""
    try:
        with open(safeopen.__file__, "rb") as fh:
            code = fh.read()
    except OSError as exc:
        raise ProbeError(f"cannot read {safeopen.__file__}: {exc.strerror}") from None
    files = []
    for path, lines in wanted:
        try:
            files.append([os.fsencode(path).hex(), lines])
        except UnicodeError:
            files.append(["", lines])            # not absolute: the child says so
    request = json.dumps({"root_fd": root_fd, "max_bytes": MAX_FILE_BYTES, "files": files}).encode("ascii")
    candidates = [_working_interpreter[creds.uid]] if creds.uid in _working_interpreter else []
    for exe in (sys.executable, *_INTERPRETERS):
        if exe not in candidates and os.path.exists(exe):
            candidates.append(exe)
    deadline = time.monotonic() + READER_TIMEOUT_S
    why = "no python3 found"
    for exe in candidates:
        argv = [exe, "-I", "-S", "-B", "-c", _BOOT, str(len(code))]
        kw: dict[str, Any] = dict(stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                  user=creds.uid, group=creds.gid, extra_groups=sorted(creds.groups),
                                  pass_fds=(root_fd,), env={}, cwd="/", bufsize=0)
        try:
            proc = rec.spawn(argv, stop_signal=signal.SIGKILL, **kw) if rec is not None else \
                subprocess.Popen(argv, **kw)
        except (OSError, ProbeError, subprocess.SubprocessError) as exc:
            why = f"{exe} cannot be started as uid {creds.uid}: {getattr(exc, 'strerror', None) or exc}"
            continue
        raw, failed = b"", None
        try:
            raw = _exchange(proc, code + request, deadline)
        except Skip as exc:
            failed = str(exc)
            proc.kill()
        finally:
            if rec is not None:
                rc = rec.finish(proc, grace_s=1.0)
            else:
                try:
                    rc = proc.wait(timeout=1.0)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    rc = proc.wait()
        if failed:
            raise ProbeError(failed)
        if not raw and rc != 0:
            why = f"{exe} did not start as uid {creds.uid} (exit {rc})"
            continue
        try:
            answer = _parse_answer(raw, creds, wanted)
        except (ValueError, AttributeError, TypeError):
            raise ProbeError(f"the reader running as uid {creds.uid} gave no usable answer (exit {rc})") from None
        _working_interpreter[creds.uid] = exe
        return answer
    raise ProbeError(why)


def read_files(root_dir: str, wanted: list[tuple[str, list[int]]], creds: Creds,
               rec: Any = None) -> tuple[list[dict[int, str] | str], str]:
    """For each (absolute path, line numbers): {line: text}, or why it was not read; and how the
    files were read ("as uid N", or "checked by hand for uid N" and why)."""
    try:
        root_fd = _open_root(root_dir)
    except Skip as exc:
        return [str(exc)] * len(wanted), "not read"
    try:
        how = f"checked by hand for uid {creds.uid}"
        if wanted and _rights_differ(creds):
            if _may_change_ids():
                try:
                    return _read_as_target(root_fd, wanted, creds, rec), f"as uid {creds.uid}"
                except ProbeError as exc:
                    how += f" ({exc})"
            else:
                how += " (trainprobe may not change its ids)"
        out: list[dict[int, str] | str] = []
        for path, lines_wanted in wanted:
            try:
                lines = safeopen.read_lines(root_fd, path, (creds.uid, creds.groups), MAX_FILE_BYTES)
            except Skip as exc:
                out.append(str(exc))
                continue
            out.append({n: lines[n - 1][:safeopen.MAX_LINE_CHARS] for n in lines_wanted if 0 < n <= len(lines)})
        return out, how
    finally:
        os.close(root_fd)


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
    frames: dict[str, list[tuple[str, int]]] = {}       # path to read -> the frames (file, line) in it
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
        if path not in frames and len(frames) >= MAX_FILES:
            skipped.setdefault(path, f"more than {MAX_FILES} distinct files")
            continue
        frames.setdefault(path, []).append((fn, ln))
    wanted = [(path, sorted({ln for _fn, ln in fl if ln > 0})) for path, fl in frames.items()]
    t0 = time.time()
    results, how = read_files(root_dir, wanted, creds, rec)
    seconds = (time.time() - t0) / max(len(wanted), 1)
    for (path, _lines), got in zip(wanted, results):
        if isinstance(got, str):
            skipped[path] = got
            if rec is not None:
                rec.note("file", f"{root_dir}{path} (not read, {how}: {got})", -1, t0, seconds)
            continue
        if rec is not None:
            rec.note("file", f"{root_dir}{path} (read {how})", 0, t0, seconds)
        for fn, ln in frames[path]:
            if ln in got:
                out[f"{fn}:{ln}"] = got[ln].strip()
    return out, skipped
