"""A two-rank (or N-rank) DistributedDataParallel job on CPU with gloo, for torchrun.

    python -m torch.distributed.run --standalone --nproc-per-node=2 tests/jobs/ddp_gloo.py --seconds 60

Each rank trains a small MLP and loads batches through one DataLoader worker; rank 0 prints
PROGRESS lines like the bundled train_cpu workload. With --report-policy each rank first prints
the memory policy its heap runs under (what `numactl --membind` changes).
"""
import argparse
import os

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

from lockstep import Pace, say


class Noise(Dataset):
    def __len__(self):
        return 10 ** 7

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return torch.randn(64, generator=g), i % 10


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--num-workers", type=int, default=1)
    ap.add_argument("--report-policy", action="store_true",
                    help="print the memory policy of this rank's heap (numa_maps: default, bind:N, ...)")
    args = ap.parse_args()
    if args.report_policy:
        heap = next((ln for ln in open("/proc/self/numa_maps") if " heap" in ln), "? ?")
        say(f"POLICY local_rank={os.environ.get('LOCAL_RANK')} policy={heap.split()[1]}")
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    loader = DataLoader(Noise(), batch_size=16, num_workers=args.num_workers,
                        persistent_workers=args.num_workers > 0)
    pace = Pace(rank, args.seconds, every=20, suffix=f" local_rank={os.environ.get('LOCAL_RANK')}")
    n = 0
    for x, y in loader:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        n += 1
        if pace.done(n):
            break
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
