"""A bystander for the paired cost design (benchmarks/gpu_cost.py --control-cpu N): a fixed, small piece
of CPU work repeated on one pinned CPU, printing `PROGRESS t=<unix> steps=<n>` after every repetition.

Its working set (a few KB of Python integers) stays in the core's own caches, so its pace follows its
CPU's speed of the moment and little else. On the 2-CPU VM two such loops on the two CPUs moved
together (correlation 0.96 of their 2 s paces over a minute); on the 16-CPU H100 node the loop swung as
much as the job beside it and correlated with it at 0.47, so there the ratio over it is wider than the
job's own (docs/cost.md). The paired design divides the job's work rate by this loop's in the same
windows.
"""
from __future__ import annotations

import time


def main() -> None:
    steps = 0
    while True:
        x = 0
        for i in range(60000):
            x += i * i
        steps += 1
        print(f"PROGRESS t={time.time():.4f} steps={steps}", flush=True)


if __name__ == "__main__":
    main()
