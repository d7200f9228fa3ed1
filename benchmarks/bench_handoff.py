#!/usr/bin/env python3
"""What handing a batch from a DataLoader worker to the loop costs, per batch, on this machine.

A loop that loads its own batches pays for loading them; with a worker it pays instead for
receiving each one (the queue's read, unpickling, each tensor's storage fetched from the worker's
fd-sharing thread and mapped), and the worker pays for sending it beside the loading. Those costs are
per batch, not per second of loading: on a job of 8 ms steps they are a large part of the step, on
one of 100 ms steps a small one. The step model (agent/combiners/step_model.py: handoff_ms,
handoff_worker_ms, and handoff_k_timed's prior) takes its priors from this benchmark.

The dataset is MNIST-shaped, as torchvision's and Lightning's demos' MNIST hand it out: a
(1, 28, 28) float tensor and an int label per item, batch 32 (two tensors a batch), each item
costing ITEM_US of pure Python (0: a tensor slice; 130: about what the demos' PIL conversion and
ToTensor cost on the 2-CPU machine). One intra-op thread. Two parts, each repeated, modes alternating:

  costs   the loop does nothing but take batches. W=0: the loop thread's CPU a batch (L0). W=1 (one
          persistent worker): the loop thread's CPU a batch (h_loop, the receive), the worker
          process's CPU a batch, all its threads (L1). Over the two item costs, L1 = k L0 + h_worker.
  shapes  the loop also computes COMP_MS a step (matrix products): the step at W=0 and W=1 and their
          ratio, beside what the step model predicts for it from the measured shares (its data,
          loop and CPU terms with this run's h_loop and h_worker and the calibrated handoff_k_timed)

    python benchmarks/bench_handoff.py [--reps 5] [--batches 300] [--out DIR] [--sharing-strategy file_system]

--sharing-strategy sets torch.multiprocessing's strategy before the loaders are built: the default,
file_descriptor, passes each storage as an fd over a socket answered by a thread in the worker (a
handshake per tensor); file_system passes the shared-memory file's name (the step model's
handoff_ms_fs and handoff_worker_ms_fs).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

ITEMS_US = (0.0, 130.0)
SHAPES = ((130.0, 3.8), (130.0, 0.5), (30.0, 3.8), (400.0, 10.0))   # (item us, compute ms): Lightning's
# basics jobs on 2 CPUs (8 ms steps, loading 52%), loading-bound, cheap items, a 25 ms step


def spin(us: float) -> None:
    end = time.thread_time() + us / 1e6
    while time.thread_time() < end:
        sum(range(50))


class Items:
    """MNIST-shaped items, each costing `us` of Python."""

    def __init__(self, n: int, us: float):
        import torch
        self.data = torch.rand(n, 28, 28)
        self.targets = torch.randint(0, 10, (n,))
        self.us = us

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int):
        if self.us:
            spin(self.us)
        return self.data[i].unsqueeze(0), int(self.targets[i])


def tree_cpu(pids: list[int]) -> float:
    tot = 0
    for p in pids:
        for tid in os.listdir(f"/proc/{p}/task"):
            with open(f"/proc/{p}/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            tot += int(fields[11]) + int(fields[12])
    return tot / os.sysconf("SC_CLK_TCK")


class Compute:
    def __init__(self, ms: float):
        import torch
        self.a, self.b = torch.rand(256, 256), torch.rand(256, 256)
        t, n = time.perf_counter(), 0
        while time.perf_counter() - t < 0.3:
            self.a @ self.b
            n += 1
        self.n = max(1, int(ms * n / 300.0)) if ms else 0

    def __call__(self) -> None:
        for _ in range(self.n):
            self.a @ self.b


def timed(it, batches: int, compute, workers: bool) -> dict[str, float]:
    for _ in range(10):                       # the worker started, its prefetch full
        next(it)
        compute()
    wpids = [w.pid for w in getattr(it, "_workers", [])] if workers else []
    w0 = tree_cpu(wpids) if wpids else 0.0
    c0, t0 = time.thread_time(), time.perf_counter()
    for _ in range(batches):
        next(it)
        compute()
    c1, t1 = time.thread_time(), time.perf_counter()
    return {"loop_ms": 1000 * (c1 - c0) / batches, "wall_ms": 1000 * (t1 - t0) / batches,
            "worker_ms": 1000 * (tree_cpu(wpids) - w0) / batches if wpids else 0.0}


def loaders(us: float):
    from torch.utils.data import DataLoader
    ds = Items(60_000, us)
    return (iter(DataLoader(ds, batch_size=32, shuffle=True, num_workers=0)),
            iter(DataLoader(ds, batch_size=32, shuffle=True, num_workers=1, persistent_workers=True)))


def med(rows: list[dict[str, float]], k: str) -> float:
    return round(statistics.median(r[k] for r in rows), 3)


def predicted(l0: float, comp: float, h_loop: float, h_worker: float, k: float) -> float:
    """The step model's terms for this shape (a loop with one intra-op thread, 2 CPUs): W=0's step
    l0 + comp; with one worker the largest of the loop (comp + h_loop), the worker's round trip
    (k l0 + h_worker + HANDOFF_SERIAL h_loop) and the CPU over 2 CPUs. Returns the predicted speedup."""
    from trainprobe.agent.combiners.step_model import HANDOFF_SERIAL
    loop = comp + h_loop
    data = k * l0 + h_worker + HANDOFF_SERIAL * h_loop
    cpu = (comp + h_loop + k * l0 + h_worker) / 2.0
    return (l0 + comp) / max(loop, data, cpu)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--batches", type=int, default=300)
    ap.add_argument("--out", default=None)
    ap.add_argument("--sharing-strategy", default=None, choices=("file_descriptor", "file_system"))
    a = ap.parse_args()
    import torch
    torch.set_num_threads(1)
    if a.sharing_strategy:
        import torch.multiprocessing as tmp
        tmp.set_sharing_strategy(a.sharing_strategy)
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from trainprobe.agent.combiners.step_model import CAL
    none = Compute(0.0)
    costs: dict[float, list[dict[str, float]]] = {us: [] for us in ITEMS_US}
    its = {us: loaders(us) for us in ITEMS_US}
    for rep in range(a.reps):
        for us in ITEMS_US:
            r0 = timed(its[us][0], a.batches, none, False)
            r1 = timed(its[us][1], a.batches, none, True)
            costs[us].append({"L0_ms": r0["loop_ms"], "h_loop_ms": r1["loop_ms"], "L1_ms": r1["worker_ms"],
                              "wall1_ms": r1["wall_ms"]})
    summary = {us: {k: med(rows, k) for k in rows[0]} for us, rows in costs.items()}
    (la, lb) = (summary[ITEMS_US[0]], summary[ITEMS_US[1]])
    k = (lb["L1_ms"] - la["L1_ms"]) / max(lb["L0_ms"] - la["L0_ms"], 1e-6)
    h_worker = la["L1_ms"] - k * la["L0_ms"]
    h_loop = statistics.median([la["h_loop_ms"], lb["h_loop_ms"]])
    for us, s in summary.items():
        print(f"items of {us:g} us: loop loads {s['L0_ms']:.3f} ms a batch; with a worker the loop receives "
              f"{s['h_loop_ms']:.3f}, the worker spends {s['L1_ms']:.3f}, a batch every {s['wall1_ms']:.3f} ms")
    print(f"L1 = k L0 + h_worker: k = {k:.2f}, h_worker = {h_worker:.3f} ms; h_loop = {h_loop:.3f} ms")
    shapes = []
    for us, comp in SHAPES:
        it0, it1 = loaders(us)
        c = Compute(comp)
        steps0, steps1 = [], []
        for rep in range(max(3, a.reps - 1)):
            steps0.append(timed(it0, 150, c, False)["wall_ms"])
            steps1.append(timed(it1, 150, c, True)["wall_ms"])
        l0 = statistics.median(steps0) - comp
        meas = statistics.median(steps0) / statistics.median(steps1)
        pred = predicted(l0, comp, h_loop, h_worker, CAL.handoff_k_timed[1])
        pred_rate = predicted(l0, comp, 0.0, 0.0, CAL.handoff_k[1])
        shapes.append({"item_us": us, "compute_ms": comp, "step0_ms": round(statistics.median(steps0), 3),
                       "step1_ms": round(statistics.median(steps1), 3), "measured": round(meas, 3),
                       "predicted": round(pred, 3), "predicted_without_handoff": round(pred_rate, 3)})
        print(f"shape: items {us:g} us, compute {comp:g} ms: step {shapes[-1]['step0_ms']:.2f} -> "
              f"{shapes[-1]['step1_ms']:.2f} ms with a worker, {meas:.2f}x measured; the model's terms "
              f"{pred:.2f}x (without the per-batch hand-off {pred_rate:.2f}x)", flush=True)
    import torch.multiprocessing as tmp
    out = {"cpus": len(os.sched_getaffinity(0)), "torch": torch.__version__, "reps": a.reps, "batches": a.batches,
           "sharing_strategy": tmp.get_sharing_strategy(),
           "costs": {str(us): rows for us, rows in costs.items()}, "summary": {str(us): s for us, s in summary.items()},
           "k": round(k, 3), "h_worker_ms": round(h_worker, 3), "h_loop_ms": round(h_loop, 3),
           "k_calibrated": CAL.handoff_k_timed[1], "shapes": shapes}
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "handoff.json"), "w") as f:
            json.dump(out, f, indent=1)
    os._exit(0)      # the persistent workers: no orderly shutdown needed


if __name__ == "__main__":
    sys.exit(main())
