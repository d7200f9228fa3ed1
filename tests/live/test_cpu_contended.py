"""cpu.contended on real jobs: a healthy in-memory CPU job pinned to one CPU beside two busy
processes outside its tree (one of them another user's) pinned to the same CPU; the same job alone;
and a job oversubscribed by its own threads.

Other work on a shared host is real contention too: where the job "alone" finds others on its CPU,
the test checks from /proc, apart from the agent, that they did take it, looks again (a few
windows) for a quiet one, and skips saying so when there was none.
TRAINPROBE_CONTENTION_SAVE=DIR also saves each run's bundle there (tests/data/contention holds
the replayed ones).
"""
from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time

import pytest

from tests.helpers import run_cli

pytestmark = pytest.mark.live

CPU = 0
NOBODY = 65534
SAVE = os.environ.get("TRAINPROBE_CONTENTION_SAVE")


def _pin(pid: int) -> None:
    """Every thread of `pid` onto CPU."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            os.sched_setaffinity(int(tid), {CPU})
        except (PermissionError, ProcessLookupError):
            pass


@contextlib.contextmanager
def on_the_cpu():
    """Processes started inside inherit this thread's affinity: CPU only (restored after)."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {CPU})
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


@pytest.fixture
def busy_pair():
    """Factory: two busy processes outside the job's tree, pinned to its CPU: `python -c` as this
    user and `sh -c` as nobody (when this user is root)."""
    procs: list[subprocess.Popen] = []

    def start() -> list[subprocess.Popen]:
        kw = {"user": NOBODY, "group": NOBODY, "extra_groups": []} if os.geteuid() == 0 else {}
        with on_the_cpu():
            procs.append(subprocess.Popen([sys.executable, "-c", "while True: pass"]))
            procs.append(subprocess.Popen(["/bin/sh", "-c", "while :; do :; done"], **kw))
        for p in procs:
            _pin(p.pid)
        time.sleep(0.5)
        return procs

    yield start
    for p in procs:
        p.kill()
        p.wait()


def job(workload, *args: str):
    with on_the_cpu():
        w = workload("--seconds", "120", "--sample-work", "0", "--report-every", "0.5", *args, warmup_lines=2)
    _pin(w.pid)
    return w


def diagnose(pid: int, name: str, tmp_path) -> dict:
    bundle = tmp_path / f"{name}.tar.gz"
    r = run_cli("diagnose", "--pid", str(pid), "--duration", "3", "--json", "--skip", "perfstat,topology,placement",
                "--save", str(bundle), timeout=120)
    assert r.rc == 0, r.err
    if SAVE:
        os.makedirs(SAVE, exist_ok=True)
        shutil.copy(bundle, os.path.join(SAVE, f"{name}.tar.gz"))
    return r.json()


def _cpu_busy_s() -> float:
    with open("/proc/stat") as fh:
        line = next(ln for ln in fh if ln.startswith(f"cpu{CPU} "))
    v = [int(x) for x in line.split()[1:9]]
    return (sum(v[:3]) + sum(v[5:8])) / os.sysconf("SC_CLK_TCK")


def _proc_cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as fh:
        rest = fh.read().rsplit(")", 1)[1].split()
    return (int(rest[11]) + int(rest[12])) / os.sysconf("SC_CLK_TCK")


def diagnose_quiet(pid: int, name: str, tmp_path, tries: int = 3) -> dict:
    """A diagnosis of a job with nothing of the test's beside it. On a shared host other work may
    really take its CPU: when cpu.contended fires, the CPU's busy time minus the job's, measured here
    from /proc independently of the agent, must show others took at least the rule's 10%; then the
    test looks again, and fails after `tries` busy windows, naming what ran."""
    for _ in range(tries):
        t0, b0, j0 = time.monotonic(), _cpu_busy_s(), _proc_cpu_s(pid)
        rep = diagnose(pid, name, tmp_path)
        others = (_cpu_busy_s() - b0 - (_proc_cpu_s(pid) - j0)) / (time.monotonic() - t0)
        f = finding(rep, "cpu.contended")
        if f is None:
            return rep
        assert others >= 0.08, f"cpu.contended on a quiet CPU (others measured at {others:.0%} from /proc): {f}"
        time.sleep(1.0)
    # Not a defect of the code: the host never left the job alone (measured above, apart from the agent).
    pytest.skip(f"CPU {CPU} was busy with other work in {tries} windows (others took {others:.0%}, read from "
                f"/proc by the test): {[c['cmdline'][:50] for c in f['details']['competitors']]}")


def ids(rep: dict) -> list[str]:
    return [f["id"] for f in rep["findings"]]


def finding(rep: dict, fid: str) -> dict | None:
    return next((f for f in rep["findings"] if f["id"] == fid), None)


def test_a_job_beside_two_busy_processes_on_its_cpu_is_contended_and_names_them(workload, busy_pair, tmp_path):
    w = job(workload)
    py, sh = busy_pair()
    rep = diagnose(w.pid, "contended", tmp_path)
    assert ids(rep)[0] == "cpu.contended", [(f["id"], f["title"]) for f in rep["findings"]]
    assert "compute.bound" not in ids(rep)
    f = rep["findings"][0]
    named = {c["pid"]: c for c in f["details"]["competitors"]}
    assert py.pid in named and sh.pid in named, named
    assert "while True: pass" in named[py.pid]["cmdline"] and named[py.pid]["user"] == "root"
    if os.geteuid() == 0:
        assert named[sh.pid]["user"] == "nobody" and named[sh.pid]["uid"] == NOBODY
    assert "while :" in named[sh.pid]["cmdline"]
    assert all(named[p]["attribution"] == "inside" for p in (py.pid, sh.pid))
    # Two equal-priority competitors on one CPU: the loop gets about a third of it.
    assert f["details"]["runq_share_training"] > 0.4
    assert f["expected_speedup"] > 1.6 and f["confidence"] in ("high", "medium")
    # The evidence and the fixes name the busiest five (on a shared host other work may outrank the
    # test's pair there; the details list ten).
    top = [c["pid"] for c in f["details"]["competitors"][:5]]
    facts = " ".join(e["fact"] for e in f["evidence"])
    commands = " ".join(fx.get("command") or "" for fx in f["fixes"])
    assert "PSI" in facts and "renice -n 19 -p" in commands
    for p in (py.pid, sh.pid):
        if p in top:
            assert f"PID {p}" in facts and str(p) in commands
    changes = " ".join(fx.get("change") or "" for fx in f["fixes"])
    assert "--exclusive" in changes and "cpu-manager-policy=static" in changes
    if len(os.sched_getaffinity(0)) > 1:
        assert f"taskset -a -cp" in commands
    # The agent's own tree (this diagnosis, whose command names tmp_path, and its py-spy) is never a
    # competitor; another engineer's agent on a shared host may be.
    assert not any(str(tmp_path) in c["cmdline"] or f"--pid {w.pid}" in c["cmdline"]
                   for c in f["details"]["competitors"]), f["details"]["competitors"]
    assert w.alive()


def test_the_same_job_alone_is_compute_bound_and_not_contended(workload, tmp_path):
    w = job(workload)
    rep = diagnose_quiet(w.pid, "alone", tmp_path)
    assert "cpu.contended" not in ids(rep), finding(rep, "cpu.contended")
    assert ids(rep)[:1] == ["compute.bound"], [(f["id"], f["title"]) for f in rep["findings"]]


def test_a_job_oversubscribed_by_its_own_threads_is_not_contended(workload, tmp_path):
    w = job(workload, "--threads", "4")
    rep = diagnose_quiet(w.pid, "oversubscribed", tmp_path)
    assert "cpu.oversubscribed" in ids(rep), [(f["id"], f["title"]) for f in rep["findings"]]
    assert "cpu.contended" not in ids(rep), finding(rep, "cpu.contended")
    assert "compute.bound" not in ids(rep)
