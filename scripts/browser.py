"""A headless Chromium driven over the DevTools protocol (--remote-debugging-pipe), standard library only.

Opens a local file, records console messages, uncaught exceptions, log entries and every network
request, evaluates JavaScript in the page, dispatches real mouse events and takes screenshots.
Screenshots are decoded with zlib (8-bit RGB/RGBA PNG) so tests can count pixels.
"""
from __future__ import annotations

import base64
import json
import os
import select
import shutil
import struct
import subprocess
import tempfile
import time
import zlib
from dataclasses import dataclass, field
from typing import Any

FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--no-default-browser-check",
         "--disable-extensions", "--hide-scrollbars", "--mute-audio")


def chromium_binary() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        p = shutil.which(name)
        if p:
            return p
    return None


class BrowserError(RuntimeError):
    pass


@dataclass
class PageLog:
    console: list[dict[str, Any]] = field(default_factory=list)     # {"type", "text"}
    exceptions: list[str] = field(default_factory=list)
    log_entries: list[dict[str, Any]] = field(default_factory=list)  # {"level", "text", "url"}
    requests: list[str] = field(default_factory=list)

    def errors(self) -> list[str]:
        out = [f"console.{c['type']}: {c['text']}" for c in self.console if c["type"] in ("error", "assert")]
        out += [f"exception: {e}" for e in self.exceptions]
        out += [f"log {e['level']}: {e['text']} ({e.get('url', '')})" for e in self.log_entries
                if e["level"] == "error"]
        return out


class Chromium:
    """One headless browser with one page. Use as a context manager."""

    def __init__(self, width: int = 1280, height: int = 900, timeout_s: float = 60.0):
        exe = chromium_binary()
        if exe is None:
            raise BrowserError("chromium not found (apt-get install chromium)")
        self.width, self.height, self.timeout_s = width, height, timeout_s
        self.profile = tempfile.mkdtemp(prefix="trainprobe-chromium-")
        to_r, to_w = os.pipe()         # we write commands, Chromium reads them on fd 3
        from_r, from_w = os.pipe()     # Chromium writes replies on fd 4, we read them

        def wire() -> None:
            a, b = os.dup(to_r), os.dup(from_w)
            os.dup2(a, 3)
            os.dup2(b, 4)

        self.proc = subprocess.Popen(
            [exe, *FLAGS, f"--user-data-dir={self.profile}", "--remote-debugging-pipe",
             f"--window-size={width},{height}", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            preexec_fn=wire, close_fds=False)
        os.close(to_r)
        os.close(from_w)
        self._w, self._r = to_w, from_r
        self._buf = b""
        self._id = 0
        self._events: list[dict[str, Any]] = []
        self.session: str | None = None
        self.log = PageLog()

    # -- protocol ----------------------------------------------------------------------------
    def _send(self, method: str, params: dict[str, Any] | None = None, session: str | None = None) -> int:
        self._id += 1
        msg: dict[str, Any] = {"id": self._id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._w, json.dumps(msg).encode() + b"\0")
        return self._id

    def _read_one(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BrowserError("timed out waiting for Chromium")
            ready, _, _ = select.select([self._r], [], [], left)
            if not ready:
                continue
            chunk = os.read(self._r, 1 << 20)
            if not chunk:
                err = self.proc.stderr.read().decode(errors="replace")[-2000:] if self.proc.stderr else ""
                raise BrowserError(f"Chromium closed the pipe: {err}")
            self._buf += chunk
        raw, self._buf = self._buf.split(b"\0", 1)
        msg = json.loads(raw)
        if "method" in msg:
            self._on_event(msg)
        return msg

    def _on_event(self, msg: dict[str, Any]) -> None:
        self._events.append(msg)
        m, p = msg["method"], msg.get("params", {})
        if m == "Runtime.consoleAPICalled":
            text = " ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", []))
            self.log.console.append({"type": p.get("type"), "text": text})
        elif m == "Runtime.exceptionThrown":
            d = p.get("exceptionDetails", {})
            self.log.exceptions.append(d.get("exception", {}).get("description") or d.get("text", ""))
        elif m == "Log.entryAdded":
            e = p.get("entry", {})
            self.log.log_entries.append({"level": e.get("level"), "text": e.get("text"), "url": e.get("url")})
        elif m == "Network.requestWillBeSent":
            self.log.requests.append(p.get("request", {}).get("url", ""))

    def call(self, method: str, params: dict[str, Any] | None = None, browser: bool = False) -> dict[str, Any]:
        mid = self._send(method, params, None if browser else self.session)
        deadline = time.monotonic() + self.timeout_s
        while True:
            msg = self._read_one(deadline)
            if msg.get("id") == mid:
                if "error" in msg:
                    raise BrowserError(f"{method}: {msg['error']}")
                return msg.get("result", {})

    def wait_event(self, method: str, timeout_s: float | None = None) -> dict[str, Any]:
        for i, ev in enumerate(self._events):
            if ev["method"] == method:
                return self._events.pop(i)
        deadline = time.monotonic() + (timeout_s or self.timeout_s)
        while True:
            msg = self._read_one(deadline)
            if msg.get("method") == method:
                self._events.remove(msg)
                return msg

    # -- lifecycle -----------------------------------------------------------------------------
    def __enter__(self) -> "Chromium":
        try:
            targets = self.call("Target.getTargets", browser=True)["targetInfos"]
            page = next((t for t in targets if t["type"] == "page"), None)
            tid = page["targetId"] if page else self.call("Target.createTarget", {"url": "about:blank"},
                                                          browser=True)["targetId"]
            self.session = self.call("Target.attachToTarget", {"targetId": tid, "flatten": True},
                                     browser=True)["sessionId"]
            for dom in ("Page", "Runtime", "Log", "Network"):
                self.call(f"{dom}.enable")
            self.call("Emulation.setDeviceMetricsOverride",
                      {"width": self.width, "height": self.height, "deviceScaleFactor": 1, "mobile": False})
        except Exception:
            self.close()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        try:
            if self.proc.poll() is None:
                try:
                    self._send("Browser.close")
                except OSError:
                    pass
                try:
                    self.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
        finally:
            for fd in (self._w, self._r):
                try:
                    os.close(fd)
                except OSError:
                    pass
            shutil.rmtree(self.profile, ignore_errors=True)

    # -- page ----------------------------------------------------------------------------------
    def open(self, path: str) -> None:
        url = path if "://" in path else "file://" + os.path.abspath(path)
        self._events = [e for e in self._events if e["method"] != "Page.loadEventFired"]
        self.call("Page.navigate", {"url": url})
        self.wait_event("Page.loadEventFired")
        self.eval("new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))", await_promise=True)

    def eval(self, expr: str, await_promise: bool = False) -> Any:
        res = self.call("Runtime.evaluate", {"expression": expr, "returnByValue": True,
                                             "awaitPromise": await_promise})
        if "exceptionDetails" in res:
            d = res["exceptionDetails"]
            raise BrowserError(f"{expr[:80]}: {d.get('exception', {}).get('description') or d.get('text')}")
        return res.get("result", {}).get("value")

    def dom(self) -> str:
        return self.eval("document.documentElement.outerHTML")

    def mouse(self, kind: str, x: float, y: float) -> None:
        """kind: mouseMoved | mousePressed | mouseReleased (pressed/released use the left button)."""
        params: dict[str, Any] = {"type": kind, "x": x, "y": y}
        if kind != "mouseMoved":
            params.update(button="left", clickCount=1)
        self.call("Input.dispatchMouseEvent", params)

    def click(self, x: float, y: float) -> None:
        self.mouse("mouseMoved", x, y)
        self.mouse("mousePressed", x, y)
        self.mouse("mouseReleased", x, y)

    def screenshot(self, path: str, full_page: bool = False) -> "Image":
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            w, h = self.eval("[document.documentElement.scrollWidth, document.documentElement.scrollHeight]")
            params.update(captureBeyondViewport=True,
                          clip={"x": 0, "y": 0, "width": max(w, 1), "height": min(max(h, 1), 12000), "scale": 1})
        data = base64.b64decode(self.call("Page.captureScreenshot", params)["data"])
        with open(path, "wb") as fh:
            fh.write(data)
        return decode_png(data)


# -- PNG -------------------------------------------------------------------------------------------

@dataclass
class Image:
    width: int
    height: int
    channels: int
    rows: list[bytes]

    def pixel(self, x: int, y: int) -> tuple[int, ...]:
        c = self.channels
        return tuple(self.rows[y][x * c:(x + 1) * c][:3])

    def count_unlike(self, rgb: tuple[int, int, int], step: int = 1, tol: int = 8) -> int:
        """Pixels (every `step`-th in each direction) further than `tol` from `rgb`."""
        n = 0
        c = self.channels
        for y in range(0, self.height, step):
            row = self.rows[y]
            for x in range(0, self.width, step):
                i = x * c
                if (abs(row[i] - rgb[0]) > tol or abs(row[i + 1] - rgb[1]) > tol or abs(row[i + 2] - rgb[2]) > tol):
                    n += 1
        return n

    def colours(self, step: int = 4) -> set[tuple[int, ...]]:
        return {self.pixel(x, y) for y in range(0, self.height, step) for x in range(0, self.width, step)}


def decode_png(data: bytes) -> Image:
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    pos, idat = 8, []
    width = height = depth = ctype = interlace = 0
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, ctype, _cm, _fm, interlace = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat.append(body)
        elif kind == b"IEND":
            break
        pos += 12 + length
    if depth != 8 or ctype not in (2, 6) or interlace:
        raise ValueError(f"unsupported PNG (depth {depth}, colour type {ctype}, interlace {interlace})")
    c = 3 if ctype == 2 else 4
    raw = zlib.decompress(b"".join(idat))
    stride = width * c
    rows: list[bytes] = []
    prev = bytearray(stride)
    for y in range(height):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        if f == 1:
            for i in range(c, stride):
                line[i] = (line[i] + line[i - c]) & 0xFF
        elif f == 2:
            line = bytearray((a + b) & 0xFF for a, b in zip(line, prev))
        elif f == 3:
            for i in range(stride):
                left = line[i - c] if i >= c else 0
                line[i] = (line[i] + ((left + prev[i]) >> 1)) & 0xFF
        elif f == 4:
            for i in range(stride):
                a = line[i - c] if i >= c else 0
                b = prev[i]
                cc = prev[i - c] if i >= c else 0
                p = a + b - cc
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - cc)
                pr = a if (pa <= pb and pa <= pc) else (b if pb <= pc else cc)
                line[i] = (line[i] + pr) & 0xFF
        rows.append(bytes(line))
        prev = line
    return Image(width, height, c, rows)
