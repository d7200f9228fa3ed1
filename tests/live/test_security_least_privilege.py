"""Least privilege, shown: `diagnose` run by an unprivileged user holding only CAP_SYS_PTRACE,
CAP_PERFMON and CAP_BPF (ambient capabilities, through setpriv) against another user's job.

What works that way and what needs one more capability is in docs/security.md; these tests keep
that page true.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import click
import pytest

from tests.helpers import REPO

NOBODY = 65534
JOB_UID = 12345
BASE_CAPS = "+sys_ptrace,+perfmon,+bpf"
SITE = str(Path(click.__file__).resolve().parent.parent)
VENV_BIN = str(Path(sys.executable).parent)

JOB = "def step():\n    return sum(range(20000))\nwhile True:\n    step()\n"


def _system_python() -> str | None:
    """A python3 that another user may run, of the venv's version (so its site-packages load)."""
    exe = "/usr/bin/python3"
    if not os.path.exists(exe):
        return None
    r = subprocess.run([exe, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True, text=True)
    return exe if r.stdout.strip() == str(tuple(sys.version_info[:2])) else None


@pytest.fixture
def other_users_job():
    if os.geteuid() != 0:
        pytest.skip("needs root to start a job as one user and trainprobe as another")
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is not installed")
    exe = _system_python()
    if exe is None:
        pytest.skip("no system python3 of the venv's version for an unprivileged user")
    d = tempfile.mkdtemp(prefix="trainprobe-lp-", dir="/tmp")
    os.chmod(d, 0o755)
    job = os.path.join(d, "job.py")
    with open(job, "w") as fh:
        fh.write(JOB)
    os.chmod(job, 0o644)
    out = os.path.join(d, "out")
    os.mkdir(out)
    os.chown(out, NOBODY, NOBODY)
    proc = subprocess.Popen([exe, job], user=JOB_UID, group=JOB_UID, extra_groups=[], cwd="/")
    try:
        yield proc, exe, out
    finally:
        proc.kill()
        proc.wait()
        shutil.rmtree(d, ignore_errors=True)


def _diagnose_as_nobody(exe: str, pid: int, caps: str, out: str) -> tuple[subprocess.CompletedProcess, dict]:
    env = {"PATH": f"{VENV_BIN}:/usr/bin:/bin:/usr/sbin:/sbin", "PYTHONPATH": f"{REPO}:{SITE}", "HOME": "/tmp",
           "NO_COLOR": "1"}
    argv = ["setpriv", "--reuid", str(NOBODY), "--regid", str(NOBODY), "--clear-groups",
            "--inh-caps", caps, "--ambient-caps", caps, exe, "-m", "trainprobe.agent", "diagnose", "--pid", str(pid),
            "--duration", "2", "--probes", "process,pyspy,perfstat,placement,topology,gil,sched,syscalls",
            "--json", "--save", os.path.join(out, "b.tar.gz")]
    r = subprocess.run(argv, capture_output=True, text=True, env=env, cwd="/tmp", timeout=120)
    rep = json.loads(r.stdout) if r.stdout.strip() else {}
    return r, rep


def _statuses(rep: dict) -> dict[str, tuple[str, str | None]]:
    return {p["name"]: (p["status"], p["reason"]) for p in rep.get("probes", [])}


@pytest.mark.live
def test_ptrace_perfmon_bpf_are_enough_for_the_core_probes(other_users_job):
    proc, exe, out = other_users_job
    r, rep = _diagnose_as_nobody(exe, proc.pid, BASE_CAPS, out)
    assert r.returncode == 0, r.stderr
    st = _statuses(rep)
    for name in ("process", "pyspy", "perfstat", "placement", "topology", "gil"):
        assert st[name][0] == "ok", (name, st[name])
    # tracefs is root-only: the eBPF probes say which capability is missing, they do not fail obscurely.
    for name in ("sched", "syscalls"):
        assert st[name][0] in ("ok", "skipped"), (name, st[name])
        if st[name][0] == "skipped" and "root-only" in (st[name][1] or ""):
            assert "CAP_DAC_READ_SEARCH" in st[name][1]
    # What it wrote belongs to it and is private.
    b = os.stat(os.path.join(out, "b.tar.gz"))
    assert (b.st_uid, b.st_mode & 0o777) == (NOBODY, 0o600)
    assert proc.poll() is None


@pytest.mark.live
def test_dac_read_search_adds_the_ebpf_probes(other_users_job):
    from tests.bcc_helpers import READY
    if not READY.ok:
        pytest.skip(f"eBPF unavailable here: {READY.reason}")
    proc, exe, out = other_users_job
    r, rep = _diagnose_as_nobody(exe, proc.pid, BASE_CAPS + ",+dac_read_search", out)
    assert r.returncode == 0, r.stderr
    st = _statuses(rep)
    for name in ("pyspy", "sched", "syscalls"):
        assert st[name][0] == "ok", (name, st[name])


@pytest.mark.live
def test_without_ptrace_the_answer_is_exit_4(other_users_job):
    proc, exe, out = other_users_job
    r, _ = _diagnose_as_nobody(exe, proc.pid, "+perfmon,+bpf", out)
    assert r.returncode == 4, r.stderr
    assert "CAP_SYS_PTRACE" in r.stderr and "Traceback" not in r.stderr
