"""A 2-rank (or N-rank) DDP training job on GPUs over NCCL, for benchmarks/gpu_multirank.sh.

    torchrun --nproc_per_node=2 benchmarks/gpu_ddp.py MODE SECONDS

MODE `starved-rank1`: rank 1 loads its batches in the loop (num_workers=0, a costly per-sample
Python transform, as the `starved` mode of gpu_workloads.py); the other ranks have their batches on
the GPU already. MODE `fixed-rank1`: the same, with the DataLoader settings trainprobe proposed for
rank 1 (num_workers=3, pin_memory, persistent_workers). MODE `healthy`: every rank has its batch on
the GPU (compute-bound). Every 50 steps
each rank synchronises and prints
    PROGRESS mode=M rank=R steps=N elapsed=E steps_per_s=S t=UNIX
Ranks agree to stop together (an all-reduce of a stop flag every 50 steps). NVLink multicast stays
off (NCCL_NVLS_ENABLE=0), as the node's operators require.
"""
import os
import sys
import time

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_workloads import Heavy, mlp  # noqa: E402

REPORT_STEPS = 50


def main():
    mode, seconds = sys.argv[1], float(sys.argv[2])
    rank, local = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dist.init_process_group("nccl")
    torch.backends.cuda.matmul.allow_tf32 = True
    model = torch.nn.parallel.DistributedDataParallel(mlp(3 * 64 * 64, 4096, 8), device_ids=[local])
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    if mode == "starved-rank1" and rank == 1:
        batches = iter(DataLoader(Heavy(2000, (3, 64, 64)), batch_size=64))
    elif mode == "fixed-rank1" and rank == 1:
        batches = iter(DataLoader(Heavy(2000, (3, 64, 64)), batch_size=64, num_workers=3, pin_memory=True,
                                  persistent_workers=True))
    else:
        x = torch.randn(64, 3, 64, 64, device="cuda")
        y = torch.randint(0, 10, (64,), device="cuda")
        batches = iter(lambda: (x, y), None)
    n, t0 = 0, time.perf_counter()
    t_end = t0 + seconds
    for x, y in batches:
        x = x.cuda(non_blocking=True)
        y = y.cuda(non_blocking=True)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        n += 1
        if n % REPORT_STEPS == 0:
            torch.cuda.synchronize()
            el = time.perf_counter() - t0
            print(f"PROGRESS mode={mode} rank={rank} steps={n} elapsed={el:.4f} steps_per_s={n / el:.2f} "
                  f"t={time.time():.3f}", flush=True)
            flag = torch.tensor([1.0 if time.perf_counter() > t_end else 0.0], device="cuda")
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            if flag.item() > 0:
                break
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
