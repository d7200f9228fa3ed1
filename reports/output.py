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

import os
import tempfile

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


def write(path: str, data: str | bytes, private: bool = True) -> str:
    """Write `data` to `path` atomically with the mode and owner described above. Raises OSError."""
    if isinstance(data, str):
        data = data.encode("utf-8")
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
