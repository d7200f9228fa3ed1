"""Strings that every XML 1.0 reader accepts, for the SVG and HTML views.

A function, file or thread name comes from the target (or from a bundle or profile someone handed
over). XML 1.0 allows only #x9 | #xA | #xD | [#x20-#xD7FF] | [#xE000-#xFFFD] | [#x10000-#x10FFFF]:
one ESC, 0x01, form feed, lone surrogate or U+FFFE in a name would make a standalone SVG not
well-formed, and a browser then draws an error instead of the graph (a job could hide its own
profile). Such characters are written as visible escapes (`\\x1b`, `\\ud800`, `\\ufffe`), the
same form the terminal view uses, so a reader sees that the name was odd. So are the characters
that XML allows but that hide or reorder text: DEL, C1 controls and Unicode bidirectional
controls (as in the terminal view).

`escape` is the one escaping function of every XML and HTML writer: text and attribute values.
"""
from __future__ import annotations

import html
import re
from typing import Any

# Not an XML 1.0 Char: C0 controls but tab, newline, carriage return; surrogates; U+FFFE, U+FFFF.
XML_FORBIDDEN = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")
# Shown escaped: the above, and DEL, C1 controls and bidirectional controls.
_SHOWN_ESCAPED = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
                            "\ud800-\udfff\ufffe\uffff]")


def _visible(m: re.Match[str]) -> str:
    c = ord(m.group(0))
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def text(s: str) -> str:
    """`s` with every character XML 1.0 forbids (and the invisible controls) written as `\\xNN`/`\\uNNNN`."""
    return _SHOWN_ESCAPED.sub(_visible, s)


def escape(x: Any, quote: bool = True) -> str:
    """`x` as XML/HTML text or attribute value: markup characters as entities, forbidden ones visible."""
    return html.escape(text("" if x is None else str(x)), quote=quote)


def is_well_formed_text(s: str) -> bool:
    """Whether `s` holds no character that XML 1.0 forbids."""
    return XML_FORBIDDEN.search(s) is None
