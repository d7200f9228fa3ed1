"""A bounded reader of a gzip-compressed tar stream, for bundles that come from someone else.

Python's tarfile reads a whole extended (PAX) header or GNU long name into memory before any caller
can look at its size (a 1 GiB PAX header in a 5 MB file costs GBs of memory and tens of seconds), and
it follows the archive wherever the headers lead. This reader reads the 512-byte headers itself
and checks every size before it reads what the size announces:

- an extended header (PAX `x`/`g`, GNU `L`/`K`) holds at most MAX_EXT_BYTES; its records are parsed
  one by one (`path`, `size` are applied to the next member; sparse files are refused);
- a member's size must be an octal or base-256 number, positive, at most the member cap, and the
  sizes of all regular members together at most the total cap; the gzip stream is inflated only
  as far as needed (zlib with an output limit), and past RATIO_FLOOR a stream that inflates more
  than MAX_RATIO:1 is a gzip bomb, refused before the caps are reached;
- at most max_members headers; names must be UTF-8, relative, without `..`, at most MAX_NAME_CHARS;
- a member may be a regular file or a directory; a link, device, FIFO or any other kind is refused.

Every refusal is a TarRefused with one line. Nothing is written anywhere: members are returned in
memory, and only those the caller wants; the others are skipped without being kept.
"""
from __future__ import annotations

import re
import zlib
from typing import BinaryIO, Callable

BLOCK = 512
MAX_EXT_BYTES = 64 << 10
MAX_NAME_CHARS = 1024
MAX_NAME_PARTS = 16
_READ = 1 << 16
# Bundles compress 10-40:1 (JSON traces); a gzip bomb 1000:1. Past RATIO_FLOOR decompressed bytes a
# stream that inflates more than MAX_RATIO:1 is refused before the caps are reached.
MAX_RATIO = 200
RATIO_FLOOR = 16 << 20
_RECORD_LEN = re.compile(rb"(\d{1,20}) ")
_KINDS = {b"1": "a hard link", b"2": "a symbolic link", b"3": "a character device", b"4": "a block device",
          b"6": "a FIFO", b"7": "a contiguous file", b"S": "a sparse file", b"V": "a volume label",
          b"M": "a multi-volume continuation", b"D": "a GNU dump directory", b"N": "an old GNU long name"}


class TarRefused(Exception):
    """The stream is not a tar archive this reader accepts: one line, the path not included."""


class _Inflate:
    """The decompressed stream, read exactly as far as asked (concatenated gzip members too)."""

    def __init__(self, fh: BinaryIO):
        self.fh = fh
        self.z = zlib.decompressobj(16 + zlib.MAX_WBITS)
        self.started = False
        self.bytes_in = 0
        self.bytes_out = 0

    def _more(self) -> bytes:
        data = self.fh.read(_READ)
        self.bytes_in += len(data)
        return data

    def read(self, n: int) -> bytes:
        out: list[bytes] = []
        have = 0
        while have < n:
            if self.z.eof:
                data = self.z.unused_data.lstrip(b"\0")       # gzip allows zero padding after a member
                while not data:
                    more = self._more()
                    if not more:
                        return b"".join(out)
                    data = more.lstrip(b"\0")
                self.z = zlib.decompressobj(16 + zlib.MAX_WBITS)
            else:
                data = self.z.unconsumed_tail or self._more()
                if not data:
                    if not self.started:
                        raise TarRefused("an empty file")
                    raise TarRefused("the gzip stream is truncated")
            self.started = True
            try:
                piece = self.z.decompress(data, min(n - have, 1 << 20))
            except zlib.error as exc:
                raise TarRefused(f"not a gzip stream ({exc})") from None
            if piece:
                out.append(piece)
                have += len(piece)
                self.bytes_out += len(piece)
                if self.bytes_out > RATIO_FLOOR and self.bytes_out > MAX_RATIO * self.bytes_in:
                    raise TarRefused(f"it inflates more than {MAX_RATIO}:1 past {RATIO_FLOOR >> 20} MiB "
                                     f"({self.bytes_in:,} bytes to {self.bytes_out:,}): a gzip bomb, not a bundle")
        return b"".join(out)

    def exactly(self, n: int, what: str) -> bytes:
        data = self.read(n)
        if len(data) != n:
            raise TarRefused(f"the archive ends inside {what}")
        return data

    def skip(self, n: int, what: str) -> None:
        while n > 0:
            k = min(n, 1 << 20)
            self.exactly(k, what)
            n -= k


def _number(field: bytes, what: str) -> int:
    if field and field[0] & 0x80:                              # GNU base-256
        if field[0] == 0xFF:
            raise TarRefused(f"a negative {what}")
        return int.from_bytes(bytes([field[0] & 0x7F]) + field[1:], "big")
    s = field.split(b"\0", 1)[0].strip(b" ")
    if not s:
        return 0
    if s.strip(b"01234567"):
        raise TarRefused(f"a {what} that is not a number ({s[:20]!r})")
    return int(s, 8)


def _checksum_ok(h: bytes) -> bool:
    want = _number(h[148:156], "header checksum")
    unsigned = sum(h[:148]) + 8 * 32 + sum(h[156:])
    signed = sum(b - 256 if b > 127 else b for b in h[:148] + h[156:]) + 8 * 32
    return want in (unsigned, signed)


def _pax_records(payload: bytes) -> list[tuple[str, str]]:
    """`LEN key=value\\n` records, each LEN counting the whole record."""
    out = []
    pos = 0
    while pos < len(payload):
        if payload[pos:].strip(b"\0") == b"":
            break
        m = _RECORD_LEN.match(payload, pos)
        if not m:
            raise TarRefused("an extended header with a malformed record")
        length = int(m.group(1))
        end = pos + length
        if length <= len(m.group(0)) or end > len(payload) or payload[end - 1:end] != b"\n":
            raise TarRefused("an extended header with a malformed record length")
        key, eq, value = payload[m.end():end - 1].partition(b"=")
        if not eq:
            raise TarRefused("an extended header record without `=`")
        try:
            out.append((key.decode("utf-8"), value.decode("utf-8")))
        except UnicodeDecodeError:
            raise TarRefused("an extended header record that is not UTF-8") from None
        pos = end
    return out


def _name(raw: bytes) -> str:
    try:
        name = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise TarRefused(f"a member name that is not UTF-8 ({raw[:60]!r})") from None
    if len(name) > MAX_NAME_CHARS:
        raise TarRefused(f"a member name longer than {MAX_NAME_CHARS} characters")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if name.startswith("/") or ".." in name.split("/") or "\0" in name:
        raise TarRefused(f"unsafe member name {name!r} (absolute or with ..)")
    if len(parts) > MAX_NAME_PARTS:
        raise TarRefused(f"a member name deeper than {MAX_NAME_PARTS} directories ({name[:80]!r}...)")
    return "/".join(parts)


def read(fh: BinaryIO, want: Callable[[str], bool], max_member: int, max_total: int,
         max_members: int) -> dict[str, bytes]:
    """The regular members `want` accepts, by name (normalised: no `./`, no trailing `/`)."""
    src = _Inflate(fh)
    out: dict[str, bytes] = {}
    seen: set[str] = set()
    total = 0
    pending_name: str | None = None
    pending_size: int | None = None
    headers = 0
    while True:
        h = src.read(BLOCK)
        if not h:
            if pending_name is not None or pending_size is not None:
                raise TarRefused("the archive ends after an extended header")
            return out                         # no end-of-archive blocks: tar itself accepts that
        if len(h) < BLOCK:
            raise TarRefused("the archive ends inside a header")
        if h == bytes(BLOCK):
            return out                         # the end of the archive: nothing after it is read
        headers += 1
        if headers > max_members:
            raise TarRefused(f"more than {max_members} members: not a trainprobe bundle")
        if not _checksum_ok(h):
            raise TarRefused("a header with a bad checksum (not a tar archive, or a damaged one)")
        kind = h[156:157]
        size = _number(h[124:136], "member size")
        if kind in (b"x", b"g", b"L", b"K"):
            if size > MAX_EXT_BYTES:
                label = "an extended (PAX) header" if kind in (b"x", b"g") else "a GNU long name"
                raise TarRefused(f"{label} of {size:,} bytes (at most {MAX_EXT_BYTES >> 10} KiB)")
            payload = src.exactly(size, "an extended header")
            src.exactly(-size % BLOCK, "an extended header")
            if kind == b"L":
                pending_name = _name(payload.split(b"\0", 1)[0])
            elif kind in (b"x", b"g"):
                for key, value in _pax_records(payload):
                    if key.startswith("GNU.sparse"):
                        raise TarRefused("a sparse member: a bundle holds only regular files")
                    if key in ("path", "size", "linkpath") and kind == b"g":
                        raise TarRefused(f"a global extended header that sets {key}")
                    if key == "path":
                        pending_name = _name(value.encode())
                    elif key == "size":
                        if not value.isascii() or not value.isdigit() or len(value) > 20:
                            raise TarRefused(f"an extended header with a size that is not a number ({value[:20]!r})")
                        pending_size = int(value)
            continue
        raw = h[0:100].split(b"\0", 1)[0]
        if h[257:263] == b"ustar\0" and h[345:500].strip(b"\0"):
            raw = h[345:500].split(b"\0", 1)[0] + b"/" + raw
        name = pending_name if pending_name is not None else _name(raw)
        if pending_size is not None:
            size = pending_size
        pending_name = pending_size = None
        if kind == b"\0" and raw.endswith(b"/"):
            kind = b"5"
        if kind == b"5":
            continue                           # a directory: no data follows its header
        if kind not in (b"0", b"\0"):
            what = _KINDS.get(kind, f"of the unknown type {kind!r}")
            raise TarRefused(f"{name!r} is {what}: a bundle holds only regular files and directories")
        if size > max_member:
            raise TarRefused(f"{name} is larger than {max_member >> 20} MiB")
        total += size
        if total > max_total:
            raise TarRefused(f"larger than {max_total >> 20} MiB in all")
        if name in seen:
            raise TarRefused(f"{name} appears twice in the archive")
        seen.add(name)
        if want(name):
            out[name] = src.exactly(size, name)
        else:
            src.skip(size, name)
        src.exactly(-size % BLOCK, name)
