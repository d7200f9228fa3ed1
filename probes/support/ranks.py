"""Which children of a training process train themselves (ranks), and which are its DataLoader workers.

Three kinds of Python child look alike in /proc (a Python interpreter, torch mapped):

- torch's DataLoader workers. From torch 2.4 on each names itself `pt_data_worker` (the main
  thread's comm, set as the worker loop starts; pytorch/pytorch#128448), forked or spawned.
- training processes started by the job itself through multiprocessing's "spawn" start method:
  `torch.multiprocessing.spawn` (DDP without a launcher: pytorch/examples' ImageNet script with
  `--multiprocessing-distributed`), `mp.Process` under spawn (pytorch/examples' mnist_hogwild). Their
  command line is `python -c "from multiprocessing.spawn import spawn_main; spawn_main(...)"` and,
  unlike torchrun's ranks, they carry no LOCAL_RANK.
- multiprocessing's own helpers: the resource tracker, the semaphore tracker, the forkserver.

A spawned child that is not named `pt_data_worker` is a training process only where the torch it
runs names its workers (2.4 or later): an older torch's spawned DataLoader workers
(`multiprocessing_context="spawn"`) carry the same command line and no name. py-spy's evidence still
decides whether such a child trains (a rank's view needs training frames); these labels choose what
is sampled and how /proc's figures are read.
"""
from __future__ import annotations

import re

from trainprobe.probes.parsers import procfs

WORKER_COMM = "pt_data_worker"
SPAWN_MARK = "multiprocessing.spawn import spawn_main"
HELPER_MARKS = ("multiprocessing.resource_tracker", "multiprocessing.semaphore_tracker",
                "multiprocessing.forkserver")
WORKERS_NAMED_FROM = (2, 4)


def torch_dir(libs: list[str]) -> str | None:
    """The torch package directory of a process's mapped libtorch (.../site-packages/torch)."""
    for lib in libs:
        i = lib.find("/torch/lib/libtorch")
        if i >= 0:
            return lib[:i + len("/torch")]
    return None


def torch_version(libs: list[str], root: str = "/") -> str | None:
    """The version of the torch a process maps (its package's version.py), e.g. "2.13.0+cpu"; None where
    it maps none or the file cannot be read."""
    d = torch_dir(libs)
    if d is None:
        return None
    text = procfs.try_read_text(root, f"{d.lstrip('/')}/version.py") or ""
    m = re.search(r"""__version__\s*=\s*['"]([^'"]+)['"]""", text)
    return m.group(1) if m else None


def names_workers(version: str | None) -> bool:
    """Whether a torch of this version names its DataLoader worker processes pt_data_worker."""
    m = re.match(r"(\d+)\.(\d+)", version or "")
    return bool(m) and (int(m.group(1)), int(m.group(2))) >= WORKERS_NAMED_FROM


def is_helper(cmdline: str) -> bool:
    """multiprocessing's resource tracker, semaphore tracker or forkserver."""
    return any(m in cmdline for m in HELPER_MARKS)


def is_worker_comm(comm: str | None) -> bool:
    return (comm or "").startswith(WORKER_COMM)


def spawned_trainer(cmdline: str, comm: str | None, version: str | None) -> bool:
    """A child started by multiprocessing's spawn that is not one of torch's DataLoader workers: a
    training process of the job (see the module's docstring)."""
    return (SPAWN_MARK in cmdline and not is_worker_comm(comm) and not is_helper(cmdline)
            and names_workers(version))


def child_is_spawned_trainer(pid: int, root: str = "/", version: str | None = None) -> bool:
    """`spawned_trainer` read from /proc for one process (its own mapped torch where `version` is None)."""
    try:
        cmdline = " ".join(a for a in (procfs.process_fact(pid, "cmdline", root) or []) if a)
    except Exception:  # noqa: BLE001 - gone or unreadable: not known to be a trainer
        return False
    if SPAWN_MARK not in cmdline:
        return False
    comm = procfs.process_fact(pid, "name", root)
    if version is None:
        maps = procfs.try_read_text(root, f"proc/{pid}/maps") or ""
        version = torch_version(procfs.parse_maps_libraries(maps), root)
    return spawned_trainer(cmdline, comm, version)
