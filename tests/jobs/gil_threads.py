"""A training process whose other threads do what real jobs' threads do, for the GIL tests.

    python tests/jobs/gil_threads.py --neighbours pipe,queue,event,sleep,hash,zlib,matmul
    python tests/jobs/gil_threads.py --neighbours spinner
    python tests/jobs/gil_threads.py --loop native      # the loop itself blocks in native code

Neighbours (one thread each, named `bg-KIND`):
  pipe     blocks in os.read on a pipe nobody writes (a compile worker, an uploader waiting)
  queue    blocks in queue.Queue.get (a prefetcher with nothing to do)
  event    blocks in threading.Event.wait (a monitor)
  sleep    time.sleep loops (tqdm's monitor, a heartbeat)
  hash     hashlib.sha256 over 4 MB buffers (releases the GIL inside)
  zlib     zlib.compress over 4 MB buffers (releases the GIL inside)
  matmul   torch matmul of 256x256 matrices (releases the GIL inside)
  spinner  pure-Python loop that never waits (holds the GIL)

The loop: `compute` trains a small torch MLP on CPU (one intra-op thread); `native` makes the
training thread block in native code each step: a forward/backward with two intra-op threads,
`torch.autograd.backward`, a threading.Event wait with a timer setting it, and a read of a
subprocess's pipe. It prints `PROGRESS ready` once the loop runs.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import queue
import subprocess
import sys
import threading
import time
import zlib


def _pipe() -> None:
    r, _w = os.pipe()
    os.read(r, 1)


def _queue() -> None:
    queue.Queue().get()


def _event() -> None:
    threading.Event().wait()


def _sleep() -> None:
    while True:
        time.sleep(0.05)


def _hash() -> None:
    buf = os.urandom(1 << 22)
    while True:
        hashlib.sha256(buf).digest()


def _zlib() -> None:
    buf = os.urandom(1 << 22)
    while True:
        zlib.compress(buf, 1)


def _matmul() -> None:
    import torch
    a = torch.randn(256, 256)
    while True:
        a @ a


def _spinner() -> None:
    n = 0
    while True:
        for _ in range(20000):
            n += 1


NEIGHBOURS = {"pipe": _pipe, "queue": _queue, "event": _event, "sleep": _sleep, "hash": _hash, "zlib": _zlib,
              "matmul": _matmul, "spinner": _spinner}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--neighbours", default="")
    ap.add_argument("--loop", choices=("compute", "native"), default="compute")
    ap.add_argument("--seconds", type=float, default=120.0)
    a = ap.parse_args()
    import torch
    torch.set_num_threads(2 if a.loop == "native" else 1)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
    child = None
    if a.loop == "native":
        # A child that answers each request after 20 ms: the loop blocks reading its pipe.
        child = subprocess.Popen([sys.executable, "-c", "import sys, time\n"
                                  "for line in sys.stdin:\n    time.sleep(0.02)\n    print(line.strip(), flush=True)"],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    deadline = time.time() + a.seconds
    ready = False
    while time.time() < deadline:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        if a.loop == "native":
            torch.autograd.backward(loss)
            done = threading.Event()
            threading.Timer(0.02, done.set).start()
            done.wait()
            assert child is not None and child.stdin is not None and child.stdout is not None
            child.stdin.write("x\n")
            child.stdin.flush()
            child.stdout.readline()
        else:
            loss.backward()
        opt.step()
        if not ready:
            # The neighbours start after the first step: a spinner holding the GIL from the first
            # line made the first step's thousands of GIL hand-overs (5 ms each) take most of a minute.
            for kind in filter(None, a.neighbours.split(",")):
                threading.Thread(target=NEIGHBOURS[kind], name=f"bg-{kind}", daemon=True).start()
            print("PROGRESS ready", flush=True)
            ready = True
    if child is not None:
        child.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
