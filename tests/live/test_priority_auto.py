"""`diagnose --priority auto` (the default) on real processes: SCHED_IDLE where the node has an idle
CPU, normal where its CPUs are taken, and back to normal when they are taken after the start."""
from __future__ import annotations

import json
import os
import subprocess
import time

from trainprobe.agent import schedclass
from tests.helpers import PY, REPO

CPUS = len(os.sched_getaffinity(0))


def _sleeper() -> subprocess.Popen:
    return subprocess.Popen([PY, "-c", "import time; time.sleep(120)"])


def _spinners() -> list[subprocess.Popen]:
    return [subprocess.Popen([PY, "-c", "while True: pass"]) for _ in range(CPUS)]


def _diagnose(pid: int, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([PY, "-m", "trainprobe.agent", "diagnose", "--pid", str(pid), "--json",
                             "--probes", "process,pyspy", *extra],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _decision(agent: subprocess.Popen) -> dict:
    out, err = agent.communicate(timeout=90)
    assert agent.returncode == 0, err
    return json.loads(out)["overhead"]["scheduling_class"]


def _kill(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        p.kill()
        p.wait(timeout=10)


def test_a_quiet_node_gets_an_idle_class_agent():
    job = _sleeper()
    try:
        d = _decision(_diagnose(job.pid, "--duration", "2"))
        assert d["asked"] == "auto" and d["class"] == "idle", d
        assert d["free_cpus"] >= schedclass.AUTO_FREE_CPUS and "promoted" not in d
    finally:
        _kill([job])


def test_a_node_whose_cpus_are_taken_keeps_a_normal_agent():
    job = _sleeper()
    spin = _spinners()
    try:
        time.sleep(0.5)
        d = _decision(_diagnose(job.pid, "--duration", "2"))
        assert d["class"] == "normal" and d["free_cpus"] < schedclass.AUTO_FREE_CPUS, d
    finally:
        _kill([job, *spin])


def test_an_idle_agent_that_starves_goes_back_to_normal_and_finishes_on_time():
    job = _sleeper()
    spin: list[subprocess.Popen] = []
    try:
        agent = _diagnose(job.pid, "--duration", "4")
        t0 = time.monotonic()
        while time.monotonic() - t0 < 30:
            try:
                if os.sched_getscheduler(agent.pid) == os.SCHED_IDLE:
                    break
            except OSError:
                pass
            time.sleep(0.01)
        spin = _spinners()
        d = _decision(agent)
        took = time.monotonic() - t0
        assert d["class"] == "normal" and "promoted" in d, d
        assert took < 20, took
    finally:
        _kill([job, *spin])


def test_promote_moves_every_thread_of_a_process_out_of_sched_idle():
    code = ("import os, threading, time\n"
            "os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))\n"
            "threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n"
            "print('ready', flush=True); time.sleep(60)\n")
    child = subprocess.Popen([PY, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        tids = [int(t) for t in os.listdir(f"/proc/{child.pid}/task")]
        assert len(tids) == 2 and all(os.sched_getscheduler(t) == os.SCHED_IDLE for t in tids)
        assert schedclass.promote([child.pid]) == 2
        assert all(os.sched_getscheduler(t) == os.SCHED_OTHER for t in tids)
    finally:
        _kill([child])
