"""Bad input gets one clear line on stderr and the contract's exit code; never a traceback."""
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from tests.helpers import PY, REPO, interruptible, run_cli


def one_clean_line(r):
    assert "Traceback" not in r.err and "Traceback" not in r.out
    lines = [ln for ln in r.err.splitlines() if ln.strip()]
    assert lines, "expected a message on stderr"
    return lines[-1]


def free_pid():
    pid = 4_000_000
    while os.path.exists(f"/proc/{pid}"):
        pid -= 1
    return pid


def test_no_such_pid():
    r = run_cli("diagnose", "--pid", str(free_pid()), "--duration", "1")
    assert r.rc == 2
    assert "no process with PID" in one_clean_line(r)


def test_not_a_python_process():
    p = subprocess.Popen(["sleep", "30"])
    try:
        r = run_cli("diagnose", "--pid", str(p.pid), "--duration", "1")
        assert r.rc == 2
        assert "not a Python process" in one_clean_line(r)
    finally:
        p.kill()
        p.wait()


def test_zombie():
    # A parent that never reaps its child leaves a zombie behind.
    code = "import os,time\npid=os.fork()\nif pid==0: os._exit(0)\nprint(pid,flush=True)\ntime.sleep(30)"
    parent = subprocess.Popen([PY, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        zpid = int(parent.stdout.readline())
        time.sleep(0.3)
        r = run_cli("diagnose", "--pid", str(zpid), "--duration", "1")
        assert r.rc == 2
        assert "zombie" in one_clean_line(r)
    finally:
        parent.kill()
        parent.wait()


def test_kernel_thread():
    r = run_cli("diagnose", "--pid", "2", "--duration", "1")
    assert r.rc == 2
    assert "kernel thread" in one_clean_line(r)


def test_invalid_option():
    r = run_cli("diagnose", "--pid", "1", "--duration", "-3")
    assert r.rc == 2 and "Traceback" not in r.err
    r = run_cli("diagnose", "--pid", "1", "--probes", "nosuchprobe")
    assert r.rc == 2 and "unknown probe" in r.err


@pytest.mark.live
def test_target_exits_during_the_window(workload):
    # A 30 s window for a job with 2.5 s left: it dies in the window's first half (exit 3) however
    # long the loaded machine takes to start the agent's probes or to let the job exit (at a 10 s
    # window it once lived past 5 s, and half a window of evidence is a report, exit 0).
    w = workload("--seconds", "2.5", "--num-workers", "0")
    r = run_cli("diagnose", "--pid", str(w.pid), "--duration", "30", "--json")
    assert r.rc == 3, r.err
    assert "Traceback" not in r.err
    rep = r.json()                              # what was gathered before it died is still reported
    assert rep["window"]["seconds"] < 15
    assert any("exited" in n for n in rep["notes"])
    assert {p["name"]: p["status"] for p in rep["probes"]}["process"] == "ok"


def _unprivileged_python():
    """Debian's python3 runs as any user (the venv's interpreter lives under /root)."""
    exe = "/usr/bin/python3"
    if not os.path.exists(exe):
        return None
    out = subprocess.run([exe, "-c", "import sys;print(sys.version_info[:2])"], capture_output=True, text=True)
    return exe if out.stdout.strip() == str(sys.version_info[:2]) else None


@pytest.mark.live
def test_no_permission_to_attach(workload):
    if os.geteuid() != 0:
        pytest.skip("needs root to start a root-owned target and drop to another user")
    exe = _unprivileged_python()
    if exe is None:
        pytest.skip("no system python3 of the same version to run as an unprivileged user")
    w = workload("--seconds", "60", "--sample-work", "0")
    site = [p for p in sys.path if p.endswith("site-packages") and os.access(p, os.R_OK)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO)] + site), NO_COLOR="1", HOME="/tmp")
    p = subprocess.run([exe, "-m", "trainprobe.agent", "diagnose", "--pid", str(w.pid), "--duration", "1"], cwd="/tmp",
                       capture_output=True, text=True, env=env, user=65534, group=65534, extra_groups=[],
                       timeout=60)
    assert p.returncode == 4, p.stderr
    assert "Traceback" not in p.stderr
    assert "sudo" in p.stderr.strip().splitlines()[-1]
    assert w.alive()


@pytest.mark.live
def test_ctrl_c_reports_what_was_gathered_and_leaves_nothing_attached(workload):
    w = workload("--seconds", "60", "--num-workers", "0")
    p = subprocess.Popen([PY, "-m", "trainprobe.agent", "diagnose", "--pid", str(w.pid), "--duration", "30", "--json"],
                         cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=dict(os.environ, NO_COLOR="1"), preexec_fn=interruptible)
    time.sleep(4)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=30)
    assert p.returncode == 130, err      # the contract: Ctrl-C is 130, with the report of what was gathered
    assert "Traceback" not in err
    import json
    rep = json.loads(out)
    assert any("interrupted" in n for n in rep["notes"])
    assert rep["window"]["seconds"] < 15
    assert _attached_to(w.pid) == []
    assert w.alive()


def _attached_to(pid):
    """Processes other than the target's own family that name the target's PID (py-spy, perf)."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as fh:
                args = fh.read().split(b"\0")
        except OSError:
            continue
        if str(pid).encode() in args and any(b"py-spy" in a or a.endswith(b"perf") for a in args):
            out.append(int(name))
    return out


@pytest.mark.live
def test_do_no_harm(workload):
    """The target keeps running at its pace, is never stopped, and nothing stays attached."""
    w = workload("--seconds", "60", "--num-workers", "0", warmup_lines=2)
    before_affinity = os.sched_getaffinity(w.pid)
    sysctls = {p: open(p).read() for p in ("/proc/sys/kernel/perf_event_paranoid",) if os.path.exists(p)}
    r = run_cli("diagnose", "--pid", str(w.pid), "--duration", "3", "--json")
    assert r.rc == 0, r.err
    assert w.alive()
    with open(f"/proc/{w.pid}/stat") as fh:
        state = fh.read().rsplit(")", 1)[1].split()[0]
    assert state in ("R", "S"), state                # never left stopped (T) or traced (t)
    with open(f"/proc/{w.pid}/status") as fh:
        tracer = [ln for ln in fh if ln.startswith("TracerPid")][0].split()[1]
    assert tracer == "0"
    assert _attached_to(w.pid) == []
    assert os.sched_getaffinity(w.pid) == before_affinity
    assert {p: open(p).read() for p in sysctls} == sysctls
    n = len(w.rates())
    time.sleep(2.5)
    assert len(w.rates()) > n                        # still making progress
