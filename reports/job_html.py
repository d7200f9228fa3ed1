"""HTML view of a job report: the node/rank table with stragglers marked, per-node fixes, and each
node's own findings. One self-contained file, every string escaped."""
from __future__ import annotations

from typing import Any

from trainprobe.reports import xmlsafe
from trainprobe.reports.values import fmt_value

CSS = """body{font:14px/1.45 system-ui,sans-serif;margin:2em;color:#222}table{border-collapse:collapse}
td,th{padding:3px 10px;border-bottom:1px solid #ddd;text-align:right}td.l,th.l{text-align:left}
tr.straggler{background:#fde8e8}.bad{color:#b00}.dim{color:#777}code{background:#f4f4f4;padding:1px 4px}
.bar{display:inline-block;height:9px;background:#4a90d9;vertical-align:middle;margin-left:4px}"""


def esc(x: Any) -> str:
    return xmlsafe.escape(x)


def _pct(v: Any) -> str:
    if v is None:
        return "-"
    w = max(0, min(100, int(100 * float(v))))
    return f"{fmt_value(float(v), '%')}<span class=bar style='width:{w // 2}px'></span>"


def _stragglers(rep: dict[str, Any]) -> list[str]:
    out = []
    for s in rep.get("stragglers", []):
        out.append(f"<p><b>Straggler: node {esc(s['node'])}, rank {esc(fmt_value(s.get('rank')))} (PID {esc(s['pid'])})</b>: "
                   f"waits {esc(fmt_value(s.get('collective_share'), '%'))} of its step in collectives, the others "
                   f"{esc(fmt_value(s.get('others_collective_share'), '%'))}; its own work is "
                   f"{esc(fmt_value(s.get('excess_share'), '%'))} of the step longer (error &plusmn;"
                   f"{esc(fmt_value(s.get('error_share'), '%'))})</p><ul>")
        for c in s.get("causes") or []:
            out.append(f"<li><b>{esc(c['cause'])}</b> ({esc(fmt_value(c.get('share'), '%'))} of the step; job "
                       f"{esc(fmt_value(c.get('job_speedup_if_removed'), 'x'))} if removed): {esc(c.get('title'))}"
                       f"<br>fix: {esc(c.get('fix'))}"
                       + (f"<br><code>$ {esc(c['command'])}</code>" if c.get("command") else "") + "</li>")
        if s.get("note"):
            out.append(f"<li class=bad>{esc(s['note'])}</li>")
        out.append("</ul>")
    if not rep.get("stragglers"):
        out.append(f"<p>No straggler: {esc(rep.get('no_straggler_reason') or 'no rank stands out')}</p>")
    return out


_SIDE_ROWS = (("collective wait", "collective_share", "%"), ("own work", "own_work_share", "%"),
              ("data wait", "data_share", "%"), ("host sync", "host_sync_share", "%"),
              ("waiting for a CPU", "run_delay_share", "%"), ("on a CPU", "cpu_share", "%"),
              ("CPUs allowed", "cpus_allowed", None), ("GPU busy", "gpu_busy", "%"),
              ("py-spy samples", "samples", None))


def _rank_rows(rep: dict[str, Any], strag: set) -> list[str]:
    """One row per rank: where its step goes, and the cause and fix of a straggler."""
    out = ["<h2>Nodes and ranks</h2><table><tr><th class=l>node</th><th>rank</th><th>PID</th>"
           "<th>collectives</th><th>own work</th><th>data wait</th><th>host sync</th><th>CPU wait</th>"
           "<th>GPU busy</th><th class=l>cause / fix</th><th>speedup</th></tr>"]
    for r in rep.get("ranks", []):
        cls = " class=straggler" if (r["node"], r["pid"]) in strag else ""
        if r.get("waits_for"):
            what = "waits for " + ", ".join(r["waits_for"])
        elif r.get("straggler"):
            what = f"straggler: {r.get('cause')}: {r.get('fix') or ''}"
        else:
            what = r.get("top_finding") or "-"
        sp = next((s.get("expected_speedup") for s in rep.get("stragglers", [])
                   if (s["node"], s["pid"]) == (r["node"], r["pid"])), None) if cls else (
            None if r.get("waits_for") else r.get("expected_speedup"))
        out.append(f"<tr{cls}><td class=l>{esc(r['node'])}</td><td>{esc(fmt_value(r.get('rank')))}</td><td>{esc(r['pid'])}</td>"
                   f"<td>{_pct(r.get('collective_share'))}</td><td>{_pct(r.get('own_work_share'))}</td>"
                   f"<td>{_pct(r.get('data_share'))}</td><td>{_pct(r.get('host_sync_share'))}</td>"
                   f"<td>{_pct(r.get('run_delay_share'))}</td><td>{_pct(r.get('gpu_busy'))}</td>"
                   f"<td class=l>{esc(what)}</td><td>{esc(fmt_value(sp, 'x'))}</td></tr>")
    for n in rep.get("nodes", []):
        if n["status"] != "ok":
            out.append(f"<tr><td class=l>{esc(n['node'])}</td><td colspan=10 class='l bad'>{esc(n['status'])}: "
                       f"{esc(n.get('reason'))}</td></tr>")
    out.append("</table>")
    return out


def _left(c: str) -> str:
    return " class='straggler l'" if c else " class=l"


def _ranks_side_by_side(rep: dict[str, Any], strag: set) -> list[str]:
    """One column per rank, one row per measure: the straggler's column beside the others'."""
    ranks = rep.get("ranks", [])
    cls = [" class=straggler" if (r["node"], r["pid"]) in strag else "" for r in ranks]
    if not ranks:
        return []
    out = ["<h2>Ranks side by side</h2><table><tr><th class=l></th>"
           + "".join(f"<th{c}>{esc(r['node'])} rank {esc(fmt_value(r.get('rank')))}<br>"
                     f"<span class=dim>PID {esc(r['pid'])}</span></th>" for r, c in zip(ranks, cls)) + "</tr>"]
    for label, key, unit in _SIDE_ROWS:
        cells = "".join(f"<td{c}>{_pct(r.get(key)) if unit == '%' else esc(fmt_value(r.get(key)))}</td>"
                        for r, c in zip(ranks, cls))
        out.append(f"<tr><th class=l>{esc(label)}</th>{cells}</tr>")
    def gpu_clock(r: dict[str, Any]) -> str:
        g = r.get("gpu") or {}
        if not g.get("sm_clock_mhz"):
            return "-"
        return f"{fmt_value(g['sm_clock_mhz'])} MHz" + (f" / {fmt_value(g['max_sm_clock_mhz'])}" if g.get("max_sm_clock_mhz") else "")
    out.append("<tr><th class=l>GPU SM clock</th>" + "".join(f"<td{c}>{esc(gpu_clock(r))}</td>" for r, c in zip(ranks, cls))
               + "</tr>")
    out.append("<tr><th class=l>hottest functions</th>" + "".join(
        f"<td{_left(c)}>" + "<br>".join(f"{esc(k)} {esc(fmt_value(v, '%'))}" for k, v in
                                         list((r.get("hot_functions") or {}).items())[:3]) + "</td>"
        for r, c in zip(ranks, cls)) + "</tr>")
    def verdict(r: dict[str, Any]) -> str:
        if r.get("waits_for"):
            return "waits for " + ", ".join(r["waits_for"])
        if r.get("straggler"):
            return f"straggler ({r.get('cause')}): {r.get('fix') or ''}"
        return r.get("top_finding") or "-"
    out.append("<tr><th class=l>cause / fix</th>" + "".join(f"<td{_left(c)}>{esc(verdict(r))}</td>"
                                                          for r, c in zip(ranks, cls)) + "</tr>")
    out.append("<tr><th class=l>speedup</th>" + "".join(
        f"<td{c}>{esc(fmt_value(r.get('expected_speedup') if not r.get('waits_for') else None, 'x'))}</td>"
        for r, c in zip(ranks, cls)) + "</tr>")
    out.append("</table>")
    return out


def render(rep: dict[str, Any]) -> str:
    job = rep["job"]
    strag = {(s["node"], s["pid"]) for s in rep.get("stragglers", [])}
    out = [f"<!doctype html><meta charset=utf-8><title>trainprobe job {esc(job['id'])}</title><style>{CSS}</style>",
           f"<h1>Slurm job {esc(job['id'])}</h1>",
           f"<p class=dim>{len(job['nodes_ok'])} of {len(job['nodes'])} node(s) reported; "
           f"window {esc(fmt_value((rep.get('window') or {}).get('seconds')))} s; trainprobe {esc(rep['tool']['version'])}</p>"]
    sp = rep.get("job_expected_speedup")
    out.append(f"<h2>Job expected speedup: {esc(fmt_value(sp, 'x') if sp else 'none predicted')}</h2>"
               f"<p class=dim>{esc(rep.get('job_speedup_bound'))}</p>")
    out.extend(_stragglers(rep))
    out.extend(_rank_rows(rep, strag))
    out.extend(_ranks_side_by_side(rep, strag))
    for n in rep.get("nodes", []):
        out.append(f"<h3>Node {esc(n['node'])} <span class=dim>{esc(n['status'])}"
                   f"{' / Slurm: ' + esc(n['slurm_state']) if n.get('slurm_state') else ''}</span></h3><ul>")
        for fx in n.get("fixes", []):
            out.append(f"<li><b>{esc(fx['finding'])}</b>: {esc(fx['title'])}"
                       + (f"<br><code>{esc(fx['change'])}</code>" if fx.get("change") else "")
                       + (f"<br><code>$ {esc(fx['command'])}</code>" if fx.get("command") else "") + "</li>")
        for c in n.get("numactl", []):
            out.append(f"<li>numactl: <code>$ {esc(c)}</code></li>")
        for p in n.get("probes_not_ok", []):
            out.append(f"<li class=dim>{esc(p)}</li>")
        out.append("</ul>")
        for rep_n in (rep.get("node_reports") or {}).get(n["node"], []):
            for f in rep_n.get("findings", [])[:3]:
                out.append(f"<p>{esc(f['id'])} ({esc(fmt_value(f['expected_speedup'], 'x'))}): {esc(f['title'])}</p>")
    for note in rep.get("notes", []):
        out.append(f"<p class=bad>note: {esc(note)}</p>")
    return "\n".join(out) + "\n"
