"""Bounded JSON: the one reader for JSON that another machine or another user handed over (bundles,
node payloads of `diagnose --slurm-job`, profiles, preflight replays).

`json.loads` alone is not safe on such text: it recurses once per nesting level (a document nested
a thousand deep ends in RecursionError, and every recursive walk over the result does too), and a
few MB of `[{},{},...]` become GBs of Python objects. So before parsing, the text is scanned with
bytes operations only (count, replace, translate, split: C speed, no recursion, no object per
value): the number of values is bounded from the commas and opening brackets, and the nesting depth
is measured on the brackets that lie outside strings. A document over a cap is refused with one
line naming the cap; nothing is parsed.
"""
from __future__ import annotations

import json
from itertools import accumulate
from typing import Any

from trainprobe.probes.errors import MalformedInput

MAX_DEPTH = 64                    # a report nests ~8 levels, a py-spy trace 4
MAX_BYTES = 256 << 20             # one document
MAX_VALUES = 2_000_000            # one document: a py-spy trace of ~200k events; ~130 MB as `[{},...]`

_KEEP = b'"[]{}'
_DROP = bytes(c for c in range(256) if c not in _KEEP)
_DELTA = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}
_CHUNK = 1 << 20


class JSONLimitError(MalformedInput):
    """A JSON document refused before parsing: over a cap, or not JSON text at all."""


def _bytes(data: str | bytes | bytearray, what: str) -> bytes:
    if isinstance(data, str):
        return data.encode("utf-8", "surrogatepass")
    if isinstance(data, (bytes, bytearray)):
        return bytes(data)
    raise JSONLimitError(f"{what}: not text ({type(data).__name__})")


def depth(data: bytes) -> int:
    """The nesting depth of a JSON text (exact for valid JSON), from its brackets outside strings.

    Escaped backslashes, then escaped quotes, are removed first, so every quote left opens or closes
    a string; everything but quotes and brackets is dropped; a pair of adjacent quotes (a string
    without brackets) goes too, which keeps the parity of the quotes before every bracket. What is
    left is split on quotes a chunk at a time, keeping the parts outside strings."""
    if b"\\" in data:
        data = data.replace(b"\\\\", b"").replace(b'\\"', b"")
    compact = data.translate(None, _DROP).replace(b'""', b"")
    outside: list[bytes] = []
    in_string = False
    for i in range(0, len(compact), _CHUNK):
        parts = compact[i:i + _CHUNK].split(b'"')
        outside.append(b"".join(parts[1 if in_string else 0::2]))
        in_string ^= (len(parts) - 1) % 2 == 1
    return max(accumulate(map(_DELTA.__getitem__, b"".join(outside))), default=0)


def check(data: str | bytes | bytearray, what: str = "JSON", max_bytes: int = MAX_BYTES,
          max_depth: int = MAX_DEPTH, max_values: int = MAX_VALUES) -> int:
    """Refuse (JSONLimitError) a document over a cap, without parsing it; return a bound on its
    number of values (what a caller adds to a budget shared by several documents)."""
    if len(data) > max_bytes:
        raise JSONLimitError(f"{what}: larger than {_size(max_bytes)} of JSON")
    raw = _bytes(data, what)
    # Every array element and object member follows a `[`, `{` or `,` (inside strings too: a bound).
    values = raw.count(b",") + raw.count(b"[") + raw.count(b"{") + 1
    if values > max_values:
        raise JSONLimitError(f"{what}: more than {max_values:,} JSON values")
    if depth(raw) > max_depth:
        raise JSONLimitError(f"{what}: nested deeper than {max_depth} levels")
    return values


def loads(data: str | bytes | bytearray, what: str = "JSON", max_bytes: int = MAX_BYTES,
          max_depth: int = MAX_DEPTH, max_values: int = MAX_VALUES, budget: list[int] | None = None) -> Any:
    """json.loads within the caps; JSONLimitError (a ValueError) on anything else, one line.
    `budget` ([values left]) is shared by several documents: each one's values are taken from it."""
    if budget is not None:
        max_values = min(max_values, budget[0])
    n = check(data, what, max_bytes, max_depth, max_values)
    if budget is not None:
        budget[0] -= n
    if not isinstance(data, str):
        try:
            data = bytes(data).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise JSONLimitError(f"{what}: not UTF-8 text (byte {exc.start})") from None
    try:
        return json.loads(data)
    except RecursionError:              # unreachable past check(); kept as the last line of defence
        raise JSONLimitError(f"{what}: nested too deep") from None
    except ValueError as exc:
        raise JSONLimitError(f"{what}: not valid JSON: {' '.join(str(exc).split())[:200]}") from None


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"
