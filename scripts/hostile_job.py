"""A training process with a hostile shape, for the hostile-shape tests and benchmark.

    python scripts/hostile_job.py --threads 10000      # 10,000 idle threads beside the loop
    python scripts/hostile_job.py --recurse 5000       # the loop runs 5,000 frames deep
    python scripts/hostile_job.py --forks-per-s 100    # 100 short-lived children a second
    python scripts/hostile_job.py --pad-argv X...      # any extra argument is ignored (a long argv)

The loop is a small pure-Python training step (a dot product and an update over a weight list). It
prints `PROGRESS ready threads=N` once the shape is built and the loop runs, then
`PROGRESS steps=N` every second.
"""
from __future__ import annotations

import _thread
import argparse
import os
import sys
import threading
import time


def _parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--threads", type=int, default=0, help="idle threads started beside the loop")
    ap.add_argument("--recurse", type=int, default=0, help="frames of recursion the loop runs under")
    ap.add_argument("--forks-per-s", type=float, default=0.0, help="children forked per second")
    ap.add_argument("--child-life-s", type=float, default=0.05, help="how long each forked child lives")
    ap.add_argument("--seconds", type=float, default=120.0, help="stop after this long")
    ap.add_argument("--torch", action="store_true",
                    help="train a small torch model (one intra-op thread) instead of the pure-Python step")
    args, _rest = ap.parse_known_args()     # the rest: padding that makes the argv long
    return args


def _idle_threads(n: int) -> None:
    """n threads blocked on one lock. `_thread` rather than `threading`: threading.Thread.start waits
    for each new thread to run once, which makes 10,000 of them take 15 s on a loaded 2-CPU machine;
    these are started without that handshake, with a small stack (reserved, hardly touched). Each new
    thread needs the GIL once to block on the lock; at the default 5 ms switch interval the creating
    thread hands it over to every one of them in turn (6 s for 10,000 beside six busy processes on 2
    CPUs). At a 100 ms interval the creating thread now and then lost the GIL among thousands of
    waiters, each waking every interval to ask for it: at 8,000 threads 80,000 wake-ups a second on
    the GIL's mutex, the machine 99% in the kernel, no new thread for minutes. With an interval longer
    than the whole creation no waiter asks before every thread exists; the creator then sleeps and
    each new thread takes the GIL once, handed from one to the next as each blocks on the lock."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(30.0)
    threading.stack_size(64 * 1024)
    gate = _thread.allocate_lock()
    gate.acquire()
    blocked: list[None] = []

    def idle() -> None:
        blocked.append(None)
        gate.acquire()

    t0 = time.monotonic()
    for i in range(n):
        _thread.start_new_thread(idle, ())
        if (i + 1) % 2000 == 0:
            # where a slow start stands, for whoever waits for "ready" (not a PROGRESS line)
            print(f"STARTING threads={i + 1} t={time.monotonic() - t0:.1f}", flush=True)
    # The new threads hand the GIL on, one to the next, as each blocks on the gate; the creator waits
    # for its turn under the same long interval, so nobody wakes to ask for it before that. Back at
    # the short interval with thousands still waiting, the creator took the GIL from the chain at
    # every turn of its loop and let one thread through each time (no "ready" for minutes under load).
    while len(blocked) < n:
        time.sleep(0.01)
    threading.stack_size(0)
    sys.setswitchinterval(interval)
    # Ready once every thread exists (the kernel lists it).
    while len(os.listdir("/proc/self/task")) < n + 1:
        time.sleep(0.01)
    if n:
        print(f"STARTING listed={n} t={time.monotonic() - t0:.1f}", flush=True)


def _forker(rate: float, life_s: float, stop: threading.Event) -> None:
    period = 1.0 / rate
    nxt = time.monotonic()
    live: list[int] = []
    while not stop.is_set():
        pid = os.fork()
        if pid == 0:
            time.sleep(life_s)
            os._exit(0)
        live.append(pid)
        # Reap whoever has exited: the job never leaves zombies of its own.
        for p in list(live):
            try:
                done, _ = os.waitpid(p, os.WNOHANG)
            except ChildProcessError:
                done = p
            if done:
                live.remove(p)
        nxt += period
        time.sleep(max(0.0, nxt - time.monotonic()))
    for p in live:
        try:
            os.waitpid(p, 0)
        except ChildProcessError:
            pass


def train_step(w: list[float], x: list[float]) -> float:
    y = sum(a * b for a, b in zip(w, x))
    g = y - 1.0
    for i in range(len(w)):
        w[i] -= 1e-4 * g * x[i]
    return g * g


def torch_step():
    import torch
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(32, 64), torch.randn(32, 1)

    def step(_w: object, _x: object) -> float:
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return float(loss)
    return step


def train(seconds: float, use_torch: bool) -> None:
    w = [0.01] * 256
    x = [((i * 7) % 13) / 13.0 for i in range(256)]
    step = torch_step() if use_torch else train_step
    print(f"PROGRESS ready threads={len(os.listdir('/proc/self/task'))}", flush=True)
    t_end = time.monotonic() + seconds
    steps, last = 0, time.monotonic()
    while time.monotonic() < t_end:
        step(w, x)
        steps += 1
        if time.monotonic() - last >= 1.0:
            last = time.monotonic()
            print(f"PROGRESS steps={steps}", flush=True)


def recurse(depth: int, seconds: float, use_torch: bool) -> None:
    if depth <= 0:
        train(seconds, use_torch)
        return
    recurse(depth - 1, seconds, use_torch)


def main() -> None:
    args = _parse()
    if args.torch:
        import torch  # noqa: F401 - loaded before the threads and forks, as a training script does
    _idle_threads(args.threads)
    stop = threading.Event()
    if args.forks_per_s > 0:
        threading.Thread(target=_forker, args=(args.forks_per_s, args.child_life_s, stop),
                         name="forker", daemon=True).start()
    if args.recurse:
        sys.setrecursionlimit(args.recurse + 1000)
        recurse(args.recurse, args.seconds, args.torch)
    else:
        train(args.seconds, args.torch)
    stop.set()


if __name__ == "__main__":
    main()
