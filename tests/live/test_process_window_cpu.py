"""The CPU a job's children spend inside the window, from real processes started here: a worker that
exits before the window ends shows what it spent in the window (its last listing's reading less its
start), not its whole life's CPU (what the start snapshot alone holds) nor nothing."""
import subprocess
import sys
import time

from tests.helpers import run_probe
from trainprobe.probes.process import ProcessProbe

# A parent that keeps a child which burns CPU for a while before the window (its life's CPU), goes
# on burning into the window, exits in its middle, and is replaced by one that is born and dies
# inside the window (seen by the listings only), named as torch names its DataLoader workers.
PARENT = r"""
import subprocess, sys, time
burn = ("import sys, time\nif len(sys.argv) > 2: open('/proc/self/comm', 'w').write(sys.argv[2])\n"
        "t = time.process_time() + float(sys.argv[1])\nwhile time.process_time() < t: pass\n")
a = subprocess.Popen([sys.executable, "-c", burn, "2.5"])
a.wait()
b = subprocess.Popen([sys.executable, "-c", burn, "0.6", "pt_data_worker_0"])
b.wait()
time.sleep(30)
"""


def test_a_child_gone_inside_the_window_shows_its_window_cpu_not_its_life():
    p = subprocess.Popen([sys.executable, "-c", PARENT])
    try:
        time.sleep(1.2)      # the first child has burned about 1 s of CPU before the window
        _, ev = run_probe(ProcessProbe(), p.pid, 3.5)
    finally:
        p.kill()
        p.wait()
    kids = [x for x in ev["processes"] if x["ppid"] == p.pid]
    first = next(x for x in kids if x["seen"] == "start")
    assert first["cpu_basis"] == "until_exit"
    # it burned 2.5 CPU-s over its life, about 1.3 of them inside the window; its life's CPU is not
    # counted, and no more than a listing's interval (0.5 s) of what it spent is lost
    assert 0.5 <= first["cpu_seconds"] <= 2.0, first
    later = [x for x in kids if x["seen"] in ("listing", "end") and x["pid"] != first["pid"]]
    assert later, kids
    second = later[0]
    assert second["cpu_seconds"] is not None and 0.1 <= second["cpu_seconds"] <= 0.7, second
    assert second["seen"] == "listing" and second["role"] == "dataloader_worker", second   # its name
