"""Where a job's threads spend their CPU, by library (probes/support/oncpu.py, through the process
probe): real torch processes started here, sampled with the kernel's software CPU clock."""
import os
import subprocess
import sys
import time

import pytest

from tests.helpers import run_probe
from trainprobe.agent.combiners import step_model
from trainprobe.probes.process import ProcessProbe
from trainprobe.probes.support import oncpu

pytest.importorskip("torch")

# Two intra-op threads; each round a burst of small parallel matmuls, then pure Python on the loop
# thread alone while the other intra-op thread spins in the OpenMP runtime, then sleeps.
TEAM = r"""
import time, torch
torch.set_num_threads(2)
a = torch.randn(256, 256)
print("ready", flush=True)
t = time.time()
while time.time() - t < 60:
    for _ in range(20):
        a @ a
    sum(i * i for i in range(int(__import__("sys").argv[1])))
"""


def _start(python_work: int) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", TEAM, str(python_work)], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    time.sleep(1.0)
    return p


@pytest.mark.serial
@pytest.mark.skipif(os.geteuid() != 0, reason="per-thread perf events of another process need root here")
def test_a_spinning_intra_op_thread_is_told_from_a_working_one():
    p = _start(200_000)
    try:
        _, ev = run_probe(ProcessProbe(), p.pid, 4.0)
    finally:
        p.kill()
        p.wait()
    oc = ev["oncpu"]
    assert any("libgomp" in x or "libiomp" in x for x in oc["openmp_runtime"]), oc
    main = oc["threads"][str(p.pid)]
    # the loop thread ran the whole window: about 100 samples a second of its CPU
    assert 250 <= main["samples"] <= 480, main
    team = [v for tid, v in oc["threads"].items() if tid != str(p.pid) and v["openmp"] > 0]
    assert team, oc
    # the other intra-op thread spends most of its CPU in the runtime: the loop's Python leaves it idle
    spun = sum(v["openmp"] for v in team) / sum(v["samples"] for v in team)
    assert spun >= 0.4, team
    assert oc["lost"] == 0


@pytest.mark.serial
@pytest.mark.skipif(os.geteuid() != 0, reason="per-thread perf events of another process need root here")
def test_the_measured_parallel_efficiency_sets_the_cost_of_one_intra_op_thread():
    """The same team measured twice: mostly Python (its other thread spins) and mostly matmuls (it
    works): e is lower where it spins, and the step model's cap to one thread costs accordingly."""
    es = {}
    for work in (400_000, 2_000):
        p = _start(work)
        try:
            _, ev = run_probe(ProcessProbe(), p.pid, 4.0)
        finally:
            p.kill()
            p.wait()
        m = step_model.StepModel(f_wait=0.0, f_load=0.0, pid=p.pid, n_samples=400.0)
        me = next(x for x in ev["processes"] if x["pid"] == p.pid)
        m.loop_cores = 2.0       # today's step all compute (C = 1) on two intra-op threads
        step_model._measured_par(ev, me, m, float(ev["window_s"]))
        assert m.par_measured is not None, ev.get("oncpu")
        lo, mid, hi = m.par_measured
        assert 0.0 <= lo <= mid <= hi <= 1.0
        es[work] = mid
    assert es[2_000] > es[400_000] + 0.2, es


def test_a_process_without_an_openmp_runtime_is_not_sampled():
    p = subprocess.Popen([sys.executable, "-c", "import time\nprint('ready', flush=True)\ntime.sleep(30)"],
                         stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "ready"
        _, ev = run_probe(ProcessProbe(), p.pid, 1.0)
    finally:
        p.kill()
        p.wait()
    assert "oncpu" not in ev and "oncpu_unavailable" not in ev


def test_a_thread_that_is_gone_gets_one_clear_reason():
    s = oncpu.start([2 ** 22 + 12345], "", 1.0)
    assert not s.events and s.reason and "perf_event_open" in s.reason
    s.close()
