"""`diagnose --slurm-job` against a real Slurm (munged, slurmctld, two slurmd on this host) running a
real 2-node torchrun/gloo job, one rank per node, rank 1's input pipeline starved (it loads its
batches in the loop); rank 0 has its data in memory and waits for rank 1 in the all-reduce."""
import json
import os
import socket
import subprocess
import time

import pytest

from tests.helpers import PY, REPO, run_cli
from scripts.slurm_cluster import JOB

pytestmark = [pytest.mark.live, pytest.mark.slow]


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]




@pytest.fixture(scope="module")
def job(slurm, tmp_path_factory):
    d = tmp_path_factory.mktemp("job")
    script = d / "job.sh"
    script.write_text(JOB.format(port=_free_port(), py=PY))
    out = d / "job.out"
    r = subprocess.run(["sbatch", "--parsable", f"--chdir={REPO}", f"--output={out}", str(script)],
                       env=slurm.env, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    jid = r.stdout.strip().split(";")[0]
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        text = out.read_text() if out.exists() else ""
        if "rank=0" in text and "rank=1" in text:
            break
        st = subprocess.run(["squeue", "-h", "-j", jid, "-o", "%T"], env=slurm.env, capture_output=True,
                            text=True).stdout.strip()
        if st in ("", "FAILED", "COMPLETED", "CANCELLED"):
            pytest.fail(f"job {jid} ended ({st}):\n{text[-2000:]}")
        time.sleep(1)
    else:
        pytest.fail(f"job {jid} made no progress:\n{(out.read_text() if out.exists() else '')[-2000:]}")
    yield jid
    subprocess.run(["scancel", jid], env=slurm.env, capture_output=True, timeout=30)


def _node_story(saved, node):
    """What a node's own report said (its findings and every rule that did not fire): printed with a
    failed check, so a straggler whose node finding is missing says why."""
    out = []
    for f in sorted((saved / "nodes" / node).rglob("report.json")):
        d = json.loads(f.read_text())
        out.append({"findings": [(x.get("id"), x.get("expected_speedup")) for x in d.get("findings") or []],
                    "rules": [(x.get("rule"), x.get("status"), x.get("reason")) for x in d.get("rules") or []
                              if x.get("status") in ("error", "quiet")]})
    return out


def _check(rep, story=lambda: None):
    assert set(rep["job"]["nodes"]) == {"n1", "n2"}
    by = {(r["node"], r["rank"]): r for r in rep["ranks"]}
    assert set(by) == {("n1", 0), ("n2", 1)}, rep["ranks"]
    s = rep["stragglers"]
    assert [(x["node"], x["rank"]) for x in s] == [("n2", 1)], (s, rep["ranks"])
    assert s[0]["cause"] == "data" and s[0]["finding"] == "dataloader.starved", (s[0], story())
    healthy = by[("n1", 0)]
    assert healthy["data_share"] < 0.05                    # rank 0 does not wait for its own data ...
    assert healthy["collective_share"] > 0.2               # ... it waits for rank 1 in collectives
    assert healthy["waits_for"] == ["n2 rank 1"]
    assert by[("n2", 1)]["data_share"] > 0.3
    assert rep["job_expected_speedup"] is not None and rep["job_expected_speedup"] >= 1.0   # printed


def test_slurm_job_names_the_starved_node_and_rank(slurm, job, tmp_path):
    saved = tmp_path / "jobbundle"
    r = run_cli("diagnose", "--slurm-job", job, "--duration", "6", "--json", "--save", str(saved),
                "--html", str(tmp_path / "job.html"), env=slurm.env, timeout=180)
    assert r.rc == 0, r.err + r.out[-3000:]
    rep = r.json()
    assert rep["job"]["nodes_ok"] == ["n1", "n2"], rep["notes"]
    _check(rep, lambda: _node_story(saved, "n2"))
    html = (tmp_path / "job.html").read_text()
    assert "Straggler: node n2, rank 1" in html and "class=straggler" in html
    # The job bundle holds every node's bundle; `report` re-diagnoses them offline, in text.
    assert sorted(os.listdir(saved / "nodes")) == ["n1", "n2"]
    t = run_cli("report", str(saved))
    assert t.rc == 0, t.err
    assert "Straggler: node n2, rank 1" in t.out and "Job expected speedup" in t.out
    j = run_cli("report", str(saved), "--json")
    _check(j.json())


def test_slurm_job_unknown_and_bad_input(slurm, job):
    r = run_cli("diagnose", "--slurm-job", "999999", "--duration", "2", env=slurm.env)
    assert r.rc == 2 and "999999" in r.err
    r = run_cli("diagnose", "--slurm-job", job, "--nodes", "n7", "--duration", "2", env=slurm.env)
    assert r.rc == 2 and "n7" in r.err


def test_slurm_job_one_node_only(slurm, job):
    r = run_cli("diagnose", "--slurm-job", job, "--nodes", "n2", "--duration", "4", "--json", env=slurm.env,
                timeout=120)
    assert r.rc == 0, r.err
    rep = r.json()
    assert rep["job"]["nodes"] == ["n2"] and [x["rank"] for x in rep["ranks"]] == [1]


def test_slurm_job_nodes_that_time_out_are_named(slurm, job):
    """srun stopped when the nodes overrun: each node is reported as timed out, nothing stays behind."""
    r = run_cli("diagnose", "--slurm-job", job, "--duration", "10", "--node-timeout", "4", "--json",
                env=slurm.env, timeout=120)
    assert r.rc == 3, r.err
    rep = r.json()
    assert {n["node"]: n["status"] for n in rep["nodes"]} == {"n1": "timeout", "n2": "timeout"}
    assert any("did not finish within 4 s" in x for x in rep["notes"])
    time.sleep(3)
    left = subprocess.run(["pgrep", "-f", "--", f"agent diagnose --slurm-local {job} "], capture_output=True, text=True)
    assert left.stdout.split() == []


def test_slurmd_stopped_mid_window(slurm, job):
    """The healthy node's slurmd dies while the agents watch: the report says so; the rest stands."""
    argv = [PY, "-m", "trainprobe.agent", "diagnose", "--slurm-job", job, "--duration", "7", "--json"]
    p = subprocess.Popen(argv, cwd=REPO, env=dict(slurm.env, NO_COLOR="1"), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    stopped = False
    try:
        deadline = time.monotonic() + 60
        # Stop slurmd once both node agents are watching (their py-spy runs under the job's step).
        while time.monotonic() < deadline:
            agents = subprocess.run(["pgrep", "-f", "--", f"agent diagnose --slurm-local {job} "],
                                    capture_output=True, text=True)
            if len(agents.stdout.split()) >= 2:
                break
            time.sleep(0.3)
        else:
            pytest.fail("the node agents did not start")
        time.sleep(3)
        slurm.stop_node("n1")
        stopped = True
        out, err = p.communicate(timeout=180)
    finally:
        if p.poll() is None:
            p.kill()
        if stopped:
            slurm.start_node("n1")          # the session's cluster serves the next module too
    assert p.returncode == 0, err
    rep = json.loads(out)
    n1 = next(n for n in rep["nodes"] if n["node"] == "n1")
    assert n1["slurmd_alive"] is False
    assert any("slurmd of node n1" in x for x in rep["notes"]), rep["notes"]
    n2 = next(n for n in rep["nodes"] if n["node"] == "n2")
    assert n2["status"] == "ok"                                   # the other node's part stands
    assert [(s["node"], s["rank"]) for s in rep["stragglers"]] == [("n2", 1)]
