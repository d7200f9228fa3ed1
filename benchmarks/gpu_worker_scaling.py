"""How a DataLoader pipeline's rate scales with its worker count on this node: the question one
window at today's count cannot answer (docs/models.md, scale_a), measured directly.

For timm's own loader (`timm.data.create_loader`, as its train.py builds it with --no-aug and the
prefetcher) over the public ledger's JPEG ImageFolder, and for the same pipeline over an epoch ten
times as long, it iterates the loader at several worker counts and prints, per count:

    batches/s, per-worker batches/s over the 2-worker rate, the epoch's first-batch wait (s),
    the workers' CPU-s per batch and the main process's CPU-s per batch

plus the node's CPU topology (logical CPUs, cores, SMT siblings), so a fall in per-worker rate can be
told apart: CPU per batch rising (shared cores, memory bandwidth), or the workers idle (the epoch's
drain and refill when an epoch holds few batches per worker; the main process).

    python benchmarks/gpu_worker_scaling.py --data DIR [--workers 2,6,12] [--repeat 1,10] [--seconds 8] [--json OUT]

(`first_batch_wait_s` is the median over the epochs after the second; null when the timed seconds hold
fewer than three epochs.)

Needs torch and timm (the fetched source on PYTHONPATH); uses CUDA for the prefetcher when present.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from trainprobe.probes.parsers import procfs  # noqa: E402

WARMUP = 20          # batches before timing


def topology() -> dict:
    cpus = sorted(int(p.name[3:]) for p in Path("/sys/devices/system/cpu").glob("cpu[0-9]*"))
    cores, siblings = set(), set()
    for c in cpus:
        t = Path(f"/sys/devices/system/cpu/cpu{c}/topology")
        try:
            cores.add((t.joinpath("physical_package_id").read_text().strip(), t.joinpath("core_id").read_text().strip()))
            siblings.add(t.joinpath("thread_siblings_list").read_text().strip())
        except OSError:
            pass
    model = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                  if ln.startswith("model name")), None)
    return {"logical": len(cpus), "affinity": len(os.sched_getaffinity(0)), "cores": len(cores),
            "siblings_example": sorted(siblings)[:4], "model": model}


def cpu_s(pids: list[int]) -> float:
    return sum(procfs.cpu_seconds("/", p) for p in pids)


def children() -> list[int]:
    return procfs.children_of(os.getpid())


def run(data: Path, workers: int, seconds: float, repeat: int) -> dict:
    import torch
    from timm.data import create_dataset, create_loader
    ds = create_dataset("", root=str(data), split="train", is_training=True, batch_size=128)
    if repeat > 1:
        # a longer epoch over the same files: the folder reader's sample list repeated (a
        # ConcatDataset would hand timm's fast_collate a type it does not take)
        ds.reader.samples = list(ds.reader.samples) * repeat
    cuda = torch.cuda.is_available()
    loader = create_loader(ds, input_size=(3, 224, 224), batch_size=128, is_training=True, no_aug=True,
                           use_prefetcher=cuda, num_workers=workers, persistent_workers=True,
                           device=torch.device("cuda" if cuda else "cpu"))
    per_epoch = len(loader)
    n, firsts, t_end = 0, [], None
    t0 = time.monotonic()
    c_main0 = c_work0 = None
    while True:
        e0 = time.monotonic()
        for k, (x, _) in enumerate(loader):
            if k == 0:
                firsts.append(time.monotonic() - e0)
            if cuda:
                x.sum().item()
            n += 1
            if c_main0 is None and n == WARMUP:
                # warm-up (workers started, files cached, one epoch boundary crossed at the short
                # epoch), then time the rest, epoch boundaries included
                c_main0, c_work0, t_start, n0 = cpu_s([os.getpid()]), cpu_s(children()), time.monotonic(), n
            if c_main0 is not None and time.monotonic() - t_start >= seconds:
                t_end = time.monotonic()
                break
        if t_end is not None:
            break
    b = n - n0
    wall = t_end - t_start
    return {"workers": workers, "batches_per_epoch": per_epoch, "batches": b, "seconds": round(wall, 3),
            "batches_per_s": round(b / wall, 3),
            "first_batch_wait_s": round(sorted(firsts[2:])[len(firsts[2:]) // 2], 3) if len(firsts) > 2 else None,
            "worker_cpu_s_per_batch": round((cpu_s(children()) - c_work0) / b, 4),
            "main_cpu_s_per_batch": round((cpu_s([os.getpid()]) - c_main0) / b, 4),
            "wall_s": round(time.monotonic() - t0, 2)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True)
    ap.add_argument("--workers", default="2,6,12")
    ap.add_argument("--repeat", default="1,10", help="epoch lengths: the folder's file list repeated this many times")
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    out = {"topology": topology(), "runs": []}
    print(json.dumps(out["topology"]), flush=True)
    for rep in (int(x) for x in a.repeat.split(",")):
        base = None
        for w in (int(x) for x in a.workers.split(",")):
            r = run(Path(a.data), w, a.seconds, rep)
            r["repeat"] = rep
            base = base or r["batches_per_s"] / w
            r["per_worker_vs_first"] = round(r["batches_per_s"] / w / base, 3)
            out["runs"].append(r)
            print(json.dumps(r), flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
