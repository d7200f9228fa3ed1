"""The one way trainprobe writes a file: atomic, private when it holds stacks or argv, given back
to the operator behind `sudo`.

- A temporary file is created with mkstemp (O_EXCL, an unpredictable name) in the destination's
  own directory, written, flushed, given its final mode, then renamed over the destination: a
  reader never sees half a file, and a link planted at the destination is replaced, not followed.
- `private=True` (reports, bundles, flame graphs, raw captures: they hold the target's stacks and
  command line) gives mode 0600; `private=False` (metrics files other tools read) gives 0644.
- Run as root under sudo, the file (and a directory this module creates) is chowned to
  SUDO_UID/SUDO_GID, so the operator's own directory holds no root-owned output.
"""
from __future__ import annotations

import errno
import os
import stat
import re
import tempfile
from typing import Any

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
