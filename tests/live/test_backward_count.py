"""The loop's backward passes counted at torch's autograd engine (probes/support/stepcount.py, through
the process probe): real torch processes started here, each making a known number of steps a second."""
import os
import shutil
import subprocess
import sys
import time

import pytest

from tests.helpers import run_probe
from trainprobe.probes.process import ProcessProbe
from trainprobe.probes.support import stepcount

pytest.importorskip("torch")

# A training loop of STEPS backward passes a second (a small MLP, each step paced by the clock), the
# backward on the main thread or on a thread of its own.
LOOP = r"""
import sys, threading, time, torch
rate, on_thread = float(sys.argv[1]), sys.argv[2] == "thread"
torch.set_num_threads(1)
m = torch.nn.Linear(64, 64)
x = torch.randn(32, 64)
def loop():
    t0, n = time.time(), 0
    while time.time() - t0 < 60:
        m(x).sum().backward()
        n += 1
        time.sleep(max(0.0, t0 + n / rate - time.time()))
if on_thread:
    th = threading.Thread(target=loop, name="trainer"); th.start()
print("ready", flush=True)
loop() if not on_thread else th.join()
"""


def _count(rate: float, where: str, seconds: float = 3.0) -> dict:
    p = subprocess.Popen([sys.executable, "-c", LOOP, str(rate), where], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "ready"
        time.sleep(0.5)
        _, ev = run_probe(ProcessProbe(), p.pid, seconds)
    finally:
        p.kill()
        p.wait()
    return ev


@pytest.mark.serial
@pytest.mark.skipif(os.geteuid() != 0, reason="the uprobe PMU needs root or CAP_PERFMON")
@pytest.mark.parametrize("where", ["main", "thread"])
def test_the_window_counts_the_loops_backward_passes(where):
    ev = _count(100.0, where)
    bw = ev["backward"]
    # 100 steps a second over the counters' time (the window, less the probe's start and end)
    assert 0.85 * 100.0 <= bw["per_s"] <= 1.05 * 100.0, bw
    assert len(bw["threads"]) == 1, bw          # one thread calls backward: the main one, or the trainer


@pytest.mark.serial
@pytest.mark.skipif(os.geteuid() != 0, reason="the uprobe PMU needs root or CAP_PERFMON")
def test_the_counter_leaves_nothing_behind():
    """The breakpoint lives as long as its events: once the window ends, none of the probe's perf
    events is open (the kernel takes the breakpoint out with the last one)."""
    def perf_fds():
        n = 0
        for fd in os.listdir("/proc/self/fd"):
            try:
                n += os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:[perf_event]"
            except OSError:
                pass
        return n
    before = perf_fds()
    ev = _count(50.0, "main", 2.0)
    assert ev["backward"]["calls"] > 0
    assert perf_fds() == before


def test_no_torch_no_counter():
    c = stepcount.start([os.getpid()], "7f00-7f10 r-xp 0 08:01 1 /usr/lib/libc.so.6\n")
    assert c.reason == "the process does not map torch's CPU library" and not c.fds


@pytest.mark.serial
@pytest.mark.skipif(os.geteuid() != 0, reason="the uprobe PMU needs root or CAP_PERFMON")
@pytest.mark.skipif(not shutil.which("unshare"), reason="util-linux's unshare")
def test_a_job_in_its_own_mount_namespace_is_counted(tmp_path):
    """A job in a container maps a torch the agent's mount namespace does not have at that path: the
    library is found through /proc/PID/root, and the uprobe lands on the inode the job runs."""
    import torch
    site = os.path.dirname(os.path.dirname(torch.__file__))
    mnt = tmp_path / "site"
    mnt.mkdir()        # empty here; torch is mounted on it inside the job's namespace only
    inner = (f"mount --bind {site} {mnt} && PYTHONPATH={mnt} exec {sys.executable} -S -c \"$LOOP\" 100 main")
    p = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-c", inner],
                         stdout=subprocess.PIPE, text=True, env=dict(os.environ, LOOP=LOOP))
    try:
        assert p.stdout.readline().strip() == "ready"
        time.sleep(0.5)
        maps = open(f"/proc/{p.pid}/maps").read()
        assert f"{mnt}/torch/lib/libtorch_cpu" in maps and not (mnt / "torch").exists()
        _, ev = run_probe(ProcessProbe(), p.pid, 3.0)
    finally:
        p.kill()
        p.wait()
    assert 85.0 <= ev["backward"]["per_s"] <= 105.0, ev.get("backward") or ev.get("backward_unavailable")


# A launcher that starts two training processes through multiprocessing's spawn (as
# torch.multiprocessing.spawn and Lightning's ddp_spawn do), each making its own rate of backward
# passes on its main thread; the launcher makes none.
SPAWNING = r"""
import multiprocessing as mp, sys, time
def rank(rate):
    import torch
    torch.set_num_threads(1)
    m = torch.nn.Linear(64, 64)
    x = torch.randn(32, 64)
    t0, n = time.time(), 0
    while time.time() - t0 < 60:
        m(x).sum().backward()
        n += 1
        time.sleep(max(0.0, t0 + n / rate - time.time()))
if __name__ == "__main__":
    import torch   # the launcher maps torch too (the rank detection reads its version)
    ctx = mp.get_context("spawn")
    ps = [ctx.Process(target=rank, args=(r,)) for r in (50.0, 100.0)]
    for p in ps:
        p.start()
    print("ready", " ".join(str(p.pid) for p in ps), flush=True)
    for p in ps:
        p.join()
"""


@pytest.mark.serial
@pytest.mark.skipif(os.geteuid() != 0, reason="the uprobe PMU needs root or CAP_PERFMON")
def test_each_spawned_ranks_backward_passes_are_counted_through_its_launcher(tmp_path):
    script = tmp_path / "spawning.py"
    script.write_text(SPAWNING)
    p = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        words = p.stdout.readline().split()
        assert words[0] == "ready"
        pids = [int(x) for x in words[1:]]
        time.sleep(4.0)          # each rank imports torch before its first step
        _, ev = run_probe(ProcessProbe(), p.pid, 3.0)
    finally:
        os.killpg(p.pid, 9)
        p.wait()
    rows = {r["pid"]: r for r in ev["processes"]}
    assert [rows[x]["role"] for x in pids] == ["rank", "rank"]
    rates = [rows[x].get("backward", {}).get("per_s") for x in pids]
    assert rates[0] is not None and 42.0 <= rates[0] <= 55.0, rows[pids[0]].get("backward")
    assert rates[1] is not None and 85.0 <= rates[1] <= 105.0, rows[pids[1]].get("backward")
    assert (ev.get("backward") or {}).get("calls", 0) == 0       # the launcher itself makes none
