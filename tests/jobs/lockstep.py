"""What the gloo test jobs (ddp_gloo.py, straggler_ddp.py) share: rank 0's PROGRESS line once a
second, and a stop every rank takes at the same step (a rank that leaves while another still
all-reduces breaks the job), and `say`. Imported by name: the jobs run as scripts, from this
directory."""
import os
import time

import torch
import torch.distributed as dist


def say(line: str) -> None:
    """One line to stdout in one write(2): the ranks share the launcher's pipe, and with
    PYTHONUNBUFFERED print() writes the text and its newline apart, so two ranks' lines could
    interleave ("RANK rank=0 ... cpu=0RANK rank=1 ...") and a reader lose one rank."""
    os.write(1, (line + "\n").encode())


class Pace:
    def __init__(self, rank: int, seconds: float, every: int, suffix: str = ""):
        self.rank, self.seconds, self.every, self.suffix = rank, seconds, every, suffix
        self.t0 = self.t_last = time.time()
        self.n_last = 0

    def done(self, n: int) -> bool:
        """After step n: print rank 0's progress when a second has passed; every `every` steps, whether
        all ranks stop (once `seconds` have passed on any of them; 0: never)."""
        now = time.time()
        if self.rank == 0 and now - self.t_last >= 1.0:
            say(f"PROGRESS t={now:.3f} steps={n} steps_per_s={(n - self.n_last) / (now - self.t_last):.2f}"
                + self.suffix)
            self.t_last, self.n_last = now, n
        if not self.seconds or n % self.every:
            return False
        stop = torch.tensor([1.0 if now - self.t0 >= self.seconds else 0.0])
        dist.all_reduce(stop, op=dist.ReduceOp.MAX)
        return stop.item() > 0
