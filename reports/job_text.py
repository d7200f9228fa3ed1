"""Terminal view of a job report (`diagnose --slurm-job`): nodes and ranks, stragglers, the job's
expected speedup, per-node fixes."""
from __future__ import annotations

import textwrap
from typing import Any, TextIO

from trainprobe.reports.values import fmt_value
from trainprobe.reports.text import WIDTH, Style, use_color


def _clean(s: Any) -> str:
    # Strings from a node are data: no control characters reach the terminal.
    return "".join(ch if ch.isprintable() else "?" for ch in str("" if s is None else s))


def _val(v: Any, unit: str | None = None) -> str:
    """A value from a node, written as every view writes it (a node may send a string for a number)."""
    return _clean(fmt_value(v, unit))


def _top(r: dict[str, Any]) -> str:
    if r.get("waits_for"):
        return "waits for " + ", ".join(r["waits_for"])
    return r.get("top_finding") or "-"


def render(report: dict[str, Any], stream: TextIO, color: bool | None = None) -> None:
    st = Style(use_color(stream) if color is None else color)
    job, win = report["job"], report.get("window") or {}
    lines = [st.bold(f"trainprobe {report['tool']['version']} - {report['command']} Slurm job {_clean(job['id'])}")
             + st.dim(f"  ({len(job['nodes_ok'])} of {len(job['nodes'])} node(s) reported"
                      + (f", {_val(win['seconds'])} s window" if win.get("seconds") else "")
                      + (f", report in {report['fan_out']['seconds']:.1f} s" if report.get("fan_out") else "") + ")")]
    lines.append("")
    hdr = f"{'node':<12} {'rank':>4} {'pid':>8} {'data':>6} {'coll.':>6} {'sync':>6} {'GPU':>5}  {'top finding':<22} {'speedup':>8}"
    lines.append(st.bold(hdr))
    strag = {(s["node"], s["pid"]) for s in report.get("stragglers", [])}
    for r in report.get("ranks", []):
        mark = st.red(" <- straggler") if (r["node"], r["pid"]) in strag else ""
        lines.append(f"{_clean(r['node']):<12} {_val(r.get('rank')):>4} {r['pid']:>8} "
                     f"{_val(r.get('data_share'), '%'):>6} {_val(r.get('collective_share'), '%'):>6} "
                     f"{_val(r.get('host_sync_share'), '%'):>6} {_val(r.get('gpu_busy'), '%'):>5}  "
                     f"{_clean(_top(r)):<22} "
                     f"{_val(r.get('expected_speedup') if not r.get('waits_for') else None, 'x'):>8}{mark}")
    for n in report.get("nodes", []):
        if n["status"] != "ok":
            lines.append(f"{_clean(n['node']):<12} {st.red(n['status'])}: {_clean(n.get('reason'))}")
    lines.append(st.dim("data: share of the step waiting for or loading batches; coll.: waiting in collectives "
                        "(off-CPU outside data waits); sync: host-device syncs; GPU: NVML busy"))
    lines.append("")
    if report.get("stragglers"):
        for s in report["stragglers"]:
            lines.append(textwrap.fill(st.bold(f"Straggler: node {_clean(s['node'])}, rank {s.get('rank')} (PID {s['pid']})")
                                       + f": {_clean(s.get('title') or s.get('cause'))}", WIDTH,
                                       subsequent_indent="  "))
        lines.append(st.bold(f"Job expected speedup when the straggler(s) are fixed: {_val(report.get('job_expected_speedup'), 'x')}"))
    else:
        lines.append("No straggler: no rank's own stall stands out.")
    lines.append(textwrap.fill(st.dim("how: " + _clean(report.get("job_speedup_bound"))), WIDTH, subsequent_indent="  "))
    lines.append("")
    for n in report.get("nodes", []):
        if not n.get("fixes") and not n.get("numactl"):
            continue
        lines.append(st.bold(f"Fixes on node {_clean(n['node'])}:"))
        for fx in n.get("fixes", []):
            lines.append(f"  {st.cyan(_clean(fx['finding']))} ({_val(fx.get('expected_speedup'), 'x')}): {_clean(fx['title'])}")
            if fx.get("change"):
                lines.extend("      " + _clean(ln) for ln in str(fx["change"]).splitlines())
            if fx.get("command"):
                lines.append("      $ " + _clean(fx["command"]))
        for cmd in n.get("numactl", []):
            lines.append("  numactl: $ " + _clean(cmd))
        lines.append("")
    for n in report.get("nodes", []):
        if n.get("probes_not_ok"):
            lines.append(st.dim(f"{_clean(n['node'])} probes: " + "; ".join(_clean(x) for x in n["probes_not_ok"])))
    for note in report.get("notes", []):
        lines.append(st.yellow("note: ") + _clean(note))
    stream.write("\n".join(lines) + "\n")
