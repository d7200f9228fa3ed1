"""Terminal view of a preflight report: one row per check, the problems explained beneath them."""
from __future__ import annotations

import itertools
import textwrap
from typing import Any, TextIO

from trainprobe.reports.values import fmt_value
from trainprobe.reports.text import Style, use_color

ORDER = {"critical": 0, "warn": 1, "unknown": 2, "ok": 3}
WIDTH = 118


def _cells(s: Any, n: int) -> list[str]:
    """A cell's text wrapped to its column (words kept whole; a word longer than the column is split)."""
    s = " ".join(str("" if s is None else s).split())
    return textwrap.wrap(s, n, break_on_hyphens=False) or [""]


def _status(st: Style, s: str) -> str:
    word = f"{s.upper():<8}"
    return {"ok": st.green, "warn": st.yellow, "critical": st.red, "unknown": st.cyan}[s](word)


def render(report: dict[str, Any], stream: TextIO, color: bool | None = None, verbose: bool = False) -> None:
    from trainprobe.reports.values import terminal_safe_value

    report = terminal_safe_value(report)    # device names, mount points, messages from the host
    st = Style(use_color(stream) if color is None else color)
    lines: list[str] = []
    host, prof = report.get("host", {}), report.get("profile", {})
    head = (f"trainprobe {report['tool']['version']} preflight on {host.get('hostname')} "
            f"(profile {prof.get('name')}; tiers {', '.join(report.get('tiers', []))})")
    if report.get("replayed_from"):
        head += f" replayed from {report['replayed_from']}"
    lines.append(st.bold(head))
    lines.append("")
    widths = (30, 10, 42, 26)
    lines.append(st.dim(f"{'STATUS':<8}  {'CHECK':<{widths[0]}} {'TARGET':<{widths[1]}} {'OBSERVED':<{widths[2]}} "
                        f"{'EXPECTED':<{widths[3]}} TIME"))
    main = [c for c in report["checks"] if not c.get("informational")]
    info = [c for c in report["checks"] if c.get("informational")]

    def row(c: dict[str, Any], dim: bool = False) -> None:
        # Cells wrap within their columns (never cut mid-word): a row takes as many lines as its
        # longest cell.
        cols = [_cells(c["check"], widths[0]), _cells(c.get("target") or "", widths[1]),
                _cells(c["observed"], widths[2]), _cells(c["expected"], widths[3])]
        for k, parts in enumerate(itertools.zip_longest(*cols, fillvalue="")):
            text = " ".join(f"{x:<{w}}" for x, w in zip(parts, widths))
            text = text + " " + fmt_value(c["duration_s"], "s") if k == 0 else text.rstrip()
            head = f"{_status(st, c['status'])}  " if k == 0 else " " * 10
            lines.append(head + (st.dim(text) if dim else text))
        if c["status"] != "ok" or verbose:
            ind = " " * 10
            lines.append(textwrap.fill(c["message"], WIDTH, initial_indent=ind, subsequent_indent=ind + "  "))
            if c.get("remediation"):
                lines.append(textwrap.fill(st.cyan("fix: ") + c["remediation"], WIDTH + (9 if st.enabled else 0),
                                           initial_indent=ind, subsequent_indent=ind + "     "))

    for c in sorted(main, key=lambda c: ORDER[c["status"]]) if not verbose else main:
        row(c)
    if info:
        lines.append("")
        lines.append(st.dim("trainprobe's own probe prerequisites (informational: not part of the node's status)"))
        for c in info:
            row(c, dim=c["status"] == "ok")
    lines.append("")
    counts = report.get("counts", {})
    summary = ", ".join(f"{counts[s]} {s}" for s in ("critical", "warn", "unknown", "ok") if counts.get(s))
    verdict = _status(st, report["status"]).strip()
    lines.append(f"{verdict}: {summary}; exit {report['exit_code']} ({report.get('exit_policy')})"
                 f" in {report['duration_s']:.2f} s")
    if report.get("drain_reason"):
        lines.append(st.red("drain reason: ") + report["drain_reason"])
    stream.write("\n".join(lines) + "\n")
