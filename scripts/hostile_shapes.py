"""Start a job of a hostile shape (scripts/hostile_job.py) and run the real agent on it,
measured from outside: wall time, the agent tree's CPU seconds (wait4's rusage: the agent and every
child it reaped) and its peak resident memory (the agent and all its live descendants, sampled with
psutil every 50 ms), with a hard timeout. After each run, `leftovers` lists what the agent may have
left behind: a process still tracing the job, a child of the agent still running, a py-spy still
pointed at the job, a temporary directory of its own.
"""
from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
PY = sys.executable
JOB = REPO / "scripts" / "hostile_job.py"


@dataclass
class Job:
    proc: subprocess.Popen
    lines: list[str] = field(default_factory=list)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def steps(self) -> int:
        done = [ln for ln in self.lines if ln.startswith("PROGRESS steps=")]
        return int(done[-1].split("=", 1)[1]) if done else 0

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        # The job's own forked children (if any) die with it or are reaped by init.
        for p in psutil.process_iter(["ppid", "cmdline"]):
            try:
                if p.info["cmdline"] and str(JOB) in p.info["cmdline"] and p.pid != os.getpid():
                    p.kill()
            except psutil.Error:
                pass


def start_job(*args: str, ready_timeout_s: float = 120.0) -> Job:
    """Start the hostile job with ARGS and wait until its loop runs (its first PROGRESS line)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([PY, str(JOB), *args], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env)
    job = Job(proc)

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            job.lines.append(line.rstrip("\n"))

    threading.Thread(target=pump, daemon=True).start()
    deadline = time.monotonic() + ready_timeout_s
    while time.monotonic() < deadline:
        if any(ln.startswith("PROGRESS ready") for ln in job.lines):
            return job
        if proc.poll() is not None:
            raise RuntimeError("hostile job exited early:\n" + "\n".join(job.lines[-20:]))
        time.sleep(0.05)
    job.stop()
    raise RuntimeError("hostile job did not start in time:\n" + "\n".join(job.lines[-20:]))


@dataclass
class Run:
    argv: list[str]
    rc: int
    timed_out: bool
    wall_s: float
    cpu_s: float               # the agent and every child it reaped (wait4)
    peak_rss_mb: float         # the agent tree's resident memory, sampled from outside
    out: str
    err: str
    descendants_seen: int      # distinct processes seen in the agent's tree
    session: int = 0           # the agent's session id: whatever still runs in it was left behind
    tmpdir: str = ""           # the agent's TMPDIR: whatever is left in it was left behind


def _tree_rss(root: psutil.Process, seen: set[int]) -> float:
    total = 0
    try:
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0.0
    for p in procs:
        try:
            total += p.memory_info().rss
            seen.add(p.pid)
        except psutil.Error:
            pass
    return total / (1 << 20)


def run_agent(*args: str, timeout_s: float = 60.0) -> Run:
    """`python -m trainprobe.agent ARGS`, measured; killed (its whole group) past `timeout_s`."""
    argv = [PY, "-m", "trainprobe.agent", *args]
    tmpdir = tempfile.mkdtemp(prefix="hostile-agent-tmp-")
    env = dict(os.environ, NO_COLOR="1", TMPDIR=tmpdir)
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.monotonic()
        p = subprocess.Popen(argv, cwd=REPO, stdout=out, stderr=err, env=env, start_new_session=True)
        handle = psutil.Process(p.pid)
        peak, seen, timed_out = 0.0, set(), False
        while True:
            pid, status, ru = os.wait4(p.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() - t0 > timeout_s:
                timed_out = True
                os.killpg(p.pid, signal.SIGKILL)
                pid, status, ru = os.wait4(p.pid, 0)
                break
            peak = max(peak, _tree_rss(handle, seen))
            time.sleep(0.05)
        wall = time.monotonic() - t0
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return Run(argv, p.returncode, timed_out, round(wall, 2), round(ru.ru_utime + ru.ru_stime, 3),
                   round(max(peak, ru.ru_maxrss / 1024.0 if not seen else 0.0), 1),
                   out.read().decode(errors="replace"), err.read().decode(errors="replace"), len(seen),
                   session=p.pid, tmpdir=tmpdir)


def _tracers(pid: int) -> list[int]:
    out = []
    for status in glob.glob(f"/proc/{pid}/task/*/status"):
        try:
            with open(status) as fh:
                for line in fh:
                    if line.startswith("TracerPid:"):
                        t = int(line.split()[1])
                        if t:
                            out.append(t)
        except OSError:
            pass
    return out


def leftovers(job_pid: int, run: Run) -> list[str]:
    """What a finished agent run left behind around the job, as lines (empty: nothing)."""
    found = []
    tracers = _tracers(job_pid)
    if tracers:
        found.append(f"job {job_pid} still traced by {sorted(set(tracers))}")
    for p in psutil.process_iter(["name", "cmdline"]):
        try:
            cmd = p.info["cmdline"] or []
            if os.getsid(p.pid) == run.session:
                found.append(f"a process of the agent's session still running: pid {p.pid} {' '.join(cmd)[:120]}")
            elif (p.info["name"] == "py-spy" or (cmd and cmd[0].endswith("py-spy"))) and str(job_pid) in cmd:
                found.append(f"py-spy still pointed at the job: pid {p.pid} {' '.join(cmd)[:120]}")
        except (psutil.Error, OSError):
            pass
    if run.tmpdir and os.path.isdir(run.tmpdir):
        left = os.listdir(run.tmpdir)
        if left:
            found.append(f"left in the agent's TMPDIR: {sorted(left)[:10]}")
        else:
            os.rmdir(run.tmpdir)
    return found
