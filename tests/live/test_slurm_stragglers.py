"""Stragglers of four causes on a real Slurm (munged, slurmctld, two slurmd on this host): one real
2-node torchrun/gloo job (tests/jobs/straggler_ddp.py, one rank per node, each pinned to its own
CPU) whose rank 1 on n2 carries one cause at a time (scripts/straggler_cluster.py): its own
data loading, extra pure-Python work in its loop, another process spinning on its CPU, a cgroup
CPU quota on its process tree. `diagnose --slurm-job` must name n2 rank 1 by the lockstep
asymmetry and read the cause from n2's own probes. One job for the module, on the session's cluster
(tests/live/conftest.py)."""

import pytest

from tests.helpers import run_cli
from scripts.straggler_cluster import StragglerJob

pytestmark = [pytest.mark.live, pytest.mark.slow]

EXPECTED = {"data": "data", "compute": "own_compute", "hog": "cpu_contended", "quota": "cpu_quota"}


@pytest.fixture(scope="module")
def job(slurm, tmp_path_factory):
    if not slurm.wait_idle(60):
        pytest.fail("the session's Slurm nodes are not up:\n" + slurm.logs_tail())
    j = None
    try:
        j = StragglerJob(slurm.env, tmp_path_factory.mktemp("straggler-job")).start()
        yield slurm, j
    finally:
        if j is not None:
            j.stop()


@pytest.mark.parametrize("cause", list(EXPECTED))
def test_the_straggler_and_its_cause_are_named(job, cause, tmp_path):
    cluster, j = job
    j.apply(cause)
    try:
        html = tmp_path / "job.html"
        r = run_cli("diagnose", "--slurm-job", j.jid, "--duration", "6", "--json", "--html", str(html),
                    env=cluster.env, timeout=180)
        assert r.rc == 0, r.err + r.out[-2000:]
        rep = r.json()
    finally:
        j.remove()
    assert rep["job"]["nodes_ok"] == ["n1", "n2"], rep["notes"]
    by = {(x["node"], x["rank"]): x for x in rep["ranks"]}
    s = rep["stragglers"]
    assert [(x["node"], x["rank"], x["pid"]) for x in s] == [("n2", 1, j.pids[1])], (s, rep["ranks"])
    # Lockstep: rank 0 waits for rank 1 in the collectives; rank 1 waits less.
    assert by[("n1", 0)]["collective_share"] > by[("n2", 1)]["collective_share"]
    assert by[("n1", 0)]["waits_for"] == ["n2 rank 1"]
    assert s[0]["excess_share"] > s[0]["error_share"]
    assert rep["job_expected_speedup"] > 1.0
    causes = [c["cause"] for c in s[0]["causes"]]
    assert EXPECTED[cause] in causes, (causes, s[0]["causes"])
    assert s[0]["cause"] == EXPECTED[cause], (causes, s[0]["causes"])
    top = s[0]["causes"][0]
    assert top["fix"] and top["job_speedup_if_removed"] > 1.0
    if cause == "compute":
        assert "extra_host_work" in top["title"]              # the flame-graph diff names the function
    if cause == "hog":
        assert any(f"PID {p}" in top["title"] for p in j.hog_pids)   # the processes on its CPU, by PID
    if cause == "quota":
        assert top["command"] and "cpu" in top["command"]
    page = html.read_text()
    assert "Ranks side by side" in page and "class=straggler" in page
