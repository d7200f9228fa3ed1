"""A real image-classification training job for the cost benchmark on a GPU node.

    python benchmarks/gpu_cost_job.py --variant data --workers 14

`data`: torchvision resnet18, torchvision's FakeData (a random image per index, made into a PIL
image) through RandomResizedCrop, flip, ToTensor and Normalize in the DataLoader workers: the input
pipeline keeps every CPU busy. `compute`: resnet50 at batch 256 on cheap in-memory uint8 images,
normalised on the GPU: the GPU is the bottleneck. Both train with SGD under bf16 autocast, channels_last, pinned memory and
persistent workers. Every 0.5 s it prints `PROGRESS t=<unix> steps=<n>` (after a device sync).
"""
from __future__ import annotations

import argparse
import time

import torch
import torchvision
from torch.utils.data import DataLoader, Dataset
from torchvision import transforms


class InMemory(Dataset):
    """Cheap samples (one stored uint8 image, a label): the compute-bound job's input costs nothing.
    Images travel as uint8, as decoded images do, and are normalised on the GPU: a float32 batch of
    256 would be 154 MB through shared memory and pinning per step, enough to starve the GPU at
    times on its own."""

    def __init__(self, n: int, size: int):
        self.n = n
        self.x = torch.randint(0, 256, (3, size, size), dtype=torch.uint8)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return self.x, i % 1000


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--variant", choices=("data", "compute"), default="data")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--batch-size", type=int, default=None)
    ap.add_argument("--seconds", type=float, default=0.0, help="0: until killed")
    a = ap.parse_args()
    torch.backends.cudnn.benchmark = True
    if a.variant == "data":
        bs = a.batch_size or 128
        tf = transforms.Compose([transforms.RandomResizedCrop(224), transforms.RandomHorizontalFlip(),
                                 transforms.ToTensor(),
                                 transforms.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))])
        ds = torchvision.datasets.FakeData(size=10 ** 7, image_size=(3, 256, 256), num_classes=1000, transform=tf)
        model = torchvision.models.resnet18(num_classes=1000)
    else:
        bs = a.batch_size or 256
        ds = InMemory(10 ** 7, 224)
        model = torchvision.models.resnet50(num_classes=1000)
    kw = dict(num_workers=a.workers, pin_memory=True, shuffle=True, drop_last=True)
    if a.workers:
        kw.update(persistent_workers=True, prefetch_factor=4)
    loader = DataLoader(ds, batch_size=bs, **kw)
    model = model.cuda().to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    steps = 0
    t_end = time.time() + a.seconds if a.seconds else float("inf")
    next_report = time.time() + 0.5
    mean = torch.tensor([0.485, 0.456, 0.406], device="cuda").view(1, 3, 1, 1) * 255
    std = torch.tensor([0.229, 0.224, 0.225], device="cuda").view(1, 3, 1, 1) * 255
    while time.time() < t_end:
        for x, y in loader:
            x = x.cuda(non_blocking=True)
            if x.dtype == torch.uint8:
                x = (x.float() - mean) / std
            x = x.to(memory_format=torch.channels_last)
            y = y.cuda(non_blocking=True)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = loss_fn(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            steps += 1
            if time.time() >= next_report:
                torch.cuda.synchronize()
                print(f"PROGRESS t={time.time():.3f} steps={steps}", flush=True)
                next_report = time.time() + 0.5
            if time.time() >= t_end:
                break


if __name__ == "__main__":
    main()
