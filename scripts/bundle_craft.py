"""Hand-made tar streams for the hostile-bundle tests: headers written field by field (not through
tarfile, which would refuse to write most of them), streamed through gzip so a bomb of GiBs costs
a few MB on disk and almost no memory to make."""
from __future__ import annotations

import json
import zlib
from typing import Iterable, Iterator

BLOCK = 512


def octal(n: int, width: int) -> bytes:
    return (b"%0*o" % (width - 1, n)) + b"\0"


def header(name: bytes | str, size: int = 0, typeflag: bytes = b"0", linkname: bytes | str = b"",
           mode: int = 0o600, size_field: bytes | None = None, magic: bytes = b"ustar\x0000",
           prefix: bytes = b"", checksum: bytes | None = None, mtime: int = 1_700_000_000) -> bytes:
    """One 512-byte ustar header. size_field, magic and checksum may be given raw to damage them."""
    name = name.encode() if isinstance(name, str) else name
    linkname = linkname.encode() if isinstance(linkname, str) else linkname
    if size_field is None:
        size_field = octal(size, 12) if size < 8 ** 11 else b"\x80" + size.to_bytes(11, "big")
    h = bytearray(BLOCK)

    def put(off: int, width: int, data: bytes) -> None:
        h[off:off + width] = data[:width].ljust(width, b"\0")

    put(0, 100, name)
    put(100, 8, octal(mode, 8))
    put(108, 8, octal(0, 8))
    put(116, 8, octal(0, 8))
    put(124, 12, size_field)
    put(136, 12, octal(mtime, 12))
    put(148, 8, b" " * 8)
    put(156, 1, typeflag)
    put(157, 100, linkname)
    put(257, 8, magic)
    put(345, 155, prefix)
    if checksum is None:
        checksum = b"%06o\0 " % sum(h)
    put(148, 8, checksum)
    return bytes(h)


def pad(n: int) -> bytes:
    return b"\0" * (-n % BLOCK)


def member(name: str, data: bytes, **kw) -> bytes:
    return header(name, len(data), **kw) + data + pad(len(data))


def pax_record(key: str, value: str) -> bytes:
    body = f" {key}={value}\n".encode()
    n = len(body) + 1
    while len(str(n)) + len(body) != n:
        n = len(str(n)) + len(body)
    return str(n).encode() + body


def pax(records: bytes, typeflag: bytes = b"x", name: str = "b/PaxHeaders/x") -> bytes:
    return header(name, len(records), typeflag=typeflag) + records + pad(len(records))


END = b"\0" * (2 * BLOCK)


def index(captures: list[str], **extra) -> bytes:
    doc = {"schema": "trainprobe.bundle/1", "tool": {"name": "trainprobe", "version": "0"}, "saved_unix": 1.0,
           "context": {}, "overhead": {}, "notes": [], "captures": captures}
    doc.update(extra)
    return json.dumps(doc).encode()


def gzip_stream(parts: Iterable[bytes], level: int = 6) -> Iterator[bytes]:
    z = zlib.compressobj(level, zlib.DEFLATED, 16 + 15)
    for p in parts:
        out = z.compress(p)
        if out:
            yield out
    yield z.flush()


def write_tgz(path, parts: Iterable[bytes], level: int = 6) -> None:
    with open(path, "wb") as fh:
        for chunk in gzip_stream(parts, level):
            fh.write(chunk)


def repeated(byte: bytes, n: int, chunk: int = 1 << 20) -> Iterator[bytes]:
    block = byte * chunk
    while n > 0:
        k = min(n, chunk)
        yield block[:k]
        n -= k


def pax_bomb_parts(payload_bytes: int, then: bytes = b"") -> Iterator[bytes]:
    """An extended (PAX) header of payload_bytes, one `comment` record, before `then`."""
    key = b" comment="
    value_len = payload_bytes - len(key) - 1
    n = payload_bytes
    while len(str(n)) + len(key) + value_len + 1 != n:
        value_len -= 1
    total = len(str(n)) + len(key) + value_len + 1
    yield header("b/PaxHeaders/bundle.json", total, typeflag=b"x")
    yield str(n).encode() + key
    yield from repeated(b"a", value_len)
    yield b"\n" + pad(total)
    yield then


def gzip_bomb_parts(member_bytes: int, members: int = 1, name: str = "b/captures/c{}.json") -> Iterator[bytes]:
    """A valid index listing `members` captures, each of member_bytes of spaces (valid JSON
    whitespace, so only a size bound stops it)."""
    names = [name.format(i) for i in range(members)]
    yield member("b/bundle.json", index([n[2:] for n in names]))
    for n in names:
        yield header(n, member_bytes)
        yield from repeated(b" ", member_bytes)
        yield pad(member_bytes)
    yield END
