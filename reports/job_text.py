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
    if r.get("straggler"):
        return "straggler: " + str(r.get("cause") or "?")
    return r.get("top_finding") or "-"


def _straggler_lines(report: dict[str, Any], st: Style) -> list[str]:
    lines: list[str] = []
    for s in report.get("stragglers", []):
        lines.append(textwrap.fill(st.bold(f"Straggler: node {_clean(s['node'])}, rank {_val(s.get('rank'))} "
                                           f"(PID {s['pid']})") + f": waits {_val(s.get('collective_share'), '%')} "
                                   f"of its step in collectives, the others {_val(s.get('others_collective_share'), '%')}: "
                                   f"its own work is {_val(s.get('excess_share'), '%')} of the step longer "
                                   f"(error +-{_val(s.get('error_share'), '%')})", WIDTH, subsequent_indent="  "))
        for c in s.get("causes") or []:
            lines.append(textwrap.fill(f"  cause {st.cyan(_clean(c['cause']))} ({_val(c.get('share'), '%')} of the step, "
                                       f"job {_val(c.get('job_speedup_if_removed'), 'x')} if removed): "
                                       f"{_clean(c.get('title'))}", WIDTH, subsequent_indent="      "))
            lines.append(textwrap.fill(f"      fix: {_clean(c.get('fix'))}", WIDTH, subsequent_indent="        "))
            if c.get("command"):
                lines.append("      $ " + _clean(c["command"]))
        if s.get("note"):
            lines.append(textwrap.fill("  " + st.yellow("note: ") + _clean(s["note"]), WIDTH, subsequent_indent="      "))
    return lines


def render(report: dict[str, Any], stream: TextIO, color: bool | None = None) -> None:
    st = Style(use_color(stream) if color is None else color)
    job, win = report["job"], report.get("window") or {}
    lines = [st.bold(f"trainprobe {report['tool']['version']} - {report['command']} Slurm job {_clean(job['id'])}")
             + st.dim(f"  ({len(job['nodes_ok'])} of {len(job['nodes'])} node(s) reported"
                      + (f", {_val(win['seconds'])} s window" if win.get("seconds") else "")
                      + (f", report in {report['fan_out']['seconds']:.1f} s" if report.get("fan_out") else "") + ")")]
    lines.append("")
    hdr = (f"{'node':<10} {'rank':>4} {'pid':>8} {'coll.':>6} {'own':>6} {'data':>6} {'sync':>6} {'CPUq':>6} "
           f"{'GPU':>5}  {'cause / top finding':<26} {'speedup':>8}")
    lines.append(st.bold(hdr))
    strag = {(s["node"], s["pid"]) for s in report.get("stragglers", [])}
    for r in report.get("ranks", []):
        mark = st.red(" <- straggler") if (r["node"], r["pid"]) in strag else ""
        sp = None if r.get("waits_for") else r.get("expected_speedup")
        if (r["node"], r["pid"]) in strag:
            sp = next((s.get("expected_speedup") for s in report["stragglers"]
                       if (s["node"], s["pid"]) == (r["node"], r["pid"])), sp)
        lines.append(f"{_clean(r['node']):<10} {_val(r.get('rank')):>4} {r['pid']:>8} "
                     f"{_val(r.get('collective_share'), '%'):>6} {_val(r.get('own_work_share'), '%'):>6} "
                     f"{_val(r.get('data_share'), '%'):>6} {_val(r.get('host_sync_share'), '%'):>6} "
                     f"{_val(r.get('run_delay_share'), '%'):>6} {_val(r.get('gpu_busy'), '%'):>5}  "
                     f"{_clean(_top(r)):<26} {_val(sp, 'x'):>8}{mark}")
    for n in report.get("nodes", []):
        if n["status"] != "ok":
            lines.append(f"{_clean(n['node']):<10} {st.red(n['status'])}: {_clean(n.get('reason'))}")
    lines.append(st.dim("coll.: share of the step waiting in collectives (off-CPU outside data waits); own: the rank's "
                        "own work (1 - coll.); data: waiting for or loading batches; sync: host-device syncs; "
                        "CPUq: waiting for a CPU; GPU: NVML busy"))
    lines.append("")
    if report.get("stragglers"):
        lines.extend(_straggler_lines(report, st))
        lines.append(st.bold(f"Job expected speedup when the straggler(s) are as fast as the others: "
                             f"{_val(report.get('job_expected_speedup'), 'x')}"))
    else:
        lines.append(textwrap.fill("No straggler: " + _clean(report.get("no_straggler_reason")
                                                             or "no rank's collective wait stands out."),
                                   WIDTH, subsequent_indent="  "))
    if report.get("stragglers"):
        lines.append(textwrap.fill(st.dim("how: " + _clean(report.get("job_speedup_bound"))), WIDTH,
                                   subsequent_indent="  "))
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
