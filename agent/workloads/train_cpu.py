"""A small CPU training job with a knob for each host-side bottleneck trainprobe diagnoses.

Used by `trainprobe demo`, by the tests (which start it and attach real probes to it) and by the
benchmarks. It prints one line per report interval:
    PROGRESS t=<unix> steps=<n> steps_per_s=<rate over the interval>
and, when it stops, RESULT steps=<n> seconds=<s> steps_per_s=<mean>.

    python -m trainprobe.agent.workloads.train_cpu --seconds 30 --num-workers 0 --sample-work 2200
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import threading
import time


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=float, default=30.0, help="stop after this long (0: run until killed)")
    ap.add_argument("--num-workers", type=int, default=0)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--sample-work", type=int, default=2200,
                    help="Python loop iterations per sample in __getitem__ (0: data already in memory)")
    ap.add_argument("--width", type=int, default=1024, help="hidden width of the MLP")
    ap.add_argument("--depth", type=int, default=2, help="hidden layers of the MLP")
    ap.add_argument("--features", type=int, default=256)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads in the training process")
    ap.add_argument("--worker-threads", type=int, default=1, help="torch threads in each DataLoader worker")
    ap.add_argument("--pin-memory", action="store_true")
    ap.add_argument("--persistent-workers", action="store_true")
    ap.add_argument("--prefetch-factor", type=int, default=None)
    ap.add_argument("--small-files", default=None,
                    help="directory of tiny files: each sample opens and reads --files-per-sample of them")
    ap.add_argument("--files-per-sample", type=int, default=16)
    ap.add_argument("--shard", default=None,
                    help="one packed file (the small files concatenated): each sample reads the same bytes as "
                         "--files-per-sample small files would, with one pread from a file opened once")
    ap.add_argument("--record-bytes", type=int, default=256, help="bytes per record in --shard")
    ap.add_argument("--gil-spinner", action="store_true",
                    help="start a thread that spins in pure Python (holds the GIL) beside the loop")
    ap.add_argument("--gil-pause-ms", type=float, default=0.0,
                    help="with --gil-spinner: sleep this long between bursts (a thread holding the GIL in bursts)")
    ap.add_argument("--epoch-samples", type=int, default=10 ** 7,
                    help="samples per epoch: the DataLoader is iterated again each epoch (without "
                         "--persistent-workers its workers are re-created every epoch)")
    ap.add_argument("--report-every", type=float, default=1.0)
    ap.add_argument("--ddp", action="store_true",
                    help="under torchrun: DistributedDataParallel over gloo (CPU) or nccl (--device cuda)")
    ap.add_argument("--starved-rank", type=int, default=None,
                    help="with --ddp: only this rank loads costly samples; the others have data in memory")
    return ap.parse_args(argv)


class SyntheticDataset:
    """Each sample costs `work` iterations of pure-Python arithmetic (a decode or augmentation
    stand-in) and, optionally, opening and reading small files."""

    def __init__(self, n: int, features: int, work: int, files: list[str] | None, files_per_sample: int,
                 shard: str | None = None, record_bytes: int = 256):
        self.n, self.features, self.work = n, features, work
        self.files, self.files_per_sample = files, files_per_sample
        self.shard, self.record_bytes = shard, record_bytes
        self._shard_fd: int | None = None
        self._shard_records = 0

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        import torch
        acc = 0.0
        for k in range(self.work):
            acc += math.sin(k * 0.001 + i)
        if self.shard:
            if self._shard_fd is None:        # opened once per process (each worker has its own)
                self._shard_fd = os.open(self.shard, os.O_RDONLY)
                self._shard_records = max(1, os.fstat(self._shard_fd).st_size // self.record_bytes)
            span = self.files_per_sample * self.record_bytes
            first = (i * self.files_per_sample) % max(1, self._shard_records - self.files_per_sample)
            acc += len(os.pread(self._shard_fd, span, first * self.record_bytes))
        if self.files:
            nf = len(self.files)
            for j in range(self.files_per_sample):
                with open(self.files[(i * self.files_per_sample + j) % nf], "rb") as fh:
                    acc += len(fh.read(4096))
        g = torch.Generator().manual_seed(i)
        x = torch.randn(self.features, generator=g) + acc * 1e-9
        return x, i % 10


class InMemory:
    """Batches already in memory: the loop never waits for data."""

    def __init__(self, batch_size: int, features: int):
        import torch
        self.x = torch.randn(batch_size, features)
        self.y = torch.randint(0, 10, (batch_size,))

    def __iter__(self):
        while True:
            yield self.x, self.y


def _spin(stop: threading.Event, pause_s: float = 0.0) -> None:
    # A metrics thread gone wrong: pure Python, never (or barely) sleeps, so it holds the GIL most of the time.
    n = 0
    while not stop.is_set():
        for _ in range(20000):
            n += 1
        if pause_s:
            time.sleep(pause_s)


def _worker_init(worker_threads: int):
    def init(_wid: int) -> None:
        import torch
        torch.set_num_threads(worker_threads)
    return init


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    import torch
    from torch.utils.data import DataLoader

    torch.set_num_threads(max(1, args.threads))
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = [torch.nn.Linear(args.features, args.width), torch.nn.ReLU()]
    for _ in range(args.depth):
        layers += [torch.nn.Linear(args.width, args.width), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(args.width, 10))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)

    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    ddp = args.ddp and world > 1
    if ddp:
        import torch.distributed as dist
        dist.init_process_group("gloo")
        model = torch.nn.parallel.DistributedDataParallel(model)
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        if args.starved_rank is not None and rank != args.starved_rank:
            args.sample_work, args.small_files, args.shard = 0, None, None
    if args.sample_work <= 0 and not args.small_files and not args.shard:
        batches = iter(InMemory(args.batch_size, args.features))
        loader = None
    else:
        files = None
        if args.small_files:
            files = sorted(os.path.join(args.small_files, f) for f in os.listdir(args.small_files))
        ds = SyntheticDataset(args.epoch_samples, args.features, args.sample_work, files, args.files_per_sample,
                              args.shard, args.record_bytes)
        kw = dict(batch_size=args.batch_size, shuffle=False, num_workers=args.num_workers,
                  pin_memory=args.pin_memory)
        if args.num_workers > 0:
            kw["persistent_workers"] = args.persistent_workers
            kw["worker_init_fn"] = _worker_init(args.worker_threads)
            if args.prefetch_factor:
                kw["prefetch_factor"] = args.prefetch_factor
        loader = DataLoader(ds, **kw)

        def epochs():
            while True:
                yield from loader
        batches = epochs()

    stop = threading.Event()
    if args.gil_spinner:
        threading.Thread(target=_spin, args=(stop, args.gil_pause_ms / 1000.0), name="metrics-spinner", daemon=True).start()

    t_start = time.time()
    t_last, n_last, n = t_start, 0, 0
    deadline = t_start + args.seconds if args.seconds > 0 else float("inf")
    try:
        for x, y in batches:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            n += 1
            now = time.time()
            if now - t_last >= args.report_every:
                print(f"PROGRESS t={now:.3f} steps={n} steps_per_s={(n - n_last) / (now - t_last):.2f}"
                      + (f" rank={rank}" if world > 1 else ""), flush=True)
                t_last, n_last = now, n
            if ddp:
                if n % 20 == 0:
                    # Ranks stop together, or one would wait forever in the next all-reduce.
                    import torch.distributed as dist
                    flag = torch.tensor([1.0 if now >= deadline else 0.0])
                    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
                    if flag.item() > 0:
                        break
            elif now >= deadline:
                break
    except KeyboardInterrupt:
        pass
    finally:
        stop.set()
    el = time.time() - t_start
    print(f"RESULT steps={n} seconds={el:.2f} steps_per_s={n / el:.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
