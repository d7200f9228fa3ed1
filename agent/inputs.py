"""Files the operator names as input (a saved profile, a preflight profile or replay file), opened
so that no path can hang or poke the agent: only a regular file is opened, and never with a
blocking open. A FIFO another user left where the file was expected would otherwise block open()
until someone writes to it; a device (/dev/watchdog, a tape) may act on being opened at all. Links
are followed: the operator named the path."""
from __future__ import annotations

import errno
import os
import stat
from typing import BinaryIO

NOT_REGULAR = "not a regular file (a FIFO, a device or a socket is never read)"


def open_input(path: str) -> BinaryIO:
    """`path` opened for reading in binary mode. Raises OSError (strerror: one line) when it is not
    a regular file, before anything is opened, and again if it changed into one meanwhile."""
    if not stat.S_ISREG(os.stat(path).st_mode):
        raise OSError(errno.EINVAL, NOT_REGULAR, path)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, NOT_REGULAR, path)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
