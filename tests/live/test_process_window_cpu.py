"""The CPU a job's children spend inside the window, from real processes started here: a worker that
exits before the window ends shows what it spent in the window (its last listing's reading less its
start), not its whole life's CPU (what the start snapshot alone holds) nor nothing."""
import subprocess
import sys
import time
from contextlib import contextmanager

import psutil

from tests.helpers import run_probe
from trainprobe.probes.process import ProcessProbe

# A parent that keeps a child which burns CPU for a while before the window (its life's CPU), goes
# on burning into the window, exits in its middle, and is replaced by one that is born and dies
# inside the window (seen by the listings only), named as torch names its DataLoader workers.
PARENT = r"""
import subprocess, sys, time
burn = ("import sys, time\nif len(sys.argv) > 2: open('/proc/self/comm', 'w').write(sys.argv[2])\n"
        "t = time.process_time() + float(sys.argv[1])\nwhile time.process_time() < t: pass\n")
a = subprocess.Popen([sys.executable, "-c", burn, "1.5"])
a.wait()
b = subprocess.Popen([sys.executable, "-c", burn, "0.8", "pt_data_worker_0"])
b.wait()
time.sleep(30)
"""


def test_a_child_gone_inside_the_window_shows_its_window_cpu_not_its_life():
    # Both children die well inside the 6 s window at full speed (about 2.3 s after the start), and
    # still on a machine 2.5 times slower: a CI run with other tests beside it.
    p = subprocess.Popen([sys.executable, "-c", PARENT])
    try:
        time.sleep(0.6)      # the first child has burned some of its 1.5 CPU-s before the window
        before = sum(sum(c.cpu_times()[:2]) for c in psutil.Process(p.pid).children())
        _, ev = run_probe(ProcessProbe(), p.pid, 6.0)
    finally:
        p.kill()
        p.wait()
    kids = [x for x in ev["processes"] if x["ppid"] == p.pid]
    first = next(x for x in kids if x["seen"] == "start")
    assert first["cpu_basis"] == "until_exit"
    # its life's CPU (1.5 s) is not counted, only what it spent after the window began, and no more
    # than a listing's interval (0.5 s) of that is lost
    assert 1.5 - before - 0.55 <= first["cpu_seconds"] <= 1.5 - before + 0.1, (first, before)
    later = [x for x in kids if x["seen"] in ("listing", "end") and x["pid"] != first["pid"]]
    assert later, kids
    second = later[0]
    assert second["cpu_seconds"] is not None and 0.25 <= second["cpu_seconds"] <= 0.85, second
    assert second["seen"] == "listing" and second["role"] == "dataloader_worker", second   # its name


# A parent that forks short-lived children named like DataLoader workers, each burning 0.15 CPU-s
# and reaped at once: workers re-created every epoch, most of them born and gone between two of the
# probe's listings.
FORKER = r"""
import os, sys, time
print("ready", flush=True)
while True:
    pid = os.fork()
    if pid == 0:
        open('/proc/self/comm', 'w').write('pt_data_worker_0')
        t = time.process_time() + 0.15
        while time.process_time() < t:
            pass
        os._exit(0)
    os.waitpid(pid, 0)
    time.sleep(0.02)
"""


@contextmanager
def ready_parent(script: str):
    """A parent running SCRIPT, once it printed "ready"; killed after the block."""
    p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "ready"
        yield p
    finally:
        p.kill()
        p.wait()


def test_children_reaped_in_the_window_are_counted_from_the_parents_cutime():
    with ready_parent(FORKER) as p:
        t0 = psutil.Process(p.pid).cpu_times()
        _, ev = run_probe(ProcessProbe(), p.pid, 4.0)
        t1 = psutil.Process(p.pid).cpu_times()
    got = ev["reaped_children_cpu_s"]
    outer = (t1.children_user + t1.children_system) - (t0.children_user + t0.children_system)
    # the window's reaped CPU lies within what psutil read around the whole probe run
    assert got is not None and 0.3 <= got <= outer + 0.05, (got, outer)
    assert abs(ev["reaped_children_cores"] - got / ev["window_s"]) < 1e-3
    assert ev["worker_churn"]["appeared"] or ev["worker_churn"]["vanished"]


# A parent whose worker (named as torch names them) lives 3 s, start to exit: an epoch's workers,
# joined inside the window.
EPOCH = r"""
import os, sys, time
pid = os.fork()
if pid == 0:
    open('/proc/self/comm', 'w').write('pt_data_worker_0')
    time.sleep(3.0)
    os._exit(0)
print("ready", flush=True)
os.waitpid(pid, 0)
time.sleep(30)
"""


def test_a_worker_gone_inside_the_window_says_how_long_it_lived():
    with ready_parent(EPOCH) as p:
        time.sleep(1.0)
        _, ev = run_probe(ProcessProbe(), p.pid, 4.0)
    assert ev["worker_churn"]["vanished"], ev["worker_churn"]
    # its start (psutil's create_time) to the middle of the listings about its exit: 0.5 s apart on a
    # quiet machine, up to about a second under a parallel suite's load (3.66 s read once). Neither
    # the window's length (4 s) after its start nor the parent's age reads in this range.
    assert 2.6 <= ev["worker_churn"]["vanished_lifetime_s"] <= 3.9, ev["worker_churn"]
