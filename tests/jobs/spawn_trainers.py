"""Two training processes started through multiprocessing's spawn, as pytorch/examples' mnist_hogwild
starts them: no launcher, no LOCAL_RANK, no torch.distributed; each trains its own MLP with as many
intra-op threads as the machine has CPUs (together twice the CPUs: oversubscribed) and loads its
batches in one DataLoader worker of its own. The parent only waits. Each process prints
`TRAINER pid=P steps=N` once a second.

    python tests/jobs/spawn_trainers.py --seconds 60
"""
import argparse
import os
import time

import torch
import torch.multiprocessing as mp


class Items(torch.utils.data.Dataset):
    def __len__(self):
        return 1 << 20

    def __getitem__(self, i):
        return torch.randn(64), i % 10


def train(rank: int, seconds: float) -> None:
    torch.set_num_threads(os.cpu_count() or 1)
    torch.manual_seed(rank)
    model = torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = torch.utils.data.DataLoader(Items(), batch_size=64, num_workers=1, persistent_workers=True)
    t0 = last = time.time()
    n = 0
    for x, y in loader:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        n += 1
        now = time.time()
        if now - last >= 1.0:
            os.write(1, f"TRAINER pid={os.getpid()} steps={n}\n".encode())
            last = now
        if seconds and now - t0 >= seconds:
            break


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--processes", type=int, default=2)
    a = ap.parse_args()
    mp.set_start_method("spawn", force=True)
    procs = [mp.Process(target=train, args=(r, a.seconds)) for r in range(a.processes)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
