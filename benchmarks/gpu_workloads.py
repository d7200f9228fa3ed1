"""GPU training workloads with one known bottleneck each, for benchmarks/gpu_validate.py.

The first six modes are those of tests/data/h200/src/workloads.py (the captures the tests replay),
with the same shapes and settings; `graphed` is the `sync` job with its whole step captured in one
CUDA graph and no per-step .item(): the fix trainprobe proposes for a launch-bound loop.

    python benchmarks/gpu_workloads.py MODE SECONDS

Every 50 steps it synchronises and prints
    PROGRESS mode=M steps=N elapsed=E steps_per_s=R t=UNIX
(E: seconds since the training loop started; R = N / E), and at the end RESULT with the same fields.
"""
import math
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset

MODES = ("starved", "fixed", "healthy", "sync", "pageable", "pinned", "graphed")
REPORT_STEPS = 50


class Heavy(Dataset):
    """Each sample costs `work` iterations of pure-Python arithmetic (a decode stand-in)."""

    def __init__(self, work, shape):
        self.work, self.shape = work, shape

    def __len__(self):
        return 10 ** 7

    def __getitem__(self, i):
        s = 0.0
        for k in range(self.work):
            s += math.sin(k * i)
        return torch.randn(*self.shape), i % 10


def mlp(inp, width, depth):
    layers = [torch.nn.Flatten(), torch.nn.Linear(inp, width), torch.nn.ReLU()]
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(width, 10)).cuda()


def report(tag, mode, n, t0):
    el = time.perf_counter() - t0
    print(f"{tag} mode={mode} steps={n} elapsed={el:.4f} steps_per_s={n / el:.2f} t={time.time():.3f}", flush=True)


def graphed(seconds):
    """The sync job's model and batch, the whole step (forward, backward, SGD) in one CUDA graph."""
    x = torch.randn(32, 256, device="cuda")
    y = torch.randint(0, 10, (32,), device="cuda")
    model = mlp(256, 256, 16)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):                 # warm up outside the graph (allocator, autograd)
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
    n, t0, t_end = 0, time.perf_counter(), time.perf_counter() + seconds
    while True:
        graph.replay()
        n += 1
        if n % REPORT_STEPS == 0:
            loss.item()                           # one sync per 50 steps, as the other modes
            report("PROGRESS", "graphed", n, t0)
            if time.perf_counter() > t_end:
                break
    torch.cuda.synchronize()
    report("RESULT", "graphed", n, t0)


def main():
    mode, seconds = sys.argv[1], float(sys.argv[2])
    if mode not in MODES:
        sys.exit(f"unknown mode {mode!r}; one of {', '.join(MODES)}")
    torch.backends.cuda.matmul.allow_tf32 = True
    if mode == "graphed":
        return graphed(seconds)
    sync = False
    if mode == "starved":      # num_workers=0, heavy per-sample Python transform
        dl, model = DataLoader(Heavy(2000, (3, 64, 64)), batch_size=64), mlp(3 * 64 * 64, 4096, 8)
    elif mode == "fixed":      # the same job, DataLoader fixed
        dl = DataLoader(Heavy(2000, (3, 64, 64)), batch_size=64, num_workers=12, pin_memory=True,
                        persistent_workers=True, prefetch_factor=4)
        model = mlp(3 * 64 * 64, 4096, 8)
    elif mode == "healthy":    # compute-bound: data already on the GPU
        x = torch.randn(256, 3, 64, 64, device="cuda")
        y = torch.randint(0, 10, (256,), device="cuda")
        dl, model = iter(lambda: (x, y), None), mlp(3 * 64 * 64, 8192, 12)
    elif mode == "sync":       # tiny kernels and a host sync (.item()) every step
        x = torch.randn(32, 256, device="cuda")
        y = torch.randint(0, 10, (32,), device="cuda")
        dl, model, sync = iter(lambda: (x, y), None), mlp(256, 256, 16), True
    elif mode == "pageable":   # big batches copied from pageable host memory
        xs, ys = torch.randn(512, 3, 224, 224), torch.randint(0, 10, (512,))
        dl, model = iter(lambda: (xs, ys), None), mlp(3 * 224 * 224, 1024, 2)
    else:                      # pinned: the same copies from pinned memory
        xs, ys = torch.randn(512, 3, 224, 224).pin_memory(), torch.randint(0, 10, (512,)).pin_memory()
        dl, model = iter(lambda: (xs, ys), None), mlp(3 * 224 * 224, 1024, 2)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    n, t0, t_end = 0, time.perf_counter(), time.perf_counter() + seconds
    for x, y in dl:
        x = x.cuda(non_blocking=True)
        y = y.cuda(non_blocking=True)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        n += 1
        if sync:
            loss.item()
        if n % REPORT_STEPS == 0:
            torch.cuda.synchronize()
            report("PROGRESS", mode, n, t0)
            if time.perf_counter() > t_end:
                break
    torch.cuda.synchronize()
    report("RESULT", mode, n, t0)


if __name__ == "__main__":
    main()
