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
    for s in rep.get("stragglers", []):
        out.append(f"<p><b>Straggler: node {esc(s['node'])}, rank {esc(s.get('rank'))} (PID {esc(s['pid'])})</b>: "
                   f"{esc(s.get('title') or s.get('cause'))}</p>")
    out.append("<h2>Nodes and ranks</h2><table><tr><th class=l>node</th><th>rank</th><th>PID</th><th>data wait</th>"
               "<th>collectives</th><th>host sync</th><th>GPU busy</th><th class=l>top finding</th><th>speedup</th></tr>")
    for r in rep.get("ranks", []):
        cls = " class=straggler" if (r["node"], r["pid"]) in strag else ""
        out.append(f"<tr{cls}><td class=l>{esc(r['node'])}</td><td>{esc(fmt_value(r.get('rank')))}</td><td>{esc(r['pid'])}</td>"
                   f"<td>{_pct(r.get('data_share'))}</td><td>{_pct(r.get('collective_share'))}</td>"
                   f"<td>{_pct(r.get('host_sync_share'))}</td><td>{_pct(r.get('gpu_busy'))}</td>"
                   f"<td class=l>{esc('waits for ' + ', '.join(r['waits_for']) if r.get('waits_for') else (r.get('top_finding') or '-'))}</td>"
                   f"<td>{esc(fmt_value(r.get('expected_speedup'), 'x'))}</td></tr>")
    for n in rep.get("nodes", []):
        if n["status"] != "ok":
            out.append(f"<tr><td class=l>{esc(n['node'])}</td><td colspan=8 class='l bad'>{esc(n['status'])}: "
                       f"{esc(n.get('reason'))}</td></tr>")
    out.append("</table>")
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
