"""Jobs of hostile shapes, diagnosed by the real agent (trainprobe runs as root; the job is untrusted):
10,000 threads, a loop 5,000 frames deep, a 1 MB command line, 100 children forked a second.

Each run has a hard timeout and is measured from outside (scripts/hostile_shapes.py); after it,
nothing may be left attached to the job or running in the agent's session or its TMPDIR, the job must
still run, the agent tree's peak RSS (measured, and as the report says) must stay within the 150 MB
budget, and the report must keep what the shape did not break. Short windows keep each case to a
few seconds; benchmarks/bench_hostile_shapes.py prints the same measurements as a table.
"""
from __future__ import annotations

import json
import os
import tarfile
import threading
import time

import pytest

from scripts import hostile_shapes as hostile
from trainprobe.agent import cost
from trainprobe.probes.base import Capture, JobShape, Recorder, WatchSpec
from trainprobe.probes.parsers import procfs
from trainprobe.probes.process import ProcessProbe
from trainprobe.probes.pyspy import PySpyProbe

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: trainprobe attaches to the job as root")

RSS_BUDGET_MB = cost.BUDGET_RSS_MB
TIMEOUT_S = 45.0


@pytest.fixture
def job():
    started = []

    def make(*args: str) -> hostile.Job:
        j = hostile.start_job(*args)
        started.append(j)
        return j

    yield make
    for j in started:
        j.stop()


def _diagnose(j: hostile.Job, tmp_path, duration: float = 2.0) -> tuple[hostile.Run, dict]:
    bundle, html = tmp_path / "B.tar.gz", tmp_path / "H.html"
    r = hostile.run_agent("diagnose", "--pid", str(j.pid), "--duration", str(duration), "--json",
                          "--save", str(bundle), "--html", str(html), timeout_s=TIMEOUT_S)
    assert not r.timed_out, f"diagnose ran past {TIMEOUT_S} s"
    assert r.rc == 0, r.err[-2000:]
    assert hostile.leftovers(j.pid, r) == []
    assert j.proc.poll() is None, "the job died under diagnosis"
    rep = json.loads(r.out)
    assert r.peak_rss_mb <= RSS_BUDGET_MB, r.peak_rss_mb
    assert rep["overhead"]["agent_max_rss_mb"] <= RSS_BUDGET_MB
    assert bundle.stat().st_size < 1 << 20 and html.stat().st_size < 1 << 20
    return r, rep


def _probes(rep: dict) -> dict[str, dict]:
    return {p["name"]: p for p in rep["probes"]}


def _bundle_artifact(path, probe: str, name: str) -> dict:
    with tarfile.open(path) as tf:
        for m in tf.getmembers():
            if m.isfile() and probe in m.name and m.name.endswith(".json"):
                doc = json.load(tf.extractfile(m))
                if isinstance(doc, dict) and name in doc.get("artifacts", {}):
                    return json.loads(doc["artifacts"][name])
    raise AssertionError(f"no {probe} {name} in {path}")


def test_ten_thousand_threads(job, tmp_path):
    # 64 KiB stacks: the job builds its 10,000 idle threads in about a second.
    j = job("--threads", "10000")
    r, rep = _diagnose(j, tmp_path)
    assert rep["target"]["threads"] >= 10000
    probes = _probes(rep)
    # The process probe reads a bounded number of threads: it finished (it timed out at 10 s before).
    assert probes["process"]["status"] == "ok", probes["process"]
    assert probes["placement"]["status"] == "ok", probes["placement"]
    # py-spy cannot read 10,000 threads within any budget (nor at all past 4096): left out, saying why.
    assert probes["pyspy"]["status"] == "skipped" and "10001 threads" in probes["pyspy"]["reason"]
    snaps = _bundle_artifact(tmp_path / "B.tar.gz", "process", "snapshots.json")
    main = snaps["start"]["procs"][str(j.pid)]
    assert len(main["tasks"]) <= procfs.MAX_THREADS_READ and main["ps"]["threads_not_read"] > 9000
    assert str(j.pid) in main["tasks"]                     # the main thread is always read


def test_five_thousand_frames_deep(job, tmp_path):
    j = job("--recurse", "5000")
    r, rep = _diagnose(j, tmp_path)
    probes = _probes(rep)
    # py-spy gives up on a stack deeper than 4096 frames; the rest of the report stands.
    assert probes["pyspy"]["status"] in ("ok", "failed"), probes["pyspy"]
    assert probes["pyspy"]["reason"] is None or "\n" not in probes["pyspy"]["reason"]
    assert probes["process"]["status"] == "ok" and rep["target"]["threads"] == 1
    assert rep["target"]["python"]
    f = hostile.run_agent("flamegraph", "--input", str(tmp_path / "B.tar.gz"), "-o", str(tmp_path / "F.svg"),
                          timeout_s=TIMEOUT_S)
    if probes["pyspy"]["status"] == "failed":              # no stacks: one line, bad input
        assert f.rc == 2 and len(f.err.strip().splitlines()) == 1, f.err
    else:
        assert f.rc == 0 and (tmp_path / "F.svg").stat().st_size < 4 << 20
    assert hostile.leftovers(j.pid, f) == []


def test_a_one_megabyte_command_line(job, tmp_path):
    pad = ["--pad=" + "x" * (4096 - 7) for _ in range(256)]
    j = job(*pad)
    with open(f"/proc/{j.pid}/cmdline", "rb") as fh:
        assert len(fh.read()) > 1 << 20
    r, rep = _diagnose(j, tmp_path)
    cmd = rep["target"]["cmdline"]
    assert len(cmd) <= procfs.MAX_ARGV_CHARS + 100 and "more arguments" in cmd and "characters not shown" in cmd
    assert cmd.startswith(hostile.PY) and "hostile_job.py" in cmd
    assert len(r.out) < 200_000, len(r.out)


def test_a_job_forking_a_hundred_children_a_second(job, tmp_path):
    j = job("--forks-per-s", "100", "--child-life-s", "0.05")
    r, rep = _diagnose(j, tmp_path)
    assert _probes(rep)["process"]["status"] == "ok"
    assert len(rep["target"]["workers"]) <= procfs.MAX_PROCESSES_FOLLOWED
    # Not chased: the agent's tree never held more than itself and its py-spy samplers.
    assert r.descendants_seen <= 6, r.descendants_seen


def test_forked_children_past_the_cap_are_counted_not_followed(job, monkeypatch):
    """The process probe, in this process, over a job keeping ~100 children alive: with the cap at
    20 it follows 20 and counts the others."""
    j = job("--forks-per-s", "100", "--child-life-s", "1.0")
    time.sleep(1.0)
    assert len(procfs.descendants_of(j.pid, limit=10)) == 10
    monkeypatch.setattr(procfs, "MAX_PROCESSES_FOLLOWED", 20)
    cap = Capture("process")
    ProcessProbe().capture(WatchSpec(pid=j.pid, window_s=1.5), Recorder(cap, threading.Event()),
                           time.monotonic() + 1.5)
    ev = ProcessProbe.parse(cap)
    assert len(ev["processes"]) <= 20
    assert cap.meta["processes_not_followed"] > 20


def test_children_of_a_many_threaded_process_come_from_one_host_scan(job):
    import psutil
    j = job("--threads", "2000", "--forks-per-s", "20", "--child-life-s", "3")
    time.sleep(1.0)
    assert procfs.thread_count("/", j.pid) >= 2000
    kids = set(procfs.children_of(j.pid))
    truth = {c.pid for c in psutil.Process(j.pid).children()}
    assert kids and len(kids ^ truth) <= 2                 # children come and go between the two reads
    tids, total = procfs.task_ids("/", j.pid)
    assert len(tids) == procfs.MAX_THREADS_READ and tids[0] == str(j.pid) and total >= 2000


# -- units of the bounds ---------------------------------------------------------------------------

def test_a_long_argv_is_kept_whole_argument_and_redacted_before_the_cut():
    secret = "ghp_" + "A1b2" * 9
    argv = ["python", "train.py", f"--hf-token={secret}"] + ["--x=" + "y" * 100] * 200
    out = procfs.bounded_argv(argv, max_chars=1000)
    assert out[:2] == ["python", "train.py"] and secret not in " ".join(out)
    assert out[-1].startswith("...[") and sum(len(a) for a in out[:-1]) <= 1000
    assert all(a == "--x=" + "y" * 100 for a in out[3:-1])          # whole arguments only
    # One argument longer than the allowance, a token straddling the cut: redacted first, then cut.
    long_one = procfs.bounded_argv(["--note=" + "z" * 990 + secret + "z" * 5000], max_chars=1000)
    assert "ghp_" not in long_one[0] and len(long_one[0]) == 1000 and "characters not shown" in long_one[1]
    assert procfs.bounded_argv(["python", "a.py"]) == ["python", "a.py"]


def test_the_plan_leaves_py_spy_out_when_its_least_sampling_is_out_of_proportion():
    job_ = JobShape(pid=1, processes=(1,), threads=10001, cpu_capacity=2.0, cpu_capacity_basis="2 CPUs")
    p = cost.plan(WatchSpec(pid=1, window_s=3.0), [PySpyProbe()], job_)
    assert "pyspy" in p.skipped and "10001 threads" in p.skipped["pyspy"] and "--rate" in p.skipped["pyspy"]
    # A usual job on a short window keeps py-spy at its minimum, over the budget, and says so.
    small = cost.plan(WatchSpec(pid=1, window_s=1.0), [PySpyProbe()],
                      JobShape(pid=1, processes=(1,), threads=8, cpu_capacity=2.0, cpu_capacity_basis="2 CPUs"))
    assert "pyspy" in small.probes and small.over_budget
