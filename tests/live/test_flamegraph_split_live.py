"""`trainprobe flamegraph` on a real process whose main thread computes half the time and waits
(threading.Event.wait) the other half: the waiting frames are drawn as waits, and the thread's bar
splits its wall time as the kernel measured it (schedstat): runnable (on a CPU or in the run queue)
about half the window, off-CPU the rest."""
import re
import subprocess
import sys
import time

from tests.helpers import run_cli

JOB = """
import threading, time
ev = threading.Event()
def compute(t):
    end = time.perf_counter() + t
    while time.perf_counter() < end:
        pass
def rest(t):
    ev.wait(t)
print("ready", flush=True)
while True:
    compute(0.05)
    rest(0.05)
"""


def test_waits_and_the_kernels_split_are_drawn_apart_from_compute(tmp_path):
    job = subprocess.Popen([sys.executable, "-c", JOB], stdout=subprocess.PIPE, text=True)
    try:
        assert job.stdout.readline().strip() == "ready"
        time.sleep(0.3)
        out = tmp_path / "g.svg"
        r = run_cli("flamegraph", "--pid", str(job.pid), "--duration", "2", "-o", str(out))
        assert r.rc == 0, r.err
        assert job.poll() is None, "the job kept running"
    finally:
        job.kill()
        job.wait()
    svg = out.read_text()
    waits = re.findall(r'data-wait="1"><title>([^\n<]*)', svg)
    # (Event.wait is drawn as a wait when all its samples waited; on a loaded machine some catch the
    # thread runnable inside it, after its timeout, and only Condition.wait beneath it is all waiting)
    assert {"Event.wait (threading.py)", "Condition.wait (threading.py)"} & set(waits), waits
    assert not any(w.startswith("compute") for w in waits)
    bar = {m.group(1): float(m.group(2)) for m in re.finditer(r'class="tp-(on-cpu|runqueue|off-cpu)" '
                                                             r'data-seconds="([0-9.]+)"', svg)}
    wall = sum(bar.values())
    assert 1.5 < wall < 2.6, bar
    runnable = (bar.get("on-cpu", 0) + bar.get("runqueue", 0)) / wall
    assert 0.3 < runnable < 0.7, bar              # it computes 50 ms of every 100 ms
    assert 'data-thread="MainThread' in svg
