"""`diagnose --priority`: the agent and every probe child it starts run in the class asked for, on a
real job, and the job itself keeps its own."""
from __future__ import annotations

import json
import os
import subprocess
import time

import psutil
import pytest

from trainprobe.agent.schedclass import AUTO_FREE_CPUS, LOW_NICE, apply as set_priority
from tests.helpers import PY, REPO, start_workload


def _watch_tree(proc: subprocess.Popen, seconds: float) -> dict[int, tuple[str, int, int]]:
    """Every process of the agent's tree seen while it runs: pid -> (name, policy, nice)."""
    seen: dict[int, tuple[str, int, int]] = {}
    deadline = time.monotonic() + seconds
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            root = psutil.Process(proc.pid)
            for p in [root, *root.children(recursive=True)]:
                try:
                    seen[p.pid] = (p.name(), os.sched_getscheduler(p.pid), os.getpriority(os.PRIO_PROCESS, p.pid))
                except (OSError, psutil.Error):
                    pass
        except psutil.Error:
            pass
        time.sleep(0.05)
    return seen


@pytest.mark.parametrize("level", ["idle", "low", "auto"])
def test_the_agent_and_its_probe_children_run_in_the_class_asked_for(level):
    job = start_workload("--seconds", "40", "--num-workers", "0")
    try:
        before = (os.sched_getscheduler(job.pid), os.getpriority(os.PRIO_PROCESS, job.pid))
        agent = subprocess.Popen([PY, "-m", "trainprobe.agent", "diagnose", "--pid", str(job.pid), "--duration", "2",
                                  "--priority", level, "--json", "--probes", "process,pyspy"],
                                 cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        seen = _watch_tree(agent, 60)
        out, err = agent.communicate(timeout=60)
        assert agent.returncode == 0, err
        decided = json.loads(out)["overhead"]["scheduling_class"]
        assert decided["asked"] == level
        if level == "auto":
            # the class auto chose from the node's idle CPUs is the one the whole tree ran in
            assert decided["class"] in ("idle", "normal") and decided["free_cpus"] is not None, decided
            assert (decided["class"] == "idle") == (decided["free_cpus"] >= AUTO_FREE_CPUS), decided
            level = decided["class"]
        assert any(name.startswith("py-spy") for name, _, _ in seen.values()), seen      # a probe child was seen
        for pid, (name, policy, nice) in seen.items():
            if level == "idle":
                assert policy == os.SCHED_IDLE, (name, policy)
            elif level == "low":
                assert policy == os.SCHED_OTHER and nice >= LOW_NICE, (name, policy, nice)
            else:
                assert policy == os.SCHED_OTHER, (name, policy, nice)
        # the watched job is left as it was
        assert (os.sched_getscheduler(job.pid), os.getpriority(os.PRIO_PROCESS, job.pid)) == before
        assert "not set" not in err
    finally:
        job.stop()


def test_set_priority_applies_to_threads_started_after_it():
    code = ("import os, threading\n"
            "from trainprobe.agent.schedclass import apply as set_priority\n"
            "assert set_priority('idle') is None\n"
            "r = []\n"
            "t = threading.Thread(target=lambda: r.append(os.sched_getscheduler(0))); t.start(); t.join()\n"
            "print(r[0] == os.SCHED_IDLE, os.sched_getscheduler(0) == os.SCHED_IDLE)\n")
    out = subprocess.run([PY, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=30)
    assert out.stdout.split() == ["True", "True"], out.stderr


def test_normal_changes_nothing():
    before = (os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, 0))
    assert set_priority("normal") is None
    assert (os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, 0)) == before
