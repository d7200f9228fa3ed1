"""`diagnose --pid` given one of a training process's DataLoader workers: the diagnosis watches the
training process (the worker with it), and a worker that inherited LOCAL_RANK from its rank is never
taken for a rank, nor its training process for a launcher (a real job, two workers, LOCAL_RANK set
as a launcher sets it)."""
import os
import subprocess
import time

import pytest

from tests.helpers import PY, REPO, run_cli
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
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONWARNINGS="ignore", LOCAL_RANK="0")
    proc = subprocess.Popen([PY, "-m", "trainprobe.agent.workloads.train_cpu", "--seconds", "60", "--num-workers", "2",
                             "--persistent-workers", "--sample-work", "400"],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)
    deadline = time.monotonic() + 60
    workers = []
    while time.monotonic() < deadline and len(workers) < 2:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            pytest.fail("the job exited early")
        if line.startswith("PROGRESS"):
            workers = _workers(proc.pid)
    if len(workers) < 2:
        proc.kill()
        pytest.fail("the job's two DataLoader workers did not start in time")
    yield proc.pid, workers
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


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
