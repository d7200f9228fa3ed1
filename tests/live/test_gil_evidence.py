"""gil.contention rests on who held the GIL: real jobs (tests/jobs/gil_threads.py) with threads that
block (a pipe read, a queue, an Event, sleep loops), threads in C calls that release the GIL
(hashlib, zlib, a torch matmul), a pure-Python spinner, and a loop that itself blocks in native
code; the real py-spy probe (with its GIL sampler) attached to each."""
import pytest

from trainprobe.agent import diagnosis
from trainprobe.agent.combiners.gil_wait import suspects
from tests.helpers import run_cli

pytestmark = pytest.mark.live
JOB = "tests.jobs.gil_threads"


def start(workload, *args):
    # The job starts its neighbours after its first step (a spinner would hold the GIL through it).
    return workload("--seconds", "90", *args, module=JOB, timeout=120)


def pyspy_only(pid, seconds=3.0):
    d = diagnosis.run(pid, duration_s=seconds, only=("pyspy",))
    return {f["id"]: f for f in d.report["findings"]}, d.evidence


def test_threads_blocked_in_a_read_a_queue_an_event_or_sleep_hold_no_gil(workload):
    w = start(workload, "--neighbours", "pipe,queue,event,sleep")
    found, ev = pyspy_only(w.pid)
    spy = ev.get("pyspy")
    assert spy["gil"]["measured"], spy["gil"]
    assert "gil.contention" not in found, found.get("gil.contention")
    by_name = {o["name"]: o for o in spy["other_threads"]}
    for kind in ("pipe", "queue", "event", "sleep"):
        o = by_name[f"bg-{kind}"]
        # A sleep loop wakes 20 times a second and takes the GIL for each wake: on a loaded machine
        # the GIL sampler caught it so once in about 100 samples (0.0098); none holds it for a share.
        assert o["gil_share"] <= 0.03, o
        assert o["active_fraction"] is not None and o["active_fraction"] < 0.3, o   # the OS says it slept
    assert not suspects(ev)
    assert spy["training_thread"]["waits"]["gil"] == 0.0
    assert w.alive()


def test_threads_in_c_calls_that_release_the_gil_are_not_suspects(workload):
    w = start(workload, "--neighbours", "hash,zlib,matmul")
    found, ev = pyspy_only(w.pid)
    spy = ev.get("pyspy")
    assert spy["gil"]["measured"]
    assert "gil.contention" not in found, found.get("gil.contention")
    by_name = {o["name"]: o for o in spy["other_threads"]}
    for kind in ("hash", "zlib", "matmul"):
        o = by_name[f"bg-{kind}"]
        assert o["active_fraction"] > 0.5, o          # busy on a CPU ...
        assert o["gil_share"] < 0.2, o                # ... without the GIL


def test_a_pure_python_spinner_is_found_by_the_default_run_citing_the_ownership_measure(workload):
    w = start(workload, "--neighbours", "spinner,pipe")
    r = run_cli("diagnose", "--pid", str(w.pid), "--duration", "3", "--json", timeout=180)
    assert r.rc == 0, r.err
    rep = r.json()
    f = next((x for x in rep["findings"] if x["id"] == "gil.contention"), None)
    assert f is not None, [(x["id"], x["expected_speedup"]) for x in rep["findings"]]
    assert f["details"]["source"] == "gil_ownership"
    assert f["details"]["holder"]["name"] == "bg-spinner" and f["details"]["holder"]["gil_share"] >= 0.2
    assert any("py-spy --gil" in e["fact"] for e in f["evidence"])
    assert f["expected_speedup"] > 1.1
    assert all("bg-spinner" in fx["title"] for fx in f["fixes"])
    assert "bg-pipe" not in f["title"]


def test_a_loop_blocked_in_native_code_gets_its_off_cpu_time_classified(workload):
    # The loop runs a 2-thread torch forward/backward, torch.autograd.backward, an Event wait and
    # a read of a subprocess's pipe each step.
    w = start(workload, "--loop", "native", "--neighbours", "pipe,sleep")
    found, ev = pyspy_only(w.pid)
    tt = ev.get("pyspy")["training_thread"]
    assert "gil.contention" not in found
    # The native part of the step (a small CPU backward) is over in a few ms on a quiet machine, so
    # its share of the samples ranges from 0 to a few percent: what must hold is that none of the
    # off-CPU time is GIL wait; the blocking reads and waits are classified as such.
    assert tt["frame_kinds"]["io"] > 0.02, tt["frame_kinds"]
    assert tt["frame_kinds"]["idle_wait"] > 0.02, tt["frame_kinds"]
    # The loop starts a threading.Timer (a Python thread) every step, which holds the GIL for a few
    # microseconds: 2 of 5 full runs read 0.85% of GIL wait from it; a finding needs 10%.
    assert tt["waits"]["gil"] < 0.02, tt["waits"]
    assert tt["waits"]["io"] > 0.0 and tt["waits"]["idle_wait"] > 0.0, tt["waits"]
