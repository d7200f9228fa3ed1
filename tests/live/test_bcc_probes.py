"""The bcc probes attached to real processes: what they measure, that they follow new workers, that
nothing stays attached (normal end, Ctrl-C, target death, kill -9), and the no-eBPF path."""
import json
import os
import signal
import subprocess
import threading
import time

import pytest

from trainprobe.probes.parsers import procfs
from trainprobe.probes.sched import SchedProbe
from trainprobe.probes.syscalls import SyscallsProbe
from tests.bcc_helpers import make_tiny_files, needs_ebpf, our_programs, spawn_script, wait_no_programs
from tests.helpers import PY, REPO, interruptible, run_probe

pytestmark = [pytest.mark.live, needs_ebpf]

SPINNERS = """
import hashlib, threading
buf = b"x" * (1 << 20)
def spin():
    while True:
        hashlib.sha256(buf).digest()          # releases the GIL: a real busy OS thread each
for i in range(%d):
    threading.Thread(target=spin, name=f"spin{i}", daemon=True).start()
print("READY", flush=True)
threading.Event().wait()
"""

FORKER = """
import multiprocessing as mp, threading, time, hashlib
def child():
    t = threading.Thread(target=lambda: [hashlib.sha256(b"y" * 65536).digest() for _ in range(40000)])
    t.start()
    end = time.time() + 1.2
    while time.time() < end:
        pass
    t.join()
if __name__ == "__main__":
    mp.set_start_method("fork")
    print("READY", flush=True)
    time.sleep(0.8)
    while True:
        p = mp.Process(target=child)
        p.start()
        p.join()
        time.sleep(0.3)
"""

READER = """
import os, sys, time
d = sys.argv[1]
files = sorted(os.path.join(d, f) for f in os.listdir(d))
print("READY", flush=True)
i = 0
while True:
    for _ in range(200):
        with open(files[i % len(files)], "rb") as fh:
            fh.read(4096)
        i += 1
    time.sleep(0.01)
"""


def schedstat_wait(pid, tid):
    s = procfs.parse_schedstat(procfs.try_read_text("/", f"proc/{pid}/task/{tid}/schedstat"))
    return s["wait_s"] if s else None


def test_sched_probe_measures_runqueue_delay_and_agrees_with_schedstat():
    p = spawn_script(SPINNERS % 6)           # 6 busy threads on a 2-CPU machine
    try:
        tids = [int(t) for t in os.listdir(f"/proc/{p.pid}/task") if int(t) != p.pid]
        w0 = {t: schedstat_wait(p.pid, t) for t in tids}
        t0 = time.monotonic()
        cap, ev = run_probe(SchedProbe(), p.pid, 3.0)
        elapsed = time.monotonic() - t0
        w1 = {t: schedstat_wait(p.pid, t) for t in tids}
    finally:
        p.kill()
        p.wait()
    rows = {r["tid"]: r for r in ev["threads"]}
    spinners = [rows[t] for t in tids if t in rows]
    assert len(spinners) == 6
    ncpu = len(procfs.cpus_online())
    for r in spinners:
        assert r["runq_waits"] > 10 and r["runq_p50_us"] <= r["runq_p99_us"] <= r["runq_max_us"] * 1.26
        if ncpu < 6:
            assert r["runq_share"] > 0.2, r
    # The kernel's own counter over a slightly longer interval gives the same share.
    bcc_share = sum(r["runq_share"] for r in spinners) / 6
    stat_share = sum(w1[t] - w0[t] for t in tids) / elapsed / 6
    assert abs(bcc_share - stat_share) < 0.2, (bcc_share, stat_share)
    assert ev["main_process"]["runnable_threads_mean"] > min(ncpu, 6) * 0.7
    oh = cap.meta["overhead"]
    assert oh["tracepoint_events"] > 0 and oh["compile_seconds"] > 0
    assert oh["bpf_ns_per_event"] is None or oh["bpf_ns_per_event"] > 0


def test_sched_probe_follows_workers_that_come_and_go():
    p = spawn_script(FORKER)
    try:
        _cap, ev = run_probe(SchedProbe(), p.pid, 3.5)
    finally:
        p.kill()
        p.wait()
    children = [pr for pr in ev["processes"] if pr["pid"] != p.pid]
    assert children, ev["processes"]
    # Each worker lived ~1.2 s inside the window and was busy: it was watched from its start.
    assert max(c["oncpu_seconds"] for c in children) > 0.3
    assert any(c["threads"] >= 2 for c in children)        # its own thread was followed too


def test_programs_are_loaded_only_while_the_probe_runs():
    p = spawn_script(SPINNERS % 1)
    seen = []
    try:
        th = threading.Thread(target=lambda: seen.append(run_probe(SchedProbe(), p.pid, 2.5)))
        th.start()
        names = set()
        deadline = time.monotonic() + 20
        while th.is_alive() and time.monotonic() < deadline and not names:
            names = {x["name"] for x in our_programs()}
            time.sleep(0.2)
        th.join(30)
    finally:
        p.kill()
        p.wait()
    assert {"trainprb_switch", "trainprb_wake", "trainprb_wnew"} <= names
    assert seen and seen[0][1]["threads"]
    assert wait_no_programs(5) == []


def test_syscall_probe_counts_opens_sizes_and_directory(tmp_path):
    d = make_tiny_files(tmp_path / "tiny", n=500, size=200)
    p = spawn_script(READER.replace("sys.argv[1]", repr(str(d))))
    try:
        cap, ev = run_probe(SyscallsProbe(), p.pid, 2.5)
    finally:
        p.kill()
        p.wait()
    main = ev["main"]
    assert main["opens"] > 500
    assert main["mean_file_read_bytes"] == pytest.approx(200, abs=1)
    # Each open(...).read(4096) of a 200-byte file is one read of data and one at end of file.
    assert main["file_reads"]["eof_reads"] == pytest.approx(main["opens"], rel=0.05)
    assert main["files_closed"] == pytest.approx(main["opens"], rel=0.05)
    assert main["open_dirs"][0]["dir"] == str(d)
    assert 0 < main["file_syscall_share"] <= main["file_open_to_close_share"] < 1
    oh = cap.meta["overhead"]
    assert oh["traced_seconds"] >= 2.0
    assert oh["host_syscalls_per_second"] >= oh["target_syscalls_per_second"] * 0.9 > 0
    assert oh["tax_ns_per_syscall_unwatched"] is not None and oh["tax_ns_per_syscall_watched"] is not None
    assert 0 <= oh["host_cpu_fraction"] < 1
    # The calibration dd is not counted as part of the target.
    assert {pr["pid"] for pr in ev["processes"]} == {p.pid}


def test_syscall_window_is_bounded():
    p = spawn_script(SPINNERS % 1)
    try:
        cap, _ev = run_probe(SyscallsProbe(), p.pid, 6.0, syscalls_max_s=1.0, syscalls_calibrate=False)
    finally:
        p.kill()
        p.wait()
    assert 0.9 <= cap.meta["overhead"]["traced_seconds"] < 2.0


def _diagnose(pid, duration, *extra, env=None):
    return subprocess.Popen([PY, "-m", "trainprobe.agent", "diagnose", "--pid", str(pid), "--duration", str(duration), "--json",
                             "--probes", "process,sched,syscalls", *extra], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=dict(os.environ, NO_COLOR="1", **(env or {})),
                            preexec_fn=interruptible)


def _wait_attached(timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if len({x["name"] for x in our_programs()}) >= 5:
            return True
        time.sleep(0.2)
    return False


def test_ctrl_c_detaches_everything_and_still_reports():
    p = spawn_script(SPINNERS % 2)
    try:
        agent = _diagnose(p.pid, 60)
        assert _wait_attached(), agent.stderr.read() if agent.poll() is not None else "not attached"
        agent.send_signal(signal.SIGINT)
        out, err = agent.communicate(timeout=60)
        assert agent.returncode == 130, err            # interrupted: the report of what was gathered, then 130
        rep = json.loads(out)
        assert {x["name"]: x["status"] for x in rep["probes"]}["sched"] in ("ok", "failed")
        assert wait_no_programs(5) == []
        assert p.poll() is None                   # the target keeps running
    finally:
        p.kill()
        p.wait()


def test_target_death_detaches_everything():
    p = spawn_script("import time, hashlib\nprint('READY', flush=True)\nend = time.time() + 4\n"
                     "while time.time() < end: hashlib.sha256(b'z' * 65536).digest()\n")
    agent = _diagnose(p.pid, 60)
    try:
        assert _wait_attached()
        out, err = agent.communicate(timeout=60)
    finally:
        if agent.poll() is None:
            agent.kill()
        p.wait()
    assert agent.returncode in (0, 3), err
    assert "Traceback" not in err
    assert wait_no_programs(5) == []


def test_kill_9_of_trainprobe_leaves_nothing_attached():
    p = spawn_script(SPINNERS % 1)
    try:
        agent = _diagnose(p.pid, 60)
        assert _wait_attached()
        agent.kill()
        agent.wait(10)
        assert wait_no_programs(10) == []         # the kernel closes the fds: the programs go
    finally:
        p.kill()
        p.wait()


def test_without_ebpf_the_probes_skip_with_one_line_and_schedstat_remains():
    p = spawn_script(SPINNERS % 3)
    try:
        agent = _diagnose(p.pid, 2, env={"TRAINPROBE_NO_EBPF": "1"})
        out, err = agent.communicate(timeout=60)
    finally:
        p.kill()
        p.wait()
    assert agent.returncode == 0, err
    rep = json.loads(out)
    st = {x["name"]: x for x in rep["probes"]}
    for name in ("sched", "syscalls"):
        assert st[name]["status"] == "skipped"
        assert "TRAINPROBE_NO_EBPF" in st[name]["reason"] and "\n" not in st[name]["reason"]
    assert st["process"]["status"] == "ok"
    assert "sched: skipped" in err
