#!/usr/bin/env python3
"""Replay the real H200 captures (tests/data/h200: NVML streams + py-spy) through the gpu probe's
parser, the idle-time attribution and the rules, and print what a live run would have reported,
next to the speedups the fixes measured on that node. No GPU needed.

    python benchmarks/gpu_replay.py
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from trainprobe.agent.analysis.gpu_idle import CAUSES, for_evidence  # noqa: E402
from trainprobe.agent.report import diagnose  # noqa: E402
from tests.helpers import H200_MODES, h200_evidence  # noqa: E402

# Steps/s each capture's workload measured (tests/data/h200/README.md).
STEPS_PER_S = {"starved": 34.8, "fixed": 217.0, "healthy": 112.5, "sync": 248.1, "pageable": 20.9, "pinned": 124.9}
PAIRS = (("starved", "fixed"), ("pageable", "pinned"))


def main() -> None:
    print("| mode | GPU busy | GPU idle while the loop ... (share of the time) | top finding | predicted speedup |")
    print("|---|---|---|---|---|")
    top: dict[str, tuple[str, float]] = {}
    for mode in H200_MODES:
        ev = h200_evidence(mode)
        att = for_evidence(ev)
        findings, _runs = diagnose(ev)
        f = findings[0] if findings else None
        top[mode] = (f.id, f.expected_speedup) if f else ("-", 1.0)
        causes = ", ".join(f"{c} {att.idle_share(c):.0%}" for c in sorted(CAUSES, key=att.idle_share, reverse=True)
                           if att.idle_share(c) >= 0.01)
        print(f"| {mode} | {ev.get('gpu')['busy_fraction']:.1%} | {causes or '-'} | {top[mode][0]} | "
              f"{top[mode][1]:.2f}x |")
    print()
    print("| fix | predicted (slow mode's top finding) | measured on the H200 | predicted / measured |")
    print("|---|---|---|---|")
    for slow, fast in PAIRS:
        measured = STEPS_PER_S[fast] / STEPS_PER_S[slow]
        fid, pred = top[slow]
        print(f"| {slow} -> {fast} | {fid} {pred:.2f}x | {measured:.2f}x | {pred / measured:.2f} |")


if __name__ == "__main__":
    main()
