"""Interactive SVG flame graphs, drawn from a folded profile ({"root;...;leaf": count}).

Each frame is a rectangle whose width is its inclusive count: the root (`all`) spans the total,
and the frames directly above any frame share at most its width (the rest is its own time).
Frames narrower than `minwidth_px` are left out, as flamegraph.pl does, so a profile with
50,000 distinct stacks still draws in a few thousand rectangles. The SVG carries its own script:
hover shows the frame and its share, click zooms into a frame (click `all` or "Reset zoom" to go
back), "Search" (or Ctrl-F, or `/`) highlights frames matching a regular expression and says what
share of the total they cover.

Colours: your code red-orange, installed packages and the standard library (a path with a `/`)
yellow, native or pseudo frames (`process`, `thread`) grey or lilac. In a differential graph
(`before=`), widths are the profile's and colours are the change in each frame's share of the
total since `before`: red where it grew, blue where it shrank, the deeper the larger the change.
"""
from __future__ import annotations

import re
import sys
import zlib
from dataclasses import dataclass, field
from typing import Mapping

from trainprobe.reports import xmlsafe

WIDTH = 1200
PAD = 10
FRAME_H = 16
FONT_SIZE = 12
CHAR_W = 0.59          # average glyph width as a share of the font size (Verdana-like sans)
TOP = 78               # title, two subtitle lines, buttons
BOTTOM = 28            # the details line
SEARCH_FILL = "rgb(230,0,230)"

_PY_FRAME = re.compile(r" \(([^()]*):(\d+)\)$")
_PY_FUNCTION = re.compile(r" \(([^()]*\.pyw?|<[^()]*>)\)$")        # a frame grouped by function: no line
WAIT_FILL = "rgb(120,160,215)"                                     # the frame waits: off-CPU (blocked)


@dataclass
class Layout:
    """Frames of a flame graph: (depth, start, count, label, path id); depth 0 is `all`."""

    total: int
    nodes: list[tuple[int, int, int, str, int]] = field(default_factory=list)
    max_depth: int = 0
    ids: dict[tuple[int, str], int] = field(default_factory=dict)
    pruned: int = 0           # frames left out for being narrower than the minimum width


def _common_prefix(a: list[str], b: list[str]) -> int:
    """Length of the common prefix of two stacks, by binary search on slices (compared in C)."""
    lo, hi = 0, min(len(a), len(b))
    if a[:hi] == b[:hi]:
        return hi
    while lo < hi:              # the answer lies in [lo, hi]: a[:lo] == b[:lo]
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def layout(profile: Mapping[str, int], min_count: float = 0.0, with_ids: bool = False) -> Layout:
    """Merge stacks into frames in one pass over the stacks sorted root first (flamegraph.pl's
    flow): a frame stays open while consecutive stacks share it, and closes with its width.

    Frames narrower than `min_count` are left out. A stack's frames below what it shares with
    its neighbours are as wide as its own count, so when that count is under `min_count` they are
    dropped before the pass: most frames of a large profile never get opened at all.
    `with_ids` numbers each frame path (for a differential graph).
    """
    items = sorted((k.split(";") if k else [], int(v)) for k, v in profile.items() if v > 0)
    count = len(items)
    lcp = [0] * (count + 1)
    for i in range(1, count):
        lcp[i] = _common_prefix(items[i - 1][0], items[i][0])
    pruned = 0
    if min_count > 0:
        for i, (frames, n) in enumerate(items):
            if n < min_count:
                keep = lcp[i] if lcp[i] > lcp[i + 1] else lcp[i + 1]
                if keep < len(frames):
                    pruned += len(frames) - keep
                    items[i] = (frames[:keep], n)
    ids: dict[tuple[int, str], int] = {}
    nodes: list[tuple[int, int, int, str, int]] = []
    append = nodes.append
    starts: list[int] = []
    open_ids: list[int] = []
    prev: list[str] = []
    x = 0
    max_depth = 0
    for i, (frames, n) in enumerate(items):
        common = lcp[i]
        if common > len(frames):
            common = len(frames)
        if common > len(prev):
            common = len(prev)
        for d in range(len(prev) - 1, common - 1, -1):
            w = x - starts[d]
            if w >= min_count:
                append((d + 1, starts[d], w, prev[d], open_ids[d] if with_ids else 0))
                if d >= max_depth:
                    max_depth = d + 1
            else:
                pruned += 1
        del starts[common:]
        if with_ids:
            del open_ids[common:]
            parent = open_ids[-1] if open_ids else 0
            for name in frames[common:]:
                key = (parent, name)
                pid = ids.get(key)
                if pid is None:
                    pid = ids[key] = len(ids) + 1
                open_ids.append(pid)
                parent = pid
        starts.extend([x] * (len(frames) - common))
        x += n
        prev = frames
    for d in range(len(prev) - 1, -1, -1):
        w = x - starts[d]
        if w >= min_count:
            append((d + 1, starts[d], w, prev[d], open_ids[d] if with_ids else 0))
            max_depth = max(max_depth, d + 1)
        else:
            pruned += 1
    nodes.append((0, 0, x, "all", 0))
    return Layout(total=x, nodes=nodes, max_depth=max_depth, ids=ids, pruned=pruned)


def inclusive_by_path(profile: Mapping[str, int], ids: dict[tuple[int, str], int]) -> dict[int, int]:
    """Inclusive counts of `profile` for the frame paths numbered in `ids` (another profile's
    layout, made `with_ids`)."""
    incl: dict[int, int] = {}
    for key, n in profile.items():
        if n <= 0:
            continue
        parent = 0
        for name in key.split(";") if key else []:
            pid = ids.get((parent, name))
            if pid is None:
                break
            incl[pid] = incl.get(pid, 0) + n
            parent = pid
    return incl


# -- formatting --------------------------------------------------------------------------------

def fmt_count(n: float, unit: str) -> str:
    if unit == "us":
        s = n / 1e6
        if s >= 1:
            return f"{s:.2f} s"
        if s >= 1e-3:
            return f"{s * 1e3:.1f} ms"
        return f"{n:.0f} us"
    return f"{n:,.0f} {unit}"


def fmt_share(x: float) -> str:
    return f"{100 * x:.3f}%" if 0 < abs(x) < 0.001 else f"{100 * x:.1f}%"


def fit(label: str, width_px: float, font_size: float = FONT_SIZE) -> str:
    chars = int((width_px - 6) / (font_size * CHAR_W))
    if chars < 3:
        return ""
    return label if len(label) <= chars else label[:chars - 2] + ".."


_STDLIB = frozenset(getattr(sys, "stdlib_module_names", ())) or frozenset(
    ("threading", "queue", "selectors", "socket", "subprocess", "os", "time", "abc", "functools", "contextlib",
     "typing", "random", "json", "logging", "weakref", "collections", "asyncio", "multiprocessing", "concurrent"))


def frame_kind(label: str) -> str:
    """user | library | native | pseudo: what colours a frame. A Python frame is library code when
    its path names a package (`torch/nn/...`), a frozen module or a standard-library module."""
    if label == "all" or label.startswith(("process ", "thread (", "workers", "worker ")):
        return "pseudo"
    m = _PY_FRAME.search(label) or _PY_FUNCTION.search(label)
    if m:
        path = m.group(1)
        if "/" in path or path.startswith("<") or path.rsplit(".", 1)[0] in _STDLIB:
            return "library"
        return "user"
    if label == "all" or label.startswith(("process ", "thread (", "workers", "worker ")):
        return "pseudo"
    return "native"


def frame_colour(label: str) -> str:
    h = zlib.crc32(label.encode("utf-8", "replace"))
    a, b, c = (h & 0xFF) / 255.0, ((h >> 8) & 0xFF) / 255.0, ((h >> 16) & 0xFF) / 255.0
    kind = frame_kind(label)
    if kind == "user":
        return f"rgb({int(220 + 35 * a)},{int(80 + 90 * b)},{int(40 * c)})"
    if kind == "library":
        return f"rgb({int(215 + 40 * a)},{int(175 + 55 * b)},{int(40 + 50 * c)})"
    if kind == "pseudo":
        return f"rgb({int(185 + 20 * a)},{int(175 + 20 * b)},{int(215 + 25 * c)})"
    return f"rgb({int(175 + 35 * a)},{int(175 + 35 * a)},{int(185 + 30 * b)})"


def wait_colour(label: str) -> str:
    """A frame whose time was all spent waiting (its stacks end in a blocking call): blue, as in
    off-CPU flame graphs, so a parked thread never reads as compute."""
    h = zlib.crc32(label.encode("utf-8", "replace"))
    a, b = (h & 0xFF) / 255.0, ((h >> 8) & 0xFF) / 255.0
    return f"rgb({int(105 + 30 * a)},{int(150 + 30 * b)},{int(205 + 30 * a)})"


def diff_colour(delta: float, max_abs: float) -> str:
    """Red where the share grew, blue where it shrank; saturation by the size of the change."""
    if max_abs <= 0 or delta == 0:
        return "rgb(235,235,235)"
    t = min(1.0, abs(delta) / max_abs)
    pale = int(round(225 * (1.0 - t)))
    return f"rgb(255,{pale},{pale})" if delta > 0 else f"rgb({pale},{pale},255)"


def _esc(s: str) -> str:
    return xmlsafe.escape(s)


# -- SVG ---------------------------------------------------------------------------------------

@dataclass
class Rendered:
    svg: str
    total: int
    frames: int               # rectangles drawn, `all` included
    pruned: int
    max_depth: int


# The per-thread split of wall-clock time: measured by the kernel per thread, never per stack.
SPLIT_COLOURS = (("on_cpu_s", "on a CPU", "rgb(90,170,90)"),
                 ("runqueue_s", "waiting for a CPU (run queue)", "rgb(230,140,40)"),
                 ("off_cpu_s", "off-CPU (sleeping or blocked)", WAIT_FILL))
SPLIT_ROW_H = 16
SPLIT_MAX_THREADS = 8


def _split_rows(threads: list[Mapping] | None) -> list[Mapping]:
    return [t for t in (threads or []) if (t.get("wall_s") or 0) > 0][:SPLIT_MAX_THREADS]


def _split_band(rows: list[Mapping], width: int, top: int) -> list[str]:
    """One stacked bar per thread: on a CPU, waiting for a CPU, off-CPU, as shares of its wall time."""
    label_w = 260
    bar_w = width - 2 * PAD - label_w - 8
    out = ['<g class="tp-split">',
           f'<text class="tp-sub" x="{PAD}" y="{top + 11}">Per thread, measured by the kernel over the window '
           '(/proc schedstat): ' + "; ".join(f"{words} {_esc(_swatch(c))}" for _k, words, c in SPLIT_COLOURS)
           + "</text>"]
    for i, t in enumerate(rows):
        y = top + SPLIT_ROW_H * (i + 1)
        wall = float(t["wall_s"])
        name = str(t.get("name") or f"thread {i}")
        parts = [(k, words, c, max(float(t.get(k) or 0.0), 0.0)) for k, words, c in SPLIT_COLOURS]
        info = ", ".join(f"{words} {v:.2f} s ({fmt_share(v / wall)})" for _k, words, _c, v in parts)
        out.append(f'<g class="tp-thread" data-thread="{_esc(name)}"><title>{_esc(name)}: {_esc(info)} '
                   f'of {wall:.2f} s</title><text class="tp-sub" x="{PAD}" y="{y + 11}">'
                   f'{_esc(fit(name, label_w))}</text>')
        x = PAD + label_w + 8
        for k, _words, c, v in parts:
            w = bar_w * min(v / wall, 1.0)
            if w > 0:
                out.append(f'<rect class="tp-{k[:-2].replace("_", "-")}" data-seconds="{v:.4f}" x="{x:.2f}" '
                           f'y="{y + 2}" width="{w:.2f}" height="{SPLIT_ROW_H - 4}" fill="{c}"/>')
            x += w
        out.append("</g>")
    out.append("</g>")
    return out


def _swatch(colour: str) -> str:
    return {"rgb(90,170,90)": "(green)", "rgb(230,140,40)": "(orange)"}.get(colour, "(blue)")


def render(profile: Mapping[str, int], title: str = "Flame graph", subtitle: str = "", unit: str = "us",
           width: int = WIDTH, minwidth_px: float = 0.1, before: Mapping[str, int] | None = None,
           standalone: bool = True, css_class: str = "", waiting: Mapping[str, int] | None = None,
           threads: list[Mapping] | None = None) -> Rendered:
    """One flame graph. `standalone` gives a complete .svg document with its script; without it,
    an <svg> element for an HTML page that includes SCRIPT once and calls trainprobeFlame.init.

    `waiting` is the part of `profile` whose stacks end in a blocking call (a wait, a poll, a
    queue get): a frame all of whose time is there is drawn blue, as off-CPU time. `threads` is
    each thread's wall time split by the kernel into on a CPU, waiting for a CPU and off-CPU
    (`{"name", "wall_s", "on_cpu_s", "runqueue_s", "off_cpu_s"}`), drawn as bars above the graph:
    the run-queue wait is known per thread only, so it is never spread over the stacks."""
    inner = width - 2 * PAD
    total_guess = sum(v for v in profile.values() if v > 0)
    min_count = (minwidth_px * total_guess / inner) if total_guess else 0.0
    diff = before is not None
    waits = {k: v for k, v in (waiting or {}).items() if v > 0} if not diff else {}
    lay = layout(profile, min_count, with_ids=diff or bool(waits))
    total = lay.total
    scale = inner / total if total else 0.0
    split = _split_rows(threads)
    split_h = SPLIT_ROW_H * (len(split) + 1) + 6 if split else 0
    top = TOP + split_h
    height = top + (lay.max_depth + 1) * FRAME_H + BOTTOM
    wait_incl = inclusive_by_path(waits, lay.ids) if waits else {}
    deltas: dict[int, float] = {}
    before_total = 0
    absent = 0
    max_abs = 0.0
    if diff:
        before_total = sum(v for v in before.values() if v > 0)  # type: ignore[union-attr]
        incl = inclusive_by_path(before, lay.ids)  # type: ignore[arg-type]
        absent = sum(v for k, v in before.items() if v > 0 and k not in profile)  # type: ignore[union-attr]
        incl[0] = before_total
        for depth, _x, n, _label, pid in lay.nodes:
            a = n / total if total else 0.0
            b = incl.get(pid, 0) / before_total if before_total else 0.0
            deltas[pid] = a - b
            max_abs = max(max_abs, abs(a - b))
    out: list[str] = []
    head = (f'<svg xmlns="http://www.w3.org/2000/svg" version="1.1" class="tp-flame{(" " + css_class) if css_class else ""}" '
            f'width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
            f'data-total="{total}" data-unit="{_esc(unit)}" data-width="{width}" data-pad="{PAD}" '
            f'data-fontsize="{FONT_SIZE}" data-diff="{1 if diff else 0}" font-family="Verdana, DejaVu Sans, sans-serif">')
    if standalone:
        out.append('<?xml version="1.0" standalone="no"?>\n')
    out.append(head)
    out.append(f"<style>{CSS}</style>")
    out.append(f'<rect class="tp-bg" x="0" y="0" width="{width}" height="{height}" fill="#f7f7f2"/>')
    # Title and subtitle lines are cut to the width (the full text stays in a tooltip).
    title_room = width - 2 * PAD - 2 * 110
    out.append(f'<g><title>{_esc(title)}</title><text class="tp-title" x="{width / 2:.0f}" y="24" '
               f'text-anchor="middle">{_esc(fit(title, title_room, 17))}</text></g>')
    if diff:
        legend = (f"Widths: this profile ({fmt_count(total, unit)}); colour: change in share since before "
                  f"({fmt_count(before_total, unit)}): red grew, blue shrank"
                  + (f"; {fmt_share(absent / before_total)} of before is in stacks absent now"
                     if before_total and absent else ""))
    else:
        wait_share = sum(waits.values()) / total if total and waits else 0.0
        legend = (f"Total {fmt_count(total, unit)}. Red: your code; yellow: packages and stdlib; grey: native"
                  + (f"; blue: blocked in a wait ({fmt_share(wait_share)})" if waits else "")
                  + ". Hover, click to zoom, Ctrl-F to search")
    for i, line in enumerate([x for x in (subtitle, legend) if x]):
        out.append(f'<g><title>{_esc(line)}</title><text class="tp-sub" x="{width / 2:.0f}" y="{42 + 16 * i}" '
                   f'text-anchor="middle">{_esc(fit(line, width - 2 * PAD, 12))}</text></g>')
    out.append(f'<text class="tp-unzoom tp-btn" x="{PAD}" y="24" style="display:none">Reset zoom</text>')
    out.append(f'<text class="tp-search tp-btn" x="{width - PAD}" y="24" text-anchor="end">Search</text>')
    out.append(f'<text class="tp-matched" x="{width - PAD}" y="{height - 10}" text-anchor="end"> </text>')
    out.append(f'<text class="tp-details" x="{PAD}" y="{height - 10}"> </text>')
    if split:
        out.extend(_split_band(split, width, TOP - 10))
    out.append('<g class="tp-frames">')
    base_y = top + lay.max_depth * FRAME_H
    for depth, x, n, label, pid in lay.nodes:
        w = n * scale
        px = PAD + x * scale
        y = base_y - depth * FRAME_H
        share = n / total if total else 0.0
        text_style = ""
        if diff:
            d = deltas.get(pid, 0.0)
            fill = diff_colour(d, max_abs)
            b_share = share - d
            info = (f"{fmt_share(share)} now ({fmt_count(n, unit)}), {fmt_share(b_share)} before, "
                    f"{'+' if d >= 0 else '-'}{100 * abs(d):.1f} points")
            extra = f' data-delta="{d:.6g}"'
            if d < 0 and max_abs and abs(d) / max_abs > 0.6:
                text_style = ' style="fill:#fff"'       # black on deep blue does not read
        else:
            w_n = wait_incl.get(pid, 0) if depth else 0
            waiting_all = bool(waits) and depth > 0 and w_n >= n
            fill = wait_colour(label) if waiting_all else frame_colour(label)
            info = f"{fmt_count(n, unit)}, {fmt_share(share)} of the total"
            if w_n:
                info += f"; {fmt_share(w_n / n)} of it waiting in a blocking call"
            extra = ' data-wait="1"' if waiting_all else ""
        lab = _esc(label)
        text = fit(label, w)
        out.append(f'<g class="f" data-x="{x}" data-n="{n}"{extra}><title>{lab}\n{_esc(info)}</title>'
                   f'<rect x="{px:.2f}" y="{y}" width="{w:.2f}" height="{FRAME_H - 1}" fill="{fill}" rx="2"/>'
                   f'<text x="{px + 3:.2f}" y="{y + FRAME_H - 4.5:.1f}"{text_style}>{_esc(text)}</text></g>')
    out.append("</g>")
    if standalone:
        out.append(f'<script type="text/ecmascript"><![CDATA[\n{SCRIPT}\n'
                   f'trainprobeFlame.init(document.documentElement, {{keys: true}});\n]]></script>')
    out.append("</svg>\n")
    return Rendered("".join(out), total, len(lay.nodes), lay.pruned, lay.max_depth)


def render_svg(profile: Mapping[str, int], **kw) -> str:
    return render(profile, **kw).svg


CSS = (
    ".tp-title{font-size:17px;fill:#222}"
    ".tp-sub{font-size:12px;fill:#555}"
    ".tp-details,.tp-matched{font-size:12px;fill:#222}"
    ".tp-btn{font-size:12px;fill:#1a5fb4;cursor:pointer;text-decoration:underline}"
    "g.f text{font-size:12px;fill:#000;pointer-events:none}"
    "g.f{cursor:pointer}"
    "g.f:hover rect{stroke:#000;stroke-width:0.7}"
    "g.f.tp-parent{opacity:0.55}"
)

# The flame graph's behaviour. One function per <svg class="tp-flame">, no global ids, so an
# HTML page can hold several graphs and include this once. Kept free of "]]>" and "</script>".
SCRIPT = r"""
var trainprobeFlame = (function () {
  "use strict";
  var CHAR_W = 0.59;
  function fmtCount(n, unit) {
    if (unit === "us") {
      var s = n / 1e6;
      if (s >= 1) return s.toFixed(2) + " s";
      if (s >= 1e-3) return (s * 1e3).toFixed(1) + " ms";
      return n.toFixed(0) + " us";
    }
    return Math.round(n).toLocaleString("en-US") + " " + unit;
  }
  function pct(x) { return (100 * x).toFixed(x > 0 && x < 0.001 ? 3 : 1) + "%"; }
  function fit(label, w, fs) {
    var c = Math.floor((w - 6) / (fs * CHAR_W));
    if (c < 3) return "";
    return label.length <= c ? label : label.slice(0, c - 2) + "..";
  }
  function escapeRe(s) { return s.replace(/[.*+?^${}()|[\]\\]/g, "\\$&"); }
  function init(svg, opts) {
    if (svg.__tpFlame) return svg.__tpFlame;
    opts = opts || {};
    var total = +svg.getAttribute("data-total"), unit = svg.getAttribute("data-unit");
    var W = +svg.getAttribute("data-width"), pad = +svg.getAttribute("data-pad");
    var fs = +svg.getAttribute("data-fontsize"), inner = W - 2 * pad;
    var details = svg.querySelector(".tp-details"), matched = svg.querySelector(".tp-matched");
    var unzoomBtn = svg.querySelector(".tp-unzoom"), searchBtn = svg.querySelector(".tp-search");
    var frames = [].slice.call(svg.querySelectorAll("g.f")).map(function (g) {
      var r = g.querySelector("rect"), t = g.querySelector("text"), ti = g.querySelector("title");
      var txt = ti ? ti.textContent : "", cut = txt.lastIndexOf("\n");
      var f = {g: g, r: r, t: t, x: +g.getAttribute("data-x"), n: +g.getAttribute("data-n"),
               y: +r.getAttribute("y"), label: cut >= 0 ? txt.slice(0, cut) : txt,
               info: cut >= 0 ? txt.slice(cut + 1) : "", fill: r.getAttribute("fill")};
      g.__tp = f;
      return f;
    });
    var root = frames.filter(function (f) { return f.label === "all" && f.x === 0 && f.n === total; })[0];
    var state = {zoomed: null, term: null};
    function place(f, x, w) {
      f.r.setAttribute("x", x.toFixed(2));
      f.r.setAttribute("width", Math.max(w, 0).toFixed(2));
      if (f.t) { f.t.setAttribute("x", (x + 3).toFixed(2)); f.t.textContent = fit(f.label, w, fs); }
    }
    function zoom(f) {
      if (!f || f === root) return unzoom();
      var x0 = f.x, x1 = f.x + f.n, scale = inner / f.n;
      frames.forEach(function (o) {
        if (o.y <= f.y && o.x >= x0 && o.x + o.n <= x1) {
          o.g.style.display = ""; o.g.classList.remove("tp-parent");
          place(o, pad + (o.x - x0) * scale, o.n * scale);
        } else if (o.y > f.y && o.x <= x0 && o.x + o.n >= x1) {
          o.g.style.display = ""; o.g.classList.add("tp-parent");
          place(o, pad, inner);
        } else {
          o.g.style.display = "none";
        }
      });
      state.zoomed = f;
      unzoomBtn.style.display = "";
      return f;
    }
    function unzoom() {
      var scale = total ? inner / total : 0;
      frames.forEach(function (o) {
        o.g.style.display = ""; o.g.classList.remove("tp-parent");
        place(o, pad + o.x * scale, o.n * scale);
      });
      state.zoomed = null;
      unzoomBtn.style.display = "none";
      return null;
    }
    function search(term) {
      var re = null;
      if (term) { try { re = new RegExp(term); } catch (e) { re = new RegExp(escapeRe(term)); } }
      var hits = [];
      frames.forEach(function (o) {
        var m = !!re && re.test(o.label);
        o.r.setAttribute("fill", m ? "rgb(230,0,230)" : o.fill);
        o.g.classList.toggle("tp-hit", m);
        if (m) hits.push(o);
      });
      hits.sort(function (a, b) { return a.x - b.x || b.n - a.n; });
      var covered = 0, end = -1;
      hits.forEach(function (o) {
        var a = o.x, b = o.x + o.n;
        if (a >= end) { covered += b - a; end = b; } else if (b > end) { covered += b - end; end = b; }
      });
      var share = total ? covered / total : 0;
      state.term = re ? term : null;
      matched.textContent = re ? "Matched: " + pct(share) + " (" + hits.length + " frames)" : " ";
      searchBtn.textContent = re ? "Reset search" : "Search";
      return {frames: hits.length, share: share, covered: covered};
    }
    function ask() {
      if (state.term) return search(null);
      var t = window.prompt("Search frames (regular expression):", "");
      return t ? search(t) : null;
    }
    svg.addEventListener("mouseover", function (e) {
      var g = e.target.closest ? e.target.closest("g.f") : null;
      if (!g || !g.__tp) return;
      details.textContent = g.__tp.label + "  |  " + g.__tp.info;
    });
    svg.addEventListener("mouseout", function (e) {
      var g = e.target.closest ? e.target.closest("g.f") : null;
      if (g) details.textContent = " ";
    });
    svg.addEventListener("click", function (e) {
      if (e.target === unzoomBtn) return unzoom();
      if (e.target === searchBtn) return ask();
      var g = e.target.closest ? e.target.closest("g.f") : null;
      if (g && g.__tp) zoom(g.__tp);
    });
    if (opts.keys) {
      window.addEventListener("keydown", function (e) {
        if ((e.key === "f" && (e.ctrlKey || e.metaKey)) || e.key === "/") { e.preventDefault(); ask(); }
        if (e.key === "Escape") { unzoom(); search(null); }
      });
    }
    var api = {svg: svg, frames: frames, total: total, unit: unit, zoom: zoom, unzoom: unzoom,
               search: search, fmt: function (n) { return fmtCount(n, unit); }};
    svg.__tpFlame = api;
    return api;
  }
  function initAll(doc) {
    return [].slice.call((doc || document).querySelectorAll("svg.tp-flame")).map(function (s) { return init(s); });
  }
  return {init: init, initAll: initAll};
})();
"""
