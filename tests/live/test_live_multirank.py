"""A real 2-rank DDP job (torchrun, gloo on the CPU) with a starved DataLoader on one rank only."""
import os
import socket
import subprocess
import time

import pytest

from tests.helpers import PY, REPO, run_cli

pytestmark = pytest.mark.live


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop(proc):
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()


def _local_rank(pid):
    with open(f"/proc/{pid}/environ", "rb") as fh:
        for item in fh.read().split(b"\0"):
            if item.startswith(b"LOCAL_RANK="):
                return int(item.split(b"=", 1)[1])
    return None


@pytest.fixture(scope="module")
def ddp_job():
    """One job for the module's read-only diagnoses."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONWARNINGS="ignore")
    proc = subprocess.Popen([PY, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={_free_port()}",
                             "-m", "trainprobe.agent.workloads.train_cpu", "--seconds", "60", "--ddp", "--starved-rank", "1"],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    deadline = time.monotonic() + 90
    ranks = {}
    while time.monotonic() < deadline and len(ranks) < 2:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            pytest.fail("torchrun exited early")
        if line.startswith("PROGRESS"):
            for kid in open(f"/proc/{proc.pid}/task/{proc.pid}/children").read().split():
                r = _local_rank(int(kid))
                if r is not None:
                    ranks[r] = int(kid)
    yield proc.pid, ranks
    _stop(proc)


def _check(rep, ranks):
    assert {r["pid"] for r in rep["target"]["ranks"]} == set(ranks.values())
    # On a shared host cpu.contended may rank first; the starved rank is dataloader.starved's word.
    f = next((x for x in rep["findings"] if x["id"] == "dataloader.starved"), None)
    assert f is not None, [(x["id"], x["title"]) for x in rep["findings"]]
    assert f["details"]["rank_pid"] == ranks[1]                 # the starved rank is named
    assert str(ranks[1]) in f["title"] and "straggler" in f["title"]
    waits = [e for e in f["evidence"] if str(ranks[0]) in e["fact"] and "collectives" in e["fact"]]
    assert waits and waits[0]["value"] > 0.2                  # rank 0 waits for rank 1, not for its own data
    own = [e for e in f["evidence"] if str(ranks[0]) in e["fact"] and "own batches" in e["fact"]]
    assert own and own[0]["value"] < 0.05
    # The lockstep model names the same rank, by its wait, with the data cause.
    st = next((x for x in rep["findings"] if x["id"] == "rank.straggler"), None)
    if st is not None:
        assert st["details"]["rank_pid"] == ranks[1] and st["details"]["cause"] == "data", st["details"]


def test_diagnose_by_launcher_pid_names_the_starved_rank(ddp_job):
    launcher, ranks = ddp_job
    r = run_cli("diagnose", "--pid", str(launcher), "--duration", "4", "--json")
    assert r.rc == 0, r.err
    _check(r.json(), ranks)


def test_diagnose_by_one_rank_pid_watches_the_whole_job(ddp_job):
    launcher, ranks = ddp_job
    r = run_cli("diagnose", "--pid", str(ranks[0]), "--duration", "4", "--json")
    assert r.rc == 0, r.err
    rep = r.json()
    assert rep["target"]["pid"] == launcher and rep["target"]["requested_pid"] == ranks[0]
    assert "one rank of a multi-rank job" in r.err
    _check(rep, ranks)
