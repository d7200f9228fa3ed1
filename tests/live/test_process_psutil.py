"""Process facts come from psutil, with its exceptions mapped onto the taxonomy; what psutil
lacks comes from /proc. Checked against real processes started here."""
import os
import subprocess
import sys
import time

import psutil
import pytest

from trainprobe.agent.target import EXIT_BAD_INPUT, UserError, validate
from trainprobe.probes.parsers import procfs
from trainprobe.probes.errors import PermissionDenied, TargetGone, TimedOut, translate_psutil_error
from trainprobe.probes.process import _proc_facts, _snapshot_process
from trainprobe.probes.support.target import inspect, is_alive


def test_psutil_exceptions_map_onto_the_taxonomy():
    assert isinstance(translate_psutil_error(psutil.NoSuchProcess(42), "process 42"), TargetGone)
    z = translate_psutil_error(psutil.ZombieProcess(42), "process 42")
    assert isinstance(z, TargetGone) and "zombie" in str(z)
    assert isinstance(translate_psutil_error(psutil.AccessDenied(42), "process 42"), PermissionDenied)
    assert isinstance(translate_psutil_error(psutil.TimeoutExpired(1.0, 42), "process 42"), TimedOut)
    with pytest.raises(TargetGone):
        procfs.process(2 ** 22 + 12345)


def test_the_tree_of_a_real_job():
    code = ("import subprocess, sys, time; "
            "k = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)']); time.sleep(30)")
    p = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and len(procfs.descendants_of(p.pid)) < 1:
            time.sleep(0.05)
        tree = procfs.descendants_of(os.getpid())
        child = next(pid for pid, parent in tree if parent == p.pid)
        assert (p.pid, os.getpid()) in tree and procfs.children_of(p.pid) == [child]
    finally:
        for c in psutil.Process(p.pid).children(recursive=True):
            c.kill()
        p.kill()
        p.wait()
    assert procfs.descendants_of(p.pid) == []         # gone: an empty tree, not an exception


def test_a_zombie_is_named_and_refused():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and psutil.Process(p.pid).status() != psutil.STATUS_ZOMBIE:
            time.sleep(0.02)
        info = inspect(p.pid)
        assert info.zombie and not is_alive(p.pid)
        with pytest.raises(UserError) as e:
            validate(p.pid)
        assert e.value.exit_code == EXIT_BAD_INPUT and "zombie" in str(e.value)
    finally:
        p.wait()
    with pytest.raises(UserError) as e:
        validate(p.pid)
    assert "no process" in str(e.value)


def test_psutil_facts_agree_with_the_raw_proc_files():
    # A sleeping process: nothing moves between the two reads.
    p = subprocess.Popen([sys.executable, "-c", "import threading, time\n"
                          "threading.Thread(target=time.sleep, args=(30,)).start(); print('ready', flush=True)\n"
                          "time.sleep(30)"], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "ready"
        time.sleep(0.2)
        raw = {"stat": procfs.read_text("/", f"proc/{p.pid}/stat"),
               "status": procfs.read_text("/", f"proc/{p.pid}/status")}
        snap = _snapshot_process("/", p.pid)
    finally:
        p.kill()
        p.wait()
    new, old = _proc_facts(snap), _proc_facts(raw)
    assert new["ppid"] == old["ppid"] == os.getpid()
    assert new["num_threads"] == old["num_threads"] == 2 == len(snap["tasks"])
    assert new["state"] == old["state"] == "S"
    assert new["cpus_allowed"] == old["cpus_allowed"] and new["mems_allowed"] == old["mems_allowed"]
    assert new["cpu_s"] == pytest.approx(old["cpu_s"], abs=0.011)
    assert new["rss_mb"] == pytest.approx(old["rss_mb"], abs=0.2)
    assert "threading" in snap["cmdline"]
