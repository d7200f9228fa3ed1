"""Helpers for the eBPF tests: can this host attach, which of our BPF programs are loaded, and
the small real workloads the tests start."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from trainprobe.probes.support import bcc_support as bs
from trainprobe.probes.sched import TRACEPOINTS as SCHED_TPS
from trainprobe.probes.syscalls import TRACEPOINTS as SYSCALL_TPS

READY = bs.readiness(SCHED_TPS + SYSCALL_TPS)
# CI runs as root on a machine prepared by scripts/prepare-host.sh: there these tests attach for
# real. Elsewhere they skip and say which piece is missing.
needs_ebpf = pytest.mark.skipif(not READY.ok and not READY.will_mount_tracefs,
                                reason=f"eBPF unavailable here: {READY.reason}")
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root")


def bpftool() -> str | None:
    return shutil.which("bpftool") or next((p for p in ("/usr/sbin/bpftool", "/sbin/bpftool") if os.path.exists(p)),
                                           None)


def our_programs() -> list[dict]:
    """BPF programs loaded on the host whose name carries trainprobe's prefix."""
    tool = bpftool()
    if tool is None:
        pytest.skip("bpftool is not installed (apt-get install bpftool): cannot list loaded BPF programs")
    out = subprocess.run([tool, "prog", "show", "--json"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    progs = json.loads(out.stdout or "[]")
    return [p for p in progs if str(p.get("name", "")).startswith(bs.PROG_PREFIX)]


def wait_no_programs(timeout: float = 10.0) -> list[dict]:
    """Our programs still loaded after `timeout` (the kernel frees them once the last fd closes)."""
    deadline = time.monotonic() + timeout
    progs = our_programs()
    while progs and time.monotonic() < deadline:
        time.sleep(0.2)
        progs = our_programs()
    return progs


def make_tiny_files(d: Path, n: int = 3000, size: int = 200) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    blob = os.urandom(size)
    for i in range(n):
        (d / f"s{i:06d}.bin").write_bytes(blob)
    return d


@contextmanager
def busy_process():
    """A competing CPU-bound process (not part of the job)."""
    p = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield p
    finally:
        p.kill()
        p.wait()


def spawn_script(code: str) -> subprocess.Popen:
    """A small Python target that prints READY once it runs."""
    p = subprocess.Popen([sys.executable, "-u", "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True)
    assert p.stdout is not None
    line = p.stdout.readline()
    assert "READY" in line, line
    return p
