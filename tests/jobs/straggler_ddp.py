"""A DistributedDataParallel job on CPU (gloo) whose one rank can be made slow, for torchrun.

    python -m torch.distributed.run --nproc-per-node=2 tests/jobs/straggler_ddp.py --slow-rank 1 --extra-work 20000

Every rank trains the same small MLP on batches in memory. The slow rank can carry:
  --extra-work N   N iterations of pure-Python arithmetic in its own loop each step (extra host work
                   the other ranks do not do: a metric, a logging hook gone wrong);
  --data-work N    its batches loaded in the loop (no DataLoader worker), N Python iterations a sample.
Causes from outside the job (another process on the rank's CPU, a cgroup CPU quota) are applied by the
caller to the PID each rank prints. With --pin, rank r runs on CPU r mod the CPUs it was given.
With --control FILE (read every 10 steps), the slow rank carries only the cause FILE names: "compute"
(its --extra-work), "data" (its --data-work), anything else neither; so one job measures its step
with and without each cause. Each rank prints
    RANK rank=<r> pid=<pid> cpu=<cpu or ->
and rank 0 prints PROGRESS lines (t, steps, steps_per_s over the last second).
"""
import argparse
import math
import os

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

from lockstep import Pace, say


def extra_host_work(n: int) -> float:
    acc = 0.0
    for k in range(n):
        acc += math.sqrt(k + 1.0)
    return acc


class SlowSamples(Dataset):
    """Samples made in Python, read through a DataLoader without workers: the rank's loop waits on its
    own input pipeline."""

    def __init__(self, work: int, features: int):
        self.work, self.features = work, features

    def __len__(self) -> int:
        return 10 ** 8

    def __getitem__(self, i: int) -> torch.Tensor:
        acc = 0.0
        for k in range(self.work):
            acc += math.sin(k * 0.001 + i)
        return torch.full((self.features,), acc * 1e-6)


def _cause(path: str | None) -> str:
    if not path:
        return "all"
    try:
        with open(path) as fh:
            return fh.read().strip()
    except OSError:
        return "all"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=0.0, help="stop after this long (0: until killed)")
    ap.add_argument("--slow-rank", type=int, default=None)
    ap.add_argument("--extra-work", type=int, default=0)
    ap.add_argument("--data-work", type=int, default=0)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--features", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--pin", action="store_true")
    ap.add_argument("--control", default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    rank = int(os.environ.get("RANK", "0"))
    cpu = "-"
    if args.pin:
        # Before the process group starts its threads, so they inherit the rank's CPU.
        allowed = sorted(os.sched_getaffinity(0))
        mine = allowed[rank % len(allowed)]
        os.sched_setaffinity(0, {mine})
        cpu = str(mine)
    dist.init_process_group("gloo")
    say(f"RANK rank={rank} pid={os.getpid()} cpu={cpu}")
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(
        torch.nn.Linear(args.features, args.width), torch.nn.ReLU(), torch.nn.Linear(args.width, args.width),
        torch.nn.ReLU(), torch.nn.Linear(args.width, 10)))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    slow = rank == args.slow_rank
    data = (iter(DataLoader(SlowSamples(args.data_work, args.features), batch_size=args.batch_size, num_workers=0))
            if slow and args.data_work else None)
    x_mem = torch.randn(args.batch_size, args.features)
    y = torch.randint(0, 10, (args.batch_size,))
    cause = _cause(args.control)
    pace = Pace(rank, args.seconds, every=50)
    n = 0
    while True:
        x = next(data) if (data is not None and cause in ("data", "all")) else x_mem
        if slow and args.extra_work and cause in ("compute", "all"):
            extra_host_work(args.extra_work)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        n += 1
        if n % 10 == 0:
            cause = _cause(args.control)
        if pace.done(n):
            break
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
