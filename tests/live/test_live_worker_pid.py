"""`diagnose --pid` given one of a training process's DataLoader workers: the diagnosis watches the
training process (the worker with it), and a worker that inherited LOCAL_RANK from its rank is never
taken for a rank, nor its training process for a launcher (a real job, two workers, LOCAL_RANK set
as a launcher sets it)."""
import os
import signal
import time

import pytest

from tests.helpers import run_cli, start_workload
from trainprobe.probes.support.target import launcher_of, trainer_of_worker

pytestmark = pytest.mark.live


def _workers(pid):
    kids = open(f"/proc/{pid}/task/{pid}/children").read().split()
    out = []
    for k in kids:
        try:
            if open(f"/proc/{k}/comm").read().startswith("pt_data_worker"):
                out.append(int(k))
        except OSError:
            continue
    return out


@pytest.fixture(scope="module")
def job():
    w = start_workload("--seconds", "60", "--num-workers", "2", "--persistent-workers", "--sample-work", "400",
                       env={"LOCAL_RANK": "0"})
    deadline = time.monotonic() + 30
    workers = _workers(w.pid)
    while len(workers) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
        workers = _workers(w.pid)
    if len(workers) < 2:
        w.stop()
        pytest.fail("the job's two DataLoader workers did not start in time")
    yield w.pid, workers
    w.stop()
    # The workers leave on their own once their parent is gone (torch's watchdog); stop any that stay.
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and any(os.path.exists(f"/proc/{p}") for p in workers):
        time.sleep(0.2)
    for p in workers:
        try:
            if open(f"/proc/{p}/comm").read().startswith("pt_data_worker"):
                os.kill(p, signal.SIGKILL)
        except OSError:
            pass


def test_a_worker_with_its_ranks_local_rank_is_no_rank_and_leads_to_its_training_process(job):
    trainer, workers = job
    for w in workers:
        assert launcher_of(w) is None          # two LOCAL_RANK siblings under a Python parent: workers, not ranks
        assert trainer_of_worker(w) == trainer
    assert launcher_of(trainer) is None        # one process with LOCAL_RANK, its parent not a launcher
    assert trainer_of_worker(trainer) is None


def test_diagnose_by_a_worker_pid_watches_its_training_process(job):
    trainer, workers = job
    r = run_cli("diagnose", "--pid", str(workers[0]), "--duration", "3", "--json")
    assert r.rc == 0, r.err
    rep = r.json()
    assert rep["target"]["pid"] == trainer and rep["target"]["requested_pid"] == workers[0]
    assert "is a DataLoader worker; diagnosing its training process" in r.err
    assert "one rank of a multi-rank job" not in r.err
