"""A real 2-rank DDP job (torchrun, gloo on the CPU, each rank pinned to its own CPU) whose local rank 1
does extra pure-Python work each step: the lockstep straggler by its own compute. A module of its own,
so that test_live_multirank's module-scoped job has stopped before this one starts on the same CPUs
(beside it, this job's ranks waited for a CPU a fifth of the window and read as cpu.contended)."""
import os
import subprocess
import time

import pytest

from tests.helpers import PY, REPO, run_cli
from tests.live.test_live_multirank import _free_port, _stop

pytestmark = pytest.mark.live


@pytest.fixture
def compute_straggler_job():
    """torchrun, 2 local ranks pinned to CPUs 0 and 1; local rank 1 does extra pure-Python work each step."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    proc = subprocess.Popen([PY, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={_free_port()}",
                             str(REPO / "tests" / "jobs" / "straggler_ddp.py"), "--pin", "--slow-rank", "1",
                             "--extra-work", "20000"],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    ranks, progress, seen = {}, False, []
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and not (len(ranks) == 2 and progress):
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            pytest.fail("torchrun exited early:\n" + "".join(seen[-20:]))
        seen.append(line)
        if line.startswith("RANK "):
            kv = dict(x.split("=", 1) for x in line.split()[1:])
            ranks[int(kv["rank"])] = int(kv["pid"])
        progress = progress or line.startswith("PROGRESS")
    if len(ranks) < 2 or not progress:
        # What held the ranks' CPUs (one CI run saw rank 1 print nothing in 120 s).
        top = subprocess.run(["ps", "-eo", "pid,ppid,ni,psr,pcpu,etime,args", "--sort=-pcpu"], capture_output=True,
                             text=True).stdout.splitlines()[:12]
        proc.kill()
        pytest.fail(f"the job did not start both ranks in time (seen: {ranks}, progress: {progress})\n"
                    + "".join(seen[-20:]) + "\n".join(top))
    yield proc.pid, ranks
    _stop(proc)


def test_local_ranks_get_the_same_straggler_model(compute_straggler_job):
    """The lockstep asymmetry across the local ranks of one launcher names the slow rank, whatever its
    cause (here its own host code, named by the flame-graph diff of the two ranks' frames)."""
    launcher, ranks = compute_straggler_job
    r = run_cli("diagnose", "--pid", str(launcher), "--duration", "5", "--json")
    assert r.rc == 0, r.err
    rep = r.json()
    f = next((x for x in rep["findings"] if x["id"] == "rank.straggler"), None)
    assert f is not None, [(x["id"], x["title"]) for x in rep["findings"]]
    assert f["details"]["rank_pid"] == ranks[1] and str(ranks[1]) in f["title"]
    assert f["details"]["cause"] == "own_compute", f["details"]["causes"]
    assert "extra_host_work" in f["details"]["causes"][0]["title"]
    # What the step after the fix was made of, and what else ran on the host, when this fails.
    why = (f["details"]["after_fix"], f["speedup_bound"], [(e["fact"], e["value"]) for e in f["evidence"]],
           [(x["id"], x["title"]) for x in rep["findings"]])
    assert f["expected_speedup"] > 1.05 and f["details"]["excess_share"] > f["details"]["error_share"], why
    waits = {e["fact"].split(":")[0]: e["value"] for e in f["evidence"] if "waiting in collectives" in e["fact"]}
    assert waits[f"rank PID {ranks[0]}"] > waits[f"rank PID {ranks[1]}"]
