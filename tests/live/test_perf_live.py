"""The perf stat probe attached to real processes started by the tests."""
import json
import os
import subprocess
import sys

import pytest

from trainprobe.agent.session import run_session
from trainprobe.probes.parsers import procfs
from trainprobe.probes.base import WatchSpec
from trainprobe.probes.perfstat import PerfStatProbe, perf_binary, read_pmu
from tests.helpers import PY, REPO, run_cli

pytestmark = pytest.mark.live

needs_perf = pytest.mark.skipif(perf_binary() is None, reason="perf is not installed on this host")
HAS_PMU = bool(read_pmu("/")["core_pmus"])


def perf_sessions_attached_to(pid):
    """perf processes still running against `pid` (nothing may stay attached after a window)."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        cmd = procfs.try_read_text("/", f"proc/{name}/cmdline") or ""
        args = cmd.split("\0")
        if args and args[0].endswith("perf") and "stat" in args and any(str(pid) in a.split(",") for a in args):
            out.append(int(name))
    return out


@needs_perf
def test_probe_on_a_training_job_and_its_workers(workload):
    w = workload("--seconds", "60", "--num-workers", "2", "--sample-work", "3000", warmup_lines=2)
    workers = sorted(procfs.children_of(w.pid))
    assert len(workers) == 2
    res = run_session(WatchSpec(pid=w.pid, window_s=3.0), [PerfStatProbe()], progress=lambda m: None)
    cap = res.captures[0]
    assert cap.status == "ok", cap.reason
    ev = PerfStatProbe.parse(cap)
    assert ev["sessions"]["main"]["status"] == "ok" and ev["sessions"]["workers"]["status"] == "ok"
    assert ev["sessions"]["workers"]["pids"] == workers
    assert ev["sessions"]["main"]["intervals"] >= 5
    procs = {p["pid"]: p for p in ev["processes"]}
    assert set(procs) == {w.pid, *workers}
    for p in procs.values():
        # software counters count everywhere, PMU or not
        assert p["task_clock_s"] > 0 and p["cpu_cores"] > 0, p
        assert p["context_switches"] > 0 and p["context_switches_per_s"] > 0, p
        assert p["major_faults"] is not None and p["cpu_migrations"] is not None
    tt = ev["training_thread"]
    assert tt["tid"] == w.pid and tt["task_clock_s"] >= max(t["task_clock_s"] for t in ev["threads"]) - 1e-9
    if HAS_PMU:
        assert ev["groups"]["main"]["ipc"] is not None
    else:
        assert ev["hardware"]["available"] is False
        assert ev["events"]["instructions"] == "not supported" and ev["events"]["cycles"] == "not supported"
        assert "PMU" in ev["hardware"]["reason"] and "Software counters are kept" in ev["hardware"]["reason"]
        assert cap.reason.startswith("software counters only")
    assert cap.meta["overhead"]["perf_cpu_seconds"] >= 0
    assert perf_sessions_attached_to(w.pid) == [] and w.alive()


@needs_perf
def test_diagnose_report_is_complete_with_the_perf_probe(workload):
    w = workload("--seconds", "60", "--num-workers", "1", "--sample-work", "9000", warmup_lines=2)
    r = run_cli("diagnose", "--pid", str(w.pid), "--duration", "3", "--json")
    assert r.rc == 0, r.err
    rep = r.json()
    probes = {p["name"]: p for p in rep["probes"]}
    assert probes["process"]["status"] == "ok" and probes["pyspy"]["status"] == "ok"
    rule = next(x for x in rep["rules"] if x["finding"] == "cpu.memory_bound")
    if HAS_PMU:
        assert probes["perfstat"]["status"] == "ok"
        assert "perfstat" in rep["overhead"]["probes"]
    else:
        # Without a PMU perf stat would count only software events, which /proc already gives: the
        # budget leaves it out and says why; the rule that needs its hardware counters says so too.
        assert probes["perfstat"]["status"] == "skipped"
        assert probes["perfstat"]["reason"].startswith("no hardware PMU") and "--probes perfstat" in probes["perfstat"]["reason"]
        assert rule["status"] == "skipped"
        assert "cpu.memory_bound" not in [f["id"] for f in rep["findings"]]
    assert rep["findings"] and rep["findings"][0]["id"] == "dataloader.starved"
    assert perf_sessions_attached_to(w.pid) == [] and w.alive()


@needs_perf
@pytest.mark.skipif(HAS_PMU, reason="the no-PMU path: this host has a PMU")
def test_without_a_pmu_perf_stat_still_runs_when_named(workload):
    w = workload("--seconds", "60", "--num-workers", "0")
    r = run_cli("diagnose", "--pid", str(w.pid), "--duration", "2", "--json", "--probes", "process,perfstat")
    assert r.rc == 0, r.err
    rep = r.json()
    probes = {p["name"]: p for p in rep["probes"]}
    assert probes["perfstat"]["status"] == "ok" and "software counters only" in probes["perfstat"]["reason"]
    assert perf_sessions_attached_to(w.pid) == [] and w.alive()


def test_missing_perf_is_named_with_the_fix_and_the_report_goes_on(workload):
    w = workload("--seconds", "60", "--num-workers", "0")
    r = run_cli("diagnose", "--pid", str(w.pid), "--duration", "2", "--json", env={"PATH": "/nonexistent"})
    assert r.rc == 0, r.err
    probes = {p["name"]: p for p in r.json()["probes"]}
    assert probes["perfstat"]["status"] == "skipped"
    assert probes["perfstat"]["reason"].startswith("perf not found on PATH")
    assert "linux-perf" in probes["perfstat"]["reason"] and "linux-tools" in probes["perfstat"]["reason"]
    assert probes["pyspy"]["status"] == "ok"
    assert r.json()["findings"]


UNPRIVILEGED = r"""
import json, os, subprocess, sys, time
from trainprobe.agent.session import run_session
from trainprobe.probes.base import WatchSpec
from trainprobe.probes.perfstat import PerfStatProbe
busy = subprocess.Popen([sys.executable, "-c",
    "import threading, time\nthreading.Thread(target=lambda: [time.sleep(0.01) for _ in range(10**6)], daemon=True).start()\n"
    "t = time.time()\nwhile time.time() - t < 20: sum(range(10000))"])
try:
    time.sleep(0.5)
    res = run_session(WatchSpec(pid=busy.pid, window_s=1.5), [PerfStatProbe()], progress=lambda m: None)
    cap = res.captures[0]
    other = PerfStatProbe().check(WatchSpec(pid=int(sys.argv[1]), window_s=1.0))
    print(json.dumps({"status": cap.status, "reason": cap.reason, "ev": PerfStatProbe.parse(cap),
                      "other_ok": other.ok, "other_reason": other.reason}))
finally:
    busy.kill()
"""


@needs_perf
def test_unprivileged_user_counts_user_space_only_and_may_not_watch_others(workload):
    if os.geteuid() != 0:
        pytest.skip("needs root to drop to another user")
    paranoid = (procfs.try_read_text("/", "proc/sys/kernel/perf_event_paranoid") or "").strip()
    if paranoid != "2":
        pytest.skip(f"kernel.perf_event_paranoid is {paranoid}, this test reads the behaviour of 2")
    exe = "/usr/bin/python3"
    if not os.path.exists(exe):
        pytest.skip("no system python3 to run as an unprivileged user (the venv lives under /root)")
    w = workload("--seconds", "60", "--num-workers", "0")
    # The probes' own dependencies (psutil) come from the project's venv, as in test_bad_input.
    site = [p for p in sys.path if p.endswith("site-packages") and p.startswith(str(REPO))]
    p = subprocess.run([exe, "-c", UNPRIVILEGED, str(w.pid)], cwd="/tmp", capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO)] + site), HOME="/tmp",
                                PATH="/usr/bin:/bin"),
                       user=65534, group=65534, extra_groups=[], timeout=60)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["status"] == "ok", out["reason"]
    ev = out["ev"]
    assert ev["user_only"] is True                    # perf fell back to cycles:u, task-clock:u, ...
    tt = ev["training_thread"]
    assert tt["task_clock_s"] > 0.02
    assert tt["context_switches"] is None and tt["page_faults"] is None   # kernel-side: not measurable
    assert out["other_ok"] is False and "belongs to uid 0" in out["other_reason"]
    assert "CAP_PERFMON" in out["other_reason"]
    assert w.alive()


@needs_perf
def test_a_target_that_exits_mid_window_keeps_what_was_counted():
    import threading
    p = subprocess.Popen([sys.executable, "-c", "import time\nt = time.time()\nwhile time.time() - t < 1.2: pass"])
    reaper = threading.Thread(target=p.wait)      # reaped at exit, as a job's launcher would
    reaper.start()
    res = run_session(WatchSpec(pid=p.pid, window_s=4.0), [PerfStatProbe()], progress=lambda m: None)
    reaper.join(timeout=10)
    cap = res.captures[0]
    assert cap.status == "ok", cap.reason
    ev = PerfStatProbe.parse(cap)
    assert 1 <= ev["sessions"]["main"]["intervals"] < 10          # perf stopped with its target
    assert ev["training_thread"]["task_clock_s"] > 0.02
    assert perf_sessions_attached_to(p.pid) == []


@needs_perf
def test_a_target_gone_before_perf_attaches_is_target_gone():
    import threading
    import time

    from trainprobe.probes.base import Capture, Recorder
    from trainprobe.probes.errors import TargetGone
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait(timeout=10)
    rec = Recorder(Capture("perfstat"), threading.Event())
    with pytest.raises(TargetGone):
        PerfStatProbe().capture(WatchSpec(pid=p.pid, window_s=1.0), rec, time.monotonic() + 1.0)
    assert rec.live_children() == []
