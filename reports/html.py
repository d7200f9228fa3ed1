"""The HTML view of a Report: one self-contained file (inline CSS, script and SVG; nothing fetched).

It shows the ranked findings with their evidence and fixes; a timeline of GPU utilization with
the idle windows shaded and, under it, a band of what the training thread was doing; the flame
graphs of the training thread and of the DataLoader workers; and the probe manifest (what ran,
what was skipped and why). The findings and the manifest come from the Report document; the
timeline and the flame graphs from a `visuals` document built beside it (agent/visuals.py):
plain data, the same on a live run and on a saved bundle.
"""
from __future__ import annotations

import datetime as _dt
import math
from typing import Any, Mapping, Sequence, TextIO

from trainprobe.reports import flamegraph, folded, xmlsafe
from trainprobe.reports.text import sampling_line
from trainprobe.reports.values import NOT_WORTH_WORDS, fmt_interval, fmt_value, slowdown_text, worth_acting

CATEGORY_COLOURS = {
    "data_wait": "#d62728", "data_load": "#ff7f0e", "h2d_copy": "#9467bd", "host_sync": "#8c564b",
    "forward": "#2ca02c", "backward": "#1f77b4", "optimizer": "#17becf", "other": "#c7c7c7",
}
CATEGORY_WORDS = {
    "data_wait": "waiting for a batch", "data_load": "loading batches in the loop", "h2d_copy": "copying to the GPU",
    "host_sync": "synchronising with the GPU", "forward": "forward", "backward": "backward",
    "optimizer": "optimizer", "other": "other",
}
GPU_LINE = ("#2ca02c", "#1f77b4", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22")
IDLE_FILL = "rgba(214,39,40,0.16)"
TL_WIDTH = 1200
TL_LEFT = 64
TL_RIGHT = 16


def esc(x: Any) -> str:
    return xmlsafe.escape(x)


def _utc(t: float | None) -> str:
    if not t:
        return "-"
    return _dt.datetime.fromtimestamp(float(t), _dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


CSS = """
:root{--fg:#1d1d1f;--muted:#5f6368;--line:#dadce0;--bg:#fff;--card:#fafafa;--accent:#1a5fb4}
*{box-sizing:border-box}
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;color:var(--fg);
 background:var(--bg);margin:0 auto;max-width:1260px;padding:20px 24px 60px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:18px;margin:32px 0 10px;border-bottom:1px solid var(--line);
 padding-bottom:4px}h3{font-size:15px;margin:4px 0 8px}h4{font-size:13px;margin:10px 0 4px;color:var(--muted);
 text-transform:uppercase;letter-spacing:.04em}
.muted{color:var(--muted)}code,pre{font:12.5px/1.4 ui-monospace,"DejaVu Sans Mono",Menlo,monospace}
pre{background:#f3f4f6;border:1px solid var(--line);border-radius:4px;padding:6px 8px;margin:4px 0;
 white-space:pre-wrap;word-break:break-word}
.meta{display:flex;flex-wrap:wrap;gap:4px 22px;color:var(--muted);font-size:13px}
.note{background:#fff8e1;border-left:3px solid #f9a825;padding:4px 10px;margin:6px 0}
.finding{border:1px solid var(--line);border-radius:6px;background:var(--card);padding:12px 16px;margin:12px 0}
.finding header{display:flex;flex-wrap:wrap;align-items:baseline;gap:10px}
.rank{font-weight:700;color:var(--muted)}.fid{font-weight:700;font-size:14px}
.speedup{font-weight:700;font-size:16px;color:#b3261e}.speedup.none{color:#2e7d32}
.speedup.small{font-weight:400;color:var(--muted)}.finding.muted{background:#fff;color:var(--muted)}
.finding.muted .fid{font-weight:400}.headline{font-weight:600}
.badge{display:inline-block;border-radius:10px;padding:0 8px;font-size:12px;border:1px solid var(--line);background:#fff}
.conf-high{border-color:#2e7d32;color:#2e7d32}.conf-medium{border-color:#f9a825;color:#8d6e00}
.conf-low{border-color:#9e9e9e;color:#616161}
table{border-collapse:collapse;width:100%;margin:4px 0}th,td{text-align:left;padding:3px 8px;
 border-bottom:1px solid var(--line);vertical-align:top;font-size:13px}th{color:var(--muted);font-weight:600}
td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.fix{margin:6px 0 10px}.fix p{margin:2px 0}
.bound{color:var(--muted);font-size:12.5px;margin:8px 0 0}
.st-ok{color:#2e7d32;font-weight:600}.st-skipped{color:#8d6e00;font-weight:600}
.st-failed,.st-timeout,.st-error{color:#b3261e;font-weight:600}.st-fired{color:#b3261e;font-weight:600}
.st-quiet{color:var(--muted)}
.empty{border:1px dashed var(--line);border-radius:6px;padding:10px 14px;color:var(--muted);margin:8px 0}
.legend{display:flex;flex-wrap:wrap;gap:4px 16px;font-size:12.5px;margin:6px 0}
.legend i{display:inline-block;width:12px;height:12px;border-radius:2px;margin-right:5px;vertical-align:-1px}
.chart{width:100%;height:auto;display:block}
.flame-wrap{border:1px solid var(--line);border-radius:6px;overflow:hidden;margin:6px 0 18px}
.flame-wrap svg{width:100%;height:auto;display:block}
.tools{display:flex;flex-wrap:wrap;gap:6px 10px;align-items:center;margin:4px 0;font-size:13px}
.tools input{font:inherit;padding:3px 6px;width:320px;max-width:100%;border:1px solid var(--line);border-radius:4px}
.tools select{font:inherit}[hidden]{display:none!important}
.tools button{font:inherit;padding:2px 10px;border:1px solid var(--line);border-radius:4px;background:#fff;cursor:pointer}
details summary{cursor:pointer;color:var(--accent)}
footer{margin-top:40px;color:var(--muted);font-size:12px}
td,th{overflow-wrap:break-word}code,p,h1,h3,.note,.meta span{overflow-wrap:anywhere}td code{overflow-wrap:normal}
@media (max-width:640px){body{padding:12px 10px 40px}h1{font-size:19px}.tools input{width:100%}
 td.num{white-space:normal}th,td{padding:3px 4px}.speedup{font-size:15px}td,td code{overflow-wrap:anywhere}th{white-space:nowrap}
 .flame-wrap{overflow-x:auto}.flame-wrap svg{min-width:760px}}
"""

PAGE_JS = """
(function () {
  "use strict";
  var graphs = trainprobeFlame.initAll(document);
  document.querySelectorAll(".flame-block").forEach(function (block) {
    var tools = block.querySelector(".tools");
    var wraps = [].slice.call(block.querySelectorAll(".flame-wrap"));
    function visible() {
      var w = wraps.filter(function (x) { return !x.hidden; })[0] || wraps[0];
      return w ? trainprobeFlame.init(w.querySelector("svg.tp-flame")) : null;
    }
    var input = tools.querySelector("input"), out = tools.querySelector(".found");
    function find() {
      var g = visible();
      if (!g) return;
      var r = g.search(input.value || null);
      out.textContent = input.value ? "matched " + (100 * r.share).toFixed(1) + "% in " + r.frames + " frames" : "";
    }
    input.addEventListener("input", find);
    tools.querySelector("button").addEventListener("click", function () { var g = visible(); if (g) g.unzoom(); });
    var sel = tools.querySelector("select.group");
    if (sel) sel.addEventListener("change", function () {
      wraps.forEach(function (w) { w.hidden = w.getAttribute("data-group") !== sel.value; });
      find();
    });
  });
  window.trainprobeGraphs = graphs;
})();
"""


# -- sections ----------------------------------------------------------------------------------

def _header(report: Mapping[str, Any]) -> list[str]:
    host, tgt, win = report.get("host", {}), report.get("target", {}), report.get("window", {})
    gpus = host.get("gpus") or []
    gpu_s = ", ".join(f"{g.get('index', i)}: {g.get('name', 'GPU')}" for i, g in enumerate(gpus)) if gpus else "no GPU"
    workers = [w for w in tgt.get("workers", []) if w.get("role") == "dataloader_worker"]
    out = [f"<header><h1>trainprobe diagnosis of PID {esc(tgt.get('pid'))}</h1>"]
    if tgt.get("cmdline"):
        out.append(f"<p><code>{esc(tgt['cmdline'])}</code></p>")
    out.append('<div class="meta">'
               f"<span>host {esc(host.get('hostname'))}: {esc(host.get('cpus'))} CPUs, "
               f"{esc(host.get('numa_nodes'))} NUMA node(s), {esc(gpu_s)}</span>"
               f"<span>window {esc(_utc(win.get('start_unix')))}, {float(win.get('seconds') or 0):.1f} s</span>"
               f"<span>Python {esc(tgt.get('python') or '-')}, {esc(tgt.get('threads') or '-')} threads, "
               f"{len(workers)} DataLoader worker(s)</span>"
               f"<span>trainprobe {esc(report.get('tool', {}).get('version'))}</span></div>")
    src = report.get("source")
    if src:
        out.append(f'<p class="muted">Re-diagnosed offline from the bundle <code>{esc(src.get("bundle"))}</code>, '
                   f"saved {esc(_utc(src.get('saved_unix')))}.</p>")
    for n in report.get("notes", []):
        out.append(f'<div class="note">{esc(n)}</div>')
    for n in ((win.get("trust") or {}).get("reasons") or []):
        out.append(f'<div class="note">window: {esc(n)}; the verdict may not hold for the job\'s steady state</div>')
    if report.get("windows"):
        out.append(f'<div class="note"><b>windows:</b> {esc(report["windows"].get("verdict"))}</div>')
    out.append("</header>")
    return out


def _findings(report: Mapping[str, Any]) -> list[str]:
    out = ['<section id="findings"><h2>Findings, ranked by expected speedup and confidence</h2>']
    if report.get("headline"):
        out.append(f'<p class="headline">{esc(report["headline"])}</p>')
    findings = report.get("findings") or []
    if not findings:
        out.append('<div class="empty">No finding: the evidence gathered does not point at a host-side cause.</div>')
    for i, f in enumerate(findings, 1):
        sp = float(f.get("expected_speedup") or 1.0)
        iv = f.get("expected_speedup_interval")
        sp_s = f"{fmt_value(sp, 'x')} expected speedup" if sp > 1.0 else "1.0x: no host-side gain expected"
        if sp <= 1.0 and f.get("expected_change") is not None:
            sp_s += f"; the fix {slowdown_text(f)}"
        if sp > 1.0 and iv:
            sp_s += f" (likely {fmt_interval(iv)})"
        worth = worth_acting(f)
        if not worth:       # below the headline's limit: muted, in the same words as the terminal view
            sp_s += f": {NOT_WORTH_WORDS}"
        conf = f.get("confidence", "low")
        sp_cls = " none" if sp <= 1.0 else ("" if worth else " small")
        out.append(f'<article class="finding{"" if worth else " muted"}" id="finding-{i}" data-id="{esc(f.get("id"))}"'
                   f' data-worth-acting="{"yes" if worth else "no"}"><header>'
                   f'<span class="rank">#{i}</span><code class="fid">{esc(f.get("id"))}</code>'
                   f'<span class="speedup{sp_cls}">{esc(sp_s)}</span>'
                   f'<span class="badge conf-{esc(conf)}">confidence {esc(conf)}</span>'
                   + (f'<span class="badge">risk {esc(f.get("risk"))}</span>' if f.get("risk") else "")
                   + "</header>"
                   f'<h3 class="ftitle">{esc(f.get("title"))}</h3>')
        ev = f.get("evidence") or []
        if ev:
            out.append("<h4>Evidence</h4><table class=\"evidence\"><tr><th>probe</th><th>fact</th><th>value</th></tr>")
            for e in ev:
                out.append(f"<tr><td><code>{esc(e.get('probe'))}</code></td><td>{esc(e.get('fact'))}</td>"
                           f'<td class="num">{esc(fmt_value(e.get("value")))}</td></tr>')
            out.append("</table>")
        fixes = f.get("fixes") or []
        if fixes:
            out.append("<h4>Fix</h4>")
            for fx in fixes:
                out.append(f'<div class="fix"><p>{esc(fx.get("title"))}</p>')
                if fx.get("change"):
                    out.append(f"<pre><code>{esc(fx['change'])}</code></pre>")
                if fx.get("command"):
                    out.append(f"<pre><code>$ {esc(fx['command'])}</code></pre>")
                out.append("</div>")
        out.append(f'<p class="bound">How the number was derived: {esc(f.get("speedup_bound"))}</p></article>')
    out.append("</section>")
    return out


def _nice_step(span: float, target_ticks: int = 10) -> float:
    if span <= 0:
        return 1.0
    raw = span / target_ticks
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 5, 10):
        if raw <= m * mag:
            return m * mag
    return 10 * mag


def _time_range(visuals: Mapping[str, Any]) -> tuple[float, float] | None:
    win = visuals.get("window") or {}
    t0 = win.get("start_unix")
    secs = win.get("seconds")
    spans: list[tuple[float, float]] = []
    tl = (visuals.get("timeline") or {}).get("training") or []
    if tl:
        spans.append((tl[0][0], tl[-1][1]))
    gpu = visuals.get("gpu") or {}
    for series in (gpu.get("utilization") or {}).values():
        if series:
            spans.append((series[0][0], series[-1][0]))
    for a, b in gpu.get("idle_intervals") or []:
        spans.append((a, b))
    if t0 and secs:
        lo, hi = float(t0), float(t0) + float(secs)
        slack = max(float(secs), 1.0)
        for a, b in spans:
            if a >= lo - slack and b <= hi + slack:
                lo, hi = min(lo, a), max(hi, b)
        return lo, hi
    if spans:
        return min(a for a, _ in spans), max(b for _, b in spans)
    return None


def _timeline(visuals: Mapping[str, Any]) -> list[str]:
    out = ['<section id="timeline"><h2>Timeline: the GPU and the training thread</h2>']
    rng = _time_range(visuals)
    gpu = visuals.get("gpu")
    tl = visuals.get("timeline") or {}
    band = tl.get("training") or []
    if rng is None or rng[1] <= rng[0]:
        out.append(f'<div class="empty">no GPU evidence: {esc(visuals.get("gpu_missing") or "none gathered")}</div>')
        out.append(f'<div class="empty">no training-thread timeline: {esc(tl.get("missing") or visuals.get("timeline_missing") or "none gathered")}</div>')
        out.append("</section>")
        return out
    lo, hi = rng
    plot_w = TL_WIDTH - TL_LEFT - TL_RIGHT
    if not gpu:
        out.append(f'<div class="empty" id="no-gpu">no GPU evidence: {esc(visuals.get("gpu_missing") or "none gathered")}</div>')

    def X(t: float) -> float:
        return TL_LEFT + (min(max(t, lo), hi) - lo) / (hi - lo) * plot_w

    svg: list[str] = []
    y = 8
    gpu_h = 150
    if gpu:
        util = {str(k): v for k, v in (gpu.get("utilization") or {}).items()}
        targets = [str(t) for t in gpu.get("target_gpus") or []]
        keys = sorted(util, key=lambda k: (k not in targets, int(k) if str(k).isdigit() else 0))
        top, bottom = y, y + gpu_h
        svg.append(f'<g class="gpu-chart"><rect x="{TL_LEFT}" y="{top}" width="{plot_w}" height="{gpu_h}" fill="#fff" stroke="#dadce0"/>')
        for a, b in gpu.get("idle_intervals") or []:
            if b < lo or a > hi:
                continue
            svg.append(f'<rect class="idle" x="{X(a):.2f}" y="{top}" width="{max(X(b) - X(a), 0.8):.2f}" height="{gpu_h}" '
                       f'fill="{IDLE_FILL}"><title>GPU idle {b - a:.3f} s (+{a - lo:.2f} s to +{b - lo:.2f} s)</title></rect>')
        for pct in (0, 50, 100):
            yy = bottom - pct / 100 * gpu_h
            svg.append(f'<line x1="{TL_LEFT}" x2="{TL_LEFT + plot_w}" y1="{yy:.1f}" y2="{yy:.1f}" stroke="#eee"/>'
                       f'<text x="{TL_LEFT - 6}" y="{yy + 4:.1f}" text-anchor="end" font-size="11" fill="#5f6368">{pct}%</text>')
        period = float(gpu.get("sample_period_s") or 0.2)
        for i, k in enumerate(keys):
            # A sample is the utilization over the period that ends at its timestamp: a step.
            series = [(float(t), float(p)) for t, p in util[k]
                      if p is not None and lo - period < float(t) < hi + period]
            if not series:
                continue
            colour = GPU_LINE[i % len(GPU_LINE)]
            pts = []
            for t, p in series:
                yy = bottom - max(0.0, min(p, 100.0)) / 100 * gpu_h
                pts.append(f"{X(t - period):.2f},{yy:.2f} {X(t):.2f},{yy:.2f}")
            if i == 0:
                area = f"{X(series[0][0] - period):.2f},{bottom} " + " ".join(pts) + f" {X(series[-1][0]):.2f},{bottom}"
                svg.append(f'<polygon points="{area}" fill="{colour}" fill-opacity="0.18" stroke="none"/>')
            svg.append(f'<polyline class="gpu-util" data-gpu="{esc(k)}" points="{" ".join(pts)}" fill="none" '
                       f'stroke="{colour}" stroke-width="1.5"><title>GPU {esc(k)} utilization</title></polyline>')
        svg.append("</g>")
        y = bottom + 10
    band_h = 30
    if band:
        svg.append(f'<g class="train-band"><text x="{TL_LEFT - 6}" y="{y + band_h / 2 + 4:.0f}" text-anchor="end" '
                   f'font-size="11" fill="#5f6368">loop</text>')
        for a, b, cat in band:
            if b < lo or a > hi:
                continue
            w = max(X(b) - X(a), 0.6)
            svg.append(f'<rect class="seg" data-cat="{esc(cat)}" x="{X(a):.2f}" y="{y}" width="{w:.2f}" height="{band_h}" '
                       f'fill="{CATEGORY_COLOURS.get(cat, "#999")}"><title>{esc(cat)}: {b - a:.3f} s at +{a - lo:.2f} s'
                       f"</title></rect>")
        svg.append("</g>")
        y += band_h + 6
    step = _nice_step(hi - lo)
    t = 0.0
    while t <= (hi - lo) + 1e-9:
        xx = X(lo + t)
        svg.append(f'<line x1="{xx:.1f}" x2="{xx:.1f}" y1="{y}" y2="{y + 4}" stroke="#5f6368"/>'
                   f'<text x="{xx:.1f}" y="{y + 16}" text-anchor="middle" font-size="11" fill="#5f6368">+{t:g} s</text>')
        t += step
    y += 22
    out.append(f'<svg class="chart" viewBox="0 0 {TL_WIDTH} {y}" width="{TL_WIDTH}" height="{y}" '
               f'xmlns="http://www.w3.org/2000/svg" font-family="system-ui, DejaVu Sans, sans-serif">{"".join(svg)}</svg>')
    legend = []
    if gpu:
        busy, idle = gpu.get("busy_fraction"), gpu.get("idle_fraction")
        per = gpu.get("sample_period_s")
        runs = gpu.get("idle_intervals") or []
        legend.append(f'<span><i style="background:{GPU_LINE[0]}"></i>GPU utilization (NVML'
                      + (f", one sample every {float(per) * 1000:.0f} ms" if per else "") + ")"
                      + (f": busy {100 * float(busy):.0f}%, idle {100 * float(idle):.0f}% of the window"
                         if busy is not None and idle is not None else "") + "</span>")
        legend.append(f'<span><i style="background:{IDLE_FILL};border:1px solid #d62728"></i>shaded: periods with no '
                      f"kernel at all ({len(runs)}, {sum(b - a for a, b in runs):.1f} s); idle time inside partly "
                      "busy periods cannot be placed</span>")
    if band:
        shares = tl.get("breakdown") or {}
        for cat in tl.get("categories") or list(CATEGORY_COLOURS):
            s = shares.get(cat)
            if s is None and cat not in {c for _a, _b, c in band}:
                continue
            legend.append(f'<span><i style="background:{CATEGORY_COLOURS.get(cat, "#999")}"></i>{esc(cat)} '
                          f'<span class="muted">({esc(CATEGORY_WORDS.get(cat, cat))}'
                          + (f", {100 * float(s):.0f}%" if s is not None else "") + ")</span></span>")
    else:
        out.append(f'<div class="empty">no training-thread timeline: '
                   f'{esc(tl.get("missing") or visuals.get("timeline_missing") or "none gathered")}</div>')
    if legend:
        out.append('<div class="legend">' + "".join(legend) + "</div>")
    if band:
        out.append('<p class="muted">The band under the chart is what the training thread was doing, '
                   "from py-spy's samples (wall clock).</p>")
    out.append("</section>")
    return out


def _flamegraphs(visuals: Mapping[str, Any]) -> tuple[list[str], int]:
    out = ['<section id="flamegraphs"><h2>Flame graphs</h2>']
    graphs = visuals.get("flamegraphs") or []
    n = 0
    if not graphs:
        out.append(f'<div class="empty">no py-spy stacks: {esc(visuals.get("flamegraphs_missing") or "none gathered")}</div>')
    for g in graphs:
        out.append(f'<h3>{esc(g.get("title"))}</h3>')
        if g.get("missing") or not g.get("profile"):
            out.append(f'<div class="empty">{esc(g.get("missing") or "no samples")}</div>')
            continue
        if g.get("subtitle"):
            out.append(f'<p class="muted">{esc(g["subtitle"])}</p>')
        out.extend(_flame_block(g["profile"], g.get("graph_title") or g.get("title") or "Flame graph",
                                g.get("graph_subtitle", ""), g.get("unit", "us"), g.get("before"),
                                g.get("group") or DEFAULT_GROUP, g.get("waiting"), g.get("threads")))
        n += 1
    out.append("</section>")
    return out, n


def _manifest(report: Mapping[str, Any]) -> list[str]:
    out = ['<section id="probes"><h2>Probe manifest</h2>',
           "<table><tr><th>probe</th><th>status</th><th>why</th><th>seconds</th></tr>"]
    for p in report.get("probes") or []:
        st = p.get("status", "")
        out.append(f"<tr><td><code>{esc(p.get('name'))}</code></td><td class=\"st-{esc(st)}\">{esc(st)}</td>"
                   f"<td>{esc(p.get('reason') or ('ran over the window' if st == 'ok' else ''))}</td>"
                   f'<td class="num">{float(p.get("seconds") or 0):.2f}</td></tr>')
    out.append("</table>")
    rules = report.get("rules") or []
    if rules:
        out.append("<details><summary>Rules: which fired, which were quiet, which were skipped and why</summary>"
                   "<table><tr><th>rule</th><th>finding</th><th>status</th><th>why</th></tr>")
        for r in rules:
            out.append(f"<tr><td><code>{esc(r.get('rule'))}</code></td><td><code>{esc(r.get('finding'))}</code></td>"
                       f"<td class=\"st-{esc(r.get('status'))}\">{esc(r.get('status'))}</td><td>{esc(r.get('reason') or '')}</td></tr>")
        out.append("</table></details>")
    oh = report.get("overhead") or {}
    if oh:
        bits = []
        if "agent_cpu_seconds" in oh:
            bits.append(f"agent {float(oh['agent_cpu_seconds']):.2f} CPU-s")
        if "agent_max_rss_mb" in oh:
            bits.append(f"{float(oh['agent_max_rss_mb']):.0f} MB max RSS")
        if oh.get("target_slowdown_estimate") is not None:
            bits.append(f"estimated target slowdown {100 * float(oh['target_slowdown_estimate']):.1f}%")
        out.append(f'<p class="muted">Overhead: {esc(", ".join(bits))}'
                   + (f" ({esc(oh.get('estimate_basis'))})" if oh.get("estimate_basis") else "") + "</p>")
    line = sampling_line(report.get("sampling") or {})
    if line:
        out.append(f'<p class="muted">{esc(line)}</p>')
    for name, d in (oh.get("probes") or {}).items():
        out.append(f'<p class="muted probe-cost">{esc(name)}: {esc(fmt_value(d))}</p>')
    out.append("</section>")
    return out


def _page(title: str, body: Sequence[str], with_flames: bool) -> str:
    parts = ["<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">",
             '<meta name="viewport" content="width=device-width, initial-scale=1">',
             f"<title>{esc(title)}</title><style>{CSS}{flamegraph.CSS}</style></head><body>"]
    parts.extend(body)
    if with_flames:
        parts.append(f"<script>{flamegraph.SCRIPT}\n{PAGE_JS}</script>")
    parts.append("</body></html>\n")
    return "".join(parts)


def render(report: Mapping[str, Any], stream: TextIO, visuals: Mapping[str, Any] | None = None) -> None:
    """The diagnosis report as one HTML page."""
    visuals = visuals or {}
    body: list[str] = []
    body += _header(report)
    body += _findings(report)
    body += _timeline(visuals)
    flames, n = _flamegraphs(visuals)
    body += flames
    body += _manifest(report)
    body.append(f'<footer>trainprobe {esc(report.get("tool", {}).get("version"))}, schema '
                f'{esc(report.get("schema"))}. This file is self-contained: it loads nothing from the network.</footer>')
    tgt = report.get("target", {})
    stream.write(_page(f"trainprobe: PID {tgt.get('pid')}", body, n > 0))


DEFAULT_GROUP = "function"
GROUP_WORDS = {"function": "one box per function", "line": "one box per line"}


def _flame_block(profile: Mapping[str, int], title: str, subtitle: str, unit: str,
                 before: Mapping[str, int] | None, group: str, waiting: Mapping[str, int] | None,
                 threads: list[Mapping[str, Any]] | None) -> list[str]:
    """A flame graph with its controls: search, reset zoom, and frames grouped by function or by
    line (both drawn; the control shows one)."""
    group = group if group in folded.GROUPS else DEFAULT_GROUP
    opts = "".join(f'<option value="{g}"{" selected" if g == group else ""}>{esc(GROUP_WORDS[g])}</option>'
                   for g in folded.GROUPS)
    out = ['<div class="flame-block"><div class="tools"><input type="search" '
           'placeholder="Search frames (regular expression)" aria-label="search frames">'
           '<button type="button">Reset zoom</button>'
           f'<label>Frames: <select class="group" aria-label="group frames by">{opts}</select></label>'
           '<span class="found muted"></span></div>']
    for g in folded.GROUPS:
        r = flamegraph.render(folded.group(profile, g), title=title, subtitle=subtitle, unit=unit,
                              before=None if before is None else folded.group(before, g), standalone=False,
                              waiting=None if not waiting else folded.group(waiting, g), threads=threads)
        out.append(f'<div class="flame-wrap" data-group="{g}"{"" if g == group else " hidden"}>{r.svg}</div>')
    out.append("</div>")
    return out


def render_flamegraph_page(profile: Mapping[str, int], stream: TextIO, title: str, subtitle: str = "",
                           unit: str = "us", before: Mapping[str, int] | None = None, group: str = DEFAULT_GROUP,
                           waiting: Mapping[str, int] | None = None,
                           threads: list[Mapping[str, Any]] | None = None) -> None:
    """One flame graph as an HTML page, with a search box and the function/line control."""
    body = [f"<header><h1>{esc(title)}</h1>" + (f'<p class="muted">{esc(subtitle)}</p>' if subtitle else "") + "</header>"]
    body += _flame_block(profile, title, "", unit, before, group, waiting, threads)
    stream.write(_page(title, body, True))
