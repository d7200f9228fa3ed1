"""Open a file that a watched process named, only as that process's own user could, and only if it
is a regular file of a real file system.

A watched process chooses the names of its frames' files (`compile(src, "/proc/1/maps", "exec")`),
and trainprobe usually runs as root. A name is resolved below the target's root directory (an
O_PATH descriptor of /proc/PID/root), one component at a time (O_PATH|O_NOFOLLOW; symbolic links
followed by hand inside that root, at most 40), so no absolute link, `..` or /proc magic link leads
outside the target's view. The file must then be:

- a regular file (fstat of the descriptor: never a FIFO, socket or device), of size 1..max bytes;
- on a real file system: the file system's magic number (fstatfs f_type; the mount's type in
  /proc/self/mountinfo if fstatfs cannot be called) is none of procfs, sysfs, cgroupfs, debugfs,
  tracefs, bpffs, securityfs, configfs and the other pseudo file systems in PSEUDO_FS. procfs
  checks ptrace access when a file is opened and reports size 0; neither protects a reader running
  as root, so such files are never opened for reading at all;
- the same inode when it is opened for reading as when it was checked (st_dev, st_ino).

Whose rights decide: run by `serve` in a child process that has the target's uid, gid and groups
(`sourcelines` starts it), the kernel decides every search and the open (ACLs, LSMs, root-squashed
NFS included). In-process, `creds` must be given and is checked by hand against the owner, group
and mode of every directory on the way and of the file (ACLs not consulted).

Standard library only, and no syntax newer than Python 3.6: `serve` runs under whatever python3
the target's user can execute (`python3 -I -S`), with this file's text handed over on stdin.
"""
import errno
import json
import os
import stat
import sys

MAX_SYMLINKS = 40               # as the kernel's own limit (ELOOP)
MAX_LINE_CHARS = 2000           # a longer source line is cut

# linux/magic.h: file systems whose files are kernel objects, not stored data.
PSEUDO_FS = {
    0x9fa0: "proc", 0x62656572: "sysfs", 0x27e0eb: "cgroup", 0x63677270: "cgroup2",
    0x64626720: "debugfs", 0x74726163: "tracefs", 0xcafe4a11: "bpf", 0x73636673: "securityfs",
    0x62656570: "configfs", 0x1cd1: "devpts", 0x6165676c: "pstore", 0xde5e81e4: "efivarfs",
    0xf97cff8c: "selinuxfs", 0x43415d53: "smackfs", 0x5a3c69f0: "apparmorfs", 0x42494e4d: "binfmt_misc",
    0x958458f6: "hugetlbfs", 0x19800202: "mqueue", 0x65735543: "fusectl", 0x67596969: "rpc_pipefs",
    0x6e667364: "nfsd", 0x0187: "autofs", 0x7655821: "resctrl", 0x6c6f6f70: "binder",
    0xabba1974: "xenfs", 0x9fa1: "openpromfs", 0x9fa2: "usbdevfs", 0x50495045: "pipefs",
    0x534f434b: "sockfs", 0x09041934: "anon_inodefs", 0x6e736673: "nsfs", 0x50494446: "pidfs",
    0x62646576: "bdev", 0x454d444d: "devmem", 0x444d4142: "dmabuf", 0x5345434d: "secretmem",
}
PSEUDO_FS_NAMES = frozenset(PSEUDO_FS.values()) | {"devtmpfs", "ipathfs", "oprofilefs", "gadgetfs",
                                                   "functionfs", "spufs", "ocfs2_dlmfs", "zonefs_dev"}


class Skip(Exception):
    """Why one file was not read."""


def may(st, uid, groups, bit):
    """DAC check of one permission bit (4 read, 1 search) for uid/groups; root passes."""
    if uid == 0:
        return True
    if st.st_uid == uid:
        return bool(st.st_mode & (bit << 6))
    if st.st_gid in groups:
        return bool(st.st_mode & (bit << 3))
    return bool(st.st_mode & bit)


_statfs = []          # [callable] once fstatfs has been looked up, [None] if it cannot be


def _fstatfs_magic(fd):
    """f_type of the file system holding fd (also an O_PATH fd, Linux 3.12+); None if not callable."""
    if not _statfs:
        try:
            import ctypes
            libc = ctypes.CDLL(None, use_errno=True)
            word = ctypes.c_uint32 if os.uname().machine == "s390x" else ctypes.c_ulong
            _statfs.append((ctypes, libc.fstatfs, word))
        except Exception:  # noqa: BLE001 - no ctypes here: fall back to mountinfo
            _statfs.append(None)
    if _statfs[0] is None:
        return None
    ctypes, fstatfs, word = _statfs[0]
    buf = ctypes.create_string_buffer(512)      # struct statfs; f_type is its first member
    if fstatfs(fd, buf) != 0:
        err = ctypes.get_errno()
        raise Skip("cannot tell its file system: " + os.strerror(err))
    return word.from_buffer(buf).value & 0xffffffff


def _mountinfo_type(fd):
    """The mount's file system type, from /proc/self/fdinfo and /proc/self/mountinfo."""
    try:
        with open("/proc/self/fdinfo/%d" % fd) as fh:
            mnt = next((ln.split()[1] for ln in fh if ln.startswith("mnt_id:")), None)
        with open("/proc/self/mountinfo") as fh:
            for ln in fh:
                left, sep, right = ln.partition(" - ")
                if sep and left.split(" ", 1)[0] == mnt:
                    return right.split()[0]
    except (OSError, IndexError):
        pass
    return None


def pseudo_fs(fd):
    """The name of the pseudo file system holding fd, or None for a real one; Skip if unknown."""
    magic = _fstatfs_magic(fd)
    if magic is not None:
        return PSEUDO_FS.get(magic)
    name = _mountinfo_type(fd)
    if name is None:
        raise Skip("cannot tell its file system")
    return name if name in PSEUDO_FS_NAMES else None


def _check_file(st, fd, max_bytes):
    if not stat.S_ISREG(st.st_mode):
        raise Skip("not a regular file")
    name = pseudo_fs(fd)
    if name is not None:
        raise Skip("on %s, a pseudo file system: not a source file" % name)
    if st.st_size == 0:
        raise Skip("size 0: empty, or not a stored file")
    if st.st_size > max_bytes:
        raise Skip("larger than %d MiB" % (max_bytes >> 20) if max_bytes >= 1 << 20 else
                   "larger than %d bytes" % max_bytes)


def open_below(root_fd, path, creds=None, max_bytes=4 << 20):
    """Open `path` (absolute, as the target sees it) below the directory `root_fd`, for reading.

    creds: (uid, groups) to check by hand, or None when this process already has the target's
    credentials and the kernel decides. Returns the fd of a checked regular file; raises Skip.
    """
    if isinstance(path, str):
        try:
            path = os.fsencode(path)
        except UnicodeError:
            raise Skip("a name this system cannot encode") from None
    if not path.startswith(b"/"):
        raise Skip("not an absolute path")
    if b"\0" in path:
        raise Skip("a name with a NUL byte")
    flags_path = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
    fds = [os.dup(root_fd)]       # the directories walked so far; fds[-1] is the current one
    pending = [c for c in path.split(b"/") if c not in (b"", b".")]
    links = 0
    try:
        while pending:
            comp = pending.pop(0)
            if comp == b"..":
                if len(fds) > 1:
                    os.close(fds.pop())
                continue
            cur = fds[-1]
            if creds is not None and not may(os.fstat(cur), creds[0], creds[1], 1):
                raise Skip("the target's user cannot search a directory on the way")
            try:
                fd = os.open(comp, flags_path, dir_fd=cur)
            except OSError as exc:
                if exc.errno in (errno.EACCES, errno.EPERM):
                    raise Skip("the target's user cannot search a directory on the way") from None
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
                if target.startswith(b"/"):
                    while len(fds) > 1:
                        os.close(fds.pop())
                pending = [c for c in target.split(b"/") if c not in (b"", b".")] + pending
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
            try:
                # Checked on the O_PATH descriptor, before anything is opened for reading.
                _check_file(st, fd, max_bytes)
            finally:
                os.close(fd)
            if creds is not None and not may(st, creds[0], creds[1], 4):
                raise Skip("the target's user may not read it")
            try:
                real = os.open(comp, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_NOCTTY | os.O_CLOEXEC,
                               dir_fd=cur)
            except OSError as exc:
                if exc.errno in (errno.EACCES, errno.EPERM):
                    raise Skip("the target's user may not read it") from None
                raise Skip(exc.strerror or "cannot open") from None
            try:
                st2 = os.fstat(real)
                if (st2.st_dev, st2.st_ino) != (st.st_dev, st.st_ino):
                    raise Skip("replaced while it was opened")
                _check_file(st2, real, max_bytes)
                if creds is not None and not may(st2, creds[0], creds[1], 4):
                    raise Skip("the target's user may not read it")
            except BaseException:
                os.close(real)
                raise
            return real
        raise Skip("a directory")
    finally:
        for fd in fds:
            os.close(fd)


def read_fd(fd, max_bytes):
    """At most max_bytes of a non-blocking fd, whole; Skip if more."""
    chunks, n = [], 0
    while n <= max_bytes:
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
    if n > max_bytes:
        raise Skip("larger than %d MiB" % (max_bytes >> 20))
    return b"".join(chunks)


def read_lines(root_fd, path, creds=None, max_bytes=4 << 20):
    fd = open_below(root_fd, path, creds, max_bytes)
    try:
        data = read_fd(fd, max_bytes)
    finally:
        os.close(fd)
    return data.decode("utf-8", errors="replace").splitlines()


def answer(request):
    """The lines asked for: request {"root_fd", "max_bytes", "files": [[path hex, [line, ...]], ...]}
    -> [{"lines": {"N": text}} or {"skip": why}, ...] in the same order."""
    root_fd, max_bytes = int(request["root_fd"]), int(request["max_bytes"])
    creds = request.get("creds")
    if creds is not None:
        creds = (int(creds[0]), frozenset(int(g) for g in creds[1]))
    out = []
    for path_hex, wanted in request["files"]:
        try:
            lines = read_lines(root_fd, bytes.fromhex(path_hex), creds, max_bytes)
            out.append({"lines": {str(n): lines[n - 1][:MAX_LINE_CHARS] for n in wanted if 0 < n <= len(lines)}})
        except Skip as exc:
            out.append({"skip": str(exc)})
        except Exception as exc:  # noqa: BLE001 - one odd file never sinks the others
            out.append({"skip": "cannot read: %s" % (getattr(exc, "strerror", None) or type(exc).__name__)})
    return out


def serve():
    """Child mode: a JSON request on stdin (after this file's own text), the answer on stdout."""
    request = json.loads(sys.stdin.buffer.read().decode("ascii"))
    sys.stdout.buffer.write(json.dumps({"uid": os.getuid(), "files": answer(request)}).encode("ascii"))
    sys.stdout.buffer.flush()


if __name__ == "__main__":
    serve()
