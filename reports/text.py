"""Terminal view of a Report: the top finding first, its expected speedup, the evidence, the fix."""
from __future__ import annotations

import os
import textwrap
from typing import Any, TextIO

from trainprobe.reports.values import (NOT_WORTH_WORDS, fmt_interval, fmt_value, short_reason, slowdown_text,
                                       terminal_safe_value, worth_acting)

WIDTH = 100


class Style:
    def __init__(self, enabled: bool):
        self.enabled = enabled

    def _w(self, code: str, s: str) -> str:
        return f"\033[{code}m{s}\033[0m" if self.enabled else s

    def bold(self, s: str) -> str:
        return self._w("1", s)

    def dim(self, s: str) -> str:
        return self._w("2", s)

    def green(self, s: str) -> str:
        return self._w("32", s)

    def yellow(self, s: str) -> str:
        return self._w("33", s)

    def red(self, s: str) -> str:
        return self._w("31", s)

    def cyan(self, s: str) -> str:
        return self._w("36", s)


def use_color(stream: TextIO) -> bool:
    return hasattr(stream, "isatty") and stream.isatty() and "NO_COLOR" not in os.environ


def _wrap(text: str, indent: str) -> str:
    return textwrap.fill(text, WIDTH, initial_indent=indent, subsequent_indent=indent + "  ")


def render_findings(findings: list[dict[str, Any]], st: Style) -> list[str]:
    out: list[str] = []
    for i, f in enumerate(findings, 1):
        sp = f["expected_speedup"]
        iv = f.get("expected_speedup_interval")
        sp_s = (fmt_value(sp, "x") if sp > 1.0 else
                f"1.0x (no host-side gain; the fix {slowdown_text(f)})" if f.get("expected_change") is not None else
                "1.0x (no host-side gain)")
        if sp > 1.0 and iv:
            sp_s += f" ({fmt_interval(iv)})"
        if not worth_acting(f):
            # Below the headline's limit: the same words and the same muted tone in every view.
            out.append(st.dim(f"#{i}  {f['id']}   expected speedup {sp_s}: {NOT_WORTH_WORDS}"
                              f"   confidence {f['confidence']}"))
        else:
            colour = st.green if f["id"] == "compute.bound" else (st.red if sp >= 1.5 else st.yellow)
            out.append(f"{st.bold(f'#{i}')}  {colour(st.bold(f['id']))}   expected speedup {st.bold(sp_s)}"
                       f"   confidence {f['confidence']}")
        out.append(_wrap(st.bold(f["title"]), "    "))
        if f.get("evidence"):
            out.append("    " + st.dim("evidence"))
            for e in f["evidence"]:
                out.append(_wrap(f"{e['probe']:<8} {e['fact']}: {fmt_value(e['value'])}", "      "))
        for fx in f.get("fixes", []):
            out.append("    " + st.cyan("fix: ") + fx["title"])
            if fx.get("change"):
                out.extend("      " + st.bold(line) for line in fx["change"].splitlines())
            if fx.get("command"):
                out.append("      $ " + st.bold(fx["command"]))
        out.append(_wrap(st.dim("how the number was derived: " + f["speedup_bound"]), "    "))
        out.append("")
    return out


_CAUSE_WORDS = {"data_wait": "waited for batches", "data_load": "loaded batches", "h2d_copy": "copied to the GPU",
                "launch": "ran forward/backward/optimizer", "other": "did other work", "host_sync": "synced"}


def _gpu_line(gpu: dict[str, Any] | None) -> str | None:
    if not gpu or gpu.get("busy_fraction") is None:
        return None
    idx = ",".join(str(i) for i in gpu.get("target_gpus") or [])
    line = (f"GPU {idx}: {fmt_value(gpu['busy_fraction'], '%')} busy (NVML, "
            f"{1000 * (gpu.get('sample_period_s') or 0):.0f} ms samples)")
    att = gpu.get("idle_attribution") or {}
    shares = sorted(((v, k) for k, v in (att.get("idle_share_by_cause") or {}).items() if v >= 0.01), reverse=True)
    if att.get("ok") and shares:
        line += "; idle while the loop " + ", ".join(f"{_CAUSE_WORDS.get(k, k)} {fmt_value(v, '%')}" for v, k in shares[:3])
    return line


def render(report: dict[str, Any], stream: TextIO, color: bool | None = None) -> None:
    # Every string of the report may come from the target (argv, thread and frame names): escaped.
    report = terminal_safe_value(report)
    st = Style(use_color(stream) if color is None else color)
    host, tgt, win = report["host"], report["target"], report["window"]
    lines: list[str] = []
    gpus = host.get("gpus") or []
    gpu_s = f"{len(gpus)} GPU{'s' if len(gpus) != 1 else ''}" if gpus else "no GPU"
    lines.append(st.bold(f"trainprobe {report['tool']['version']} - {report['command']} PID {tgt.get('pid')}")
                 + st.dim(f"  ({win.get('seconds', 0):.1f} s window on {host.get('hostname')}: "
                          f"{host.get('cpus')} CPUs, {host.get('numa_nodes')} NUMA node(s), {gpu_s})"))
    if tgt.get("cmdline"):
        lines.append(st.dim("target: " + textwrap.shorten(tgt["cmdline"], WIDTH - 8)))
    workers = [w for w in tgt.get("workers", []) if w.get("role") == "dataloader_worker"]
    ranks = [w for w in tgt.get("workers", []) if w.get("role") == "rank"]
    others = [w for w in tgt.get("workers", []) if w.get("role") not in ("dataloader_worker", "rank")]
    lines.append(st.dim(f"threads: {tgt.get('threads')}; "
                        + (f"training processes (ranks): {len(ranks)} "
                           f"({', '.join(str(w['pid']) for w in ranks[:8])}{' ...' if len(ranks) > 8 else ''}); "
                           if ranks else "")
                        + f"DataLoader workers: {len(workers)}"
                        + (f" ({', '.join(str(w['pid']) for w in workers[:8])}{' ...' if len(workers) > 8 else ''})"
                           if workers else "")
                        + (f"; other children: {len(others)}" if others else "")
                        + (f"; {tgt['backward_per_s']:.3g} backward passes a second (a step of about "
                           f"{1000.0 / tgt['backward_per_s']:.3g} ms where each step runs one)"
                           if tgt.get("backward_per_s") else "")))
    gpu_line = _gpu_line(report.get("gpu"))
    if gpu_line:
        lines.append(st.dim(gpu_line))
    for n in report.get("notes", []):
        lines.append(st.yellow("note: ") + n)
    for n in ((win.get("trust") or {}).get("reasons") or []):
        lines.append(st.yellow("window: ") + n + "; the verdict may not hold for the job's steady state")
    if report.get("windows"):
        lines.append(st.bold("windows: ") + report["windows"]["verdict"])
    if report.get("headline"):
        lines.append(st.bold(report["headline"]))
    lines.append("")
    findings = report["findings"]
    if not findings:
        lines.append("No finding: the evidence gathered does not point at a host-side cause.")
        lines.append("")
    else:
        lines.extend(render_findings(findings, st))
    probe_bits = []
    shortened = False
    for p in report["probes"]:
        s = p["status"]
        mark = st.green(s) if s == "ok" else (st.yellow(s) if s == "skipped" else st.red(s))
        why = short_reason(p)       # the full reason is in --json (probes[].reason) and docs/probes.md
        shortened = shortened or (why is not None and why != " ".join(str(p.get("reason") or "").split()))
        probe_bits.append(f"{p['name']} {mark}" + (f" ({why})" if why else ""))
    lines.append(_wrap(st.dim("probes: ") + "; ".join(probe_bits)
                       + (st.dim("; full reasons: --json") if shortened else ""), ""))
    oh = report.get("overhead") or {}
    if oh:
        slow = oh.get("target_slowdown_estimate")
        lines.append(st.dim(f"overhead: agent {oh.get('agent_cpu_seconds', 0):.2f} CPU-s, "
                            f"{oh.get('agent_max_rss_mb', 0):.0f} MB max RSS"
                            + (f", estimated target slowdown {100 * slow:.1f}%" if slow is not None else "")
                            + (f" (budget {oh['plan']['budget_cpu_seconds']:.2f} CPU-s)" if oh.get("plan") else "")
                            + _class_bit(oh.get("scheduling_class"))))
    line = sampling_line(report.get("sampling") or {})
    if line:
        lines.append(st.dim(line))
    stream.write("\n".join(lines) + "\n")


def _class_bit(sc: dict | None) -> str:
    """The agent's scheduling class, and where auto took it back to normal."""
    if not sc:
        return ""
    cls = {"idle": "SCHED_IDLE", "low": "nice 10"}.get(sc.get("class"), "normal priority")
    how = f"auto, {sc['free_cpus']:.1f} CPUs idle at start" if sc.get("asked") == "auto" and sc.get("free_cpus") is not None else sc.get("asked")
    return f"; ran at {cls} ({how}" + ("; back to normal: it waited for a CPU" if sc.get("promoted") else "") + ")"


def sampling_line(sm: dict) -> str | None:
    """One line: what py-spy sampled, at what rate, and the precision of a share that gives."""
    tp = sm.get("training_process")
    if not tp:
        return None
    hw = tp.get("share_half_width_95")
    out = (f"sampling: training process {tp.get('rate_hz', 0):g} Hz ({tp.get('samples', 0)} samples"
           + (f", shares +-{100 * hw:.0f} pts" if hw else "") + ")")
    w = sm.get("workers")
    if w and w.get("known"):
        if w.get("sampled"):
            whw = w.get("share_half_width_95")
            out += (f"; workers: {w['sampled']} of {w['known']} at {w.get('rate_hz', 0):g} Hz, {w.get('rotation')}"
                    + (f" (+-{100 * whw:.0f} pts)" if whw else ""))
        else:
            out += f"; workers: {w['known']} not sampled by py-spy (budget), their CPU from /proc"
    return out
