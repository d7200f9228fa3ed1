"""A real job that starts its own training processes through multiprocessing's spawn (the shape of
pytorch/examples' mnist_hogwild and of torch.multiprocessing.spawn without a launcher): no LOCAL_RANK,
no torch.distributed. Its children are training processes, not DataLoader workers; each rank's own
workers stay workers; the job's threads oversubscribe the CPUs."""
import os
import subprocess
import time

import pytest

from tests.helpers import PY, REPO, run_cli

pytestmark = pytest.mark.live


def _comm(pid):
    with open(f"/proc/{pid}/comm") as fh:
        return fh.read().strip()


@pytest.fixture(scope="module")
def spawned_job():
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONWARNINGS="ignore")
    env.pop("OMP_NUM_THREADS", None)
    proc = subprocess.Popen([PY, str(REPO / "tests" / "jobs" / "spawn_trainers.py"), "--seconds", "120"],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)
    trainers, seen = set(), []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len(trainers) < 2:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            pytest.fail("the job exited early:\n" + "".join(seen[-20:]))
        seen.append(line)
        if line.startswith("TRAINER "):
            trainers.add(int(dict(x.split("=", 1) for x in line.split()[1:])["pid"]))
    if len(trainers) < 2:
        proc.kill()
        pytest.fail("the job did not start both training processes in time:\n" + "".join(seen[-20:]))
    yield proc.pid, sorted(trainers)
    os.killpg(proc.pid, 15)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)


def test_a_spawned_training_process_widens_to_the_job_and_its_siblings_are_ranks(spawned_job):
    parent, trainers = spawned_job
    r = run_cli("diagnose", "--pid", str(trainers[0]), "--duration", "4", "--json")
    assert r.rc == 0, r.err
    rep = r.json()
    assert rep["target"]["pid"] == parent and rep["target"]["requested_pid"] == trainers[0]
    assert "one rank of a multi-rank job" in r.err
    assert sorted(x["pid"] for x in rep["target"]["ranks"]) == trainers
    roles = {w["pid"]: w["role"] for w in rep["target"]["workers"]}
    assert all(roles[t] == "rank" for t in trainers), roles
    # each rank's own DataLoader worker names itself and stays a worker; multiprocessing's resource
    # tracker is neither
    for pid, role in roles.items():
        if pid in trainers:
            continue
        assert role == ("dataloader_worker" if _comm(pid).startswith("pt_data_worker") else "child"), (pid, role)
    assert any(role == "dataloader_worker" for role in roles.values()), roles
    # they step on their own: nobody waits for a straggler
    assert not any("straggler" in f["title"] for f in rep["findings"]), [f["title"] for f in rep["findings"]]
    assert any("step on their own" in n for n in rep["notes"]), rep["notes"]
    # 2 x the CPUs' intra-op threads: the job oversubscribes its CPUs, and the fix caps every rank
    f = next((x for x in rep["findings"] if x["id"] == "cpu.oversubscribed"), None)
    assert f is not None, [(x["id"], x["title"]) for x in rep["findings"]]
    knobs = [fx.get("knobs") or {} for fx in f["fixes"]]
    assert any(k.get("intra_op_threads") == max(1, (os.cpu_count() or 1) // 2) for k in knobs), knobs
    assert "each of the 2 training processes" in f["fixes"][0]["title"]


def test_the_placement_probe_reads_the_spawned_processes_as_ranks(spawned_job):
    """The placement probe labels the job's processes itself (its NUMA advice is per rank): the spawned
    training processes are ranks, each rank's named worker a worker, multiprocessing's resource tracker
    neither, and each worker belongs to its rank."""
    from tests.helpers import run_probe
    from trainprobe.probes.placement import PlacementProbe
    parent, trainers = spawned_job
    _, ev = run_probe(PlacementProbe(), parent, 2.0)
    roles = {p["pid"]: p["role"] for p in ev["processes"]}
    assert all(roles[t] == "rank" for t in trainers), roles
    for p in ev["processes"]:
        if p["pid"] in trainers or p["pid"] == parent:
            continue
        named = _comm(p["pid"]).startswith("pt_data_worker")
        assert p["role"] == ("dataloader_worker" if named else "child"), (p["pid"], p["role"], p.get("argv"))
        if named:
            assert p["rank_pid"] in trainers
