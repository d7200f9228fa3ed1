"""Source lines are read only from regular files of real file systems, with the target's own rights.

The attack: a job run by an unprivileged user (uid 65534) compiles code whose file name is a procfs,
sysfs or cgroupfs file of a root process (`/proc/1/maps`, `/proc/<root pid>/stat`, `/proc/self/maps`,
`/sys/kernel/vmcoreinfo`, ...), a device or a FIFO, and waits for trainprobe, running as root, to
copy "its source line" into the bundle. procfs checks ptrace access only when a file is opened and
its files say size 0, so owner and mode bits do not stop a root reader.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from trainprobe.probes.support import safeopen, sourcelines
from tests.helpers import PY, REPO

NOBODY = 65534
NOBODY_CREDS = sourcelines.Creds(NOBODY, NOBODY, frozenset({NOBODY}))
ROOT_CREDS = sourcelines.Creds(0, 0, frozenset({0}))
LEGIT_LINE = "legit_marker = 'LEGITSOURCELINE'"


def _pseudo_paths() -> list[str]:
    """World-readable (mode 0444 or so) kernel files that hold root's secrets or the host's layout."""
    me = os.getpid()         # a root process: the test itself
    paths = ["/proc/1/maps", "/proc/1/stat", "/proc/1/wchan", "/proc/1/smaps_rollup", "/proc/1/mountinfo",
             "/proc/1/environ", f"/proc/{me}/stat", f"/proc/{me}/maps", "/proc/self/maps", "/proc/self/status",
             "/proc/thread-self/stat", "/proc/kallsyms", "/proc/sys/kernel/random/boot_id",
             "/sys/kernel/vmcoreinfo", "/sys/kernel/notes", "/sys/devices/system/cpu/online",
             "/sys/kernel/tracing/trace", "/sys/kernel/debug/sched/debug",
             "/sys/fs/cgroup/unified/cgroup.procs", "/sys/fs/cgroup/cgroup.procs",
             "/sys/fs/cgroup/memory/memory.stat", "/sys/fs/cgroup/cpu/cpu.stat",
             "/dev/zero", "/dev/null", "/dev/urandom", "/dev/kmsg"]
    return [p for p in paths if os.path.exists(p)]


def _nobody_python() -> str | None:
    for exe in ("/usr/bin/python3", sys.executable):
        r = subprocess.run([exe, "-c", "print(1)"], capture_output=True, user=NOBODY, group=NOBODY,
                           extra_groups=[], cwd="/")
        if r.returncode == 0:
            return exe
    return None


def _needs_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: the job runs as another user and trainprobe as root")


@pytest.fixture
def public_dir():
    """A directory every user may search, holding a legit source file, an empty one, a FIFO, a socket."""
    d = Path(tempfile.mkdtemp(prefix="trainprobe-src-", dir="/tmp"))
    d.chmod(0o755)
    (d / "legit.py").write_text(f"# a real source file\n{LEGIT_LINE}\n")
    (d / "legit.py").chmod(0o644)
    (d / "empty.py").write_text("")
    (d / "empty.py").chmod(0o644)
    os.mkfifo(d / "fifo", 0o666)
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(d / "sock"))
    try:
        yield d
    finally:
        sock.close()
        shutil.rmtree(d, ignore_errors=True)


def _assert_nothing_of_pseudo_files(results, wanted):
    for (path, _lines), got in zip(wanted, results):
        assert isinstance(got, str), f"{path} was read: {got!r}"
        assert got, path


# -- the reader on its own, both ways it can read ----------------------------------------------------

@pytest.mark.live
@pytest.mark.parametrize("way", ["as the target", "checked by hand"])
def test_pseudo_files_devices_and_fifos_are_never_read(public_dir, monkeypatch, way):
    _needs_root()
    if way == "checked by hand":
        monkeypatch.setattr(sourcelines, "_may_change_ids", lambda: False)
    bad = _pseudo_paths() + [str(public_dir / n) for n in ("fifo", "sock", "empty.py")]
    assert len(bad) >= 15
    wanted = [(p, [1, 2, 3]) for p in bad] + [(str(public_dir / "legit.py"), [2])]
    t0 = time.monotonic()
    results, how = sourcelines.read_files("/", wanted, NOBODY_CREDS)
    assert time.monotonic() - t0 < 10, "a FIFO or a device must not hang the reader"
    assert how.startswith("as uid 65534" if way == "as the target" else "checked by hand for uid 65534"), how
    _assert_nothing_of_pseudo_files(results[:-1], wanted[:-1])
    assert results[-1] == {2: LEGIT_LINE}
    reasons = dict(zip(bad, results))
    assert "pseudo file system" in reasons["/proc/1/maps"] or "may not" in reasons["/proc/1/maps"]
    assert "on proc, a pseudo file system" in reasons["/proc/self/maps"]
    assert "on sysfs, a pseudo file system" in reasons["/sys/kernel/vmcoreinfo"]
    assert "not a regular file" in reasons["/dev/zero"] and "not a regular file" in reasons[str(public_dir / "fifo")]
    assert "size 0" in reasons[str(public_dir / "empty.py")]


@pytest.mark.live
def test_a_root_target_gets_no_pseudo_file_either(public_dir):
    """Root's own job: its rights pass every check, the file system type still refuses."""
    _needs_root()
    bad = _pseudo_paths()
    wanted = [(p, [1]) for p in bad] + [(str(public_dir / "legit.py"), [2])]
    results, how = sourcelines.read_files("/", wanted, ROOT_CREDS)
    assert how.startswith("checked by hand for uid 0")
    _assert_nothing_of_pseudo_files(results[:-1], wanted[:-1])
    assert results[-1] == {2: LEGIT_LINE}


@pytest.mark.live
def test_the_kernel_decides_as_the_targets_user(public_dir):
    """Read as uid 65534 by a child with those ids: a 0600 root file and a file in a directory it
    cannot search are refused; its own 0600 file is read."""
    _needs_root()
    (public_dir / "rootonly.py").write_text("ROOTONLY\n")
    (public_dir / "rootonly.py").chmod(0o600)
    own = public_dir / "own.py"
    own.write_text("OWNLINE\n")
    os.chown(own, NOBODY, NOBODY)
    own.chmod(0o600)
    closed = public_dir / "closed"
    closed.mkdir(mode=0o700)
    (closed / "x.py").write_text("CLOSED\n")
    (closed / "x.py").chmod(0o644)
    wanted = [(str(public_dir / "rootonly.py"), [1]), (str(own), [1]), (str(closed / "x.py"), [1])]
    results, how = sourcelines.read_files("/", wanted, NOBODY_CREDS)
    assert how == "as uid 65534"
    assert results == ["the target's user may not read it", {1: "OWNLINE"},
                       "the target's user cannot search a directory on the way"]


@pytest.mark.live
def test_a_file_swapped_after_its_check_is_not_read(public_dir, monkeypatch):
    """The file checked (on its O_PATH descriptor) is the one read: a rename in between is caught."""
    p = public_dir / "swap.py"
    p.write_text("checked\n")
    (public_dir / "other.py").write_text("swapped in\n")

    class SwappingOs:
        def __getattr__(self, name):
            return getattr(os, name)

        @staticmethod
        def open(name, flags, *a, **kw):
            if name == b"swap.py" and not flags & os.O_PATH:
                os.rename(public_dir / "other.py", p)
            return os.open(name, flags, *a, **kw)

    monkeypatch.setattr(safeopen, "os", SwappingOs())
    with pytest.raises(sourcelines.Skip, match="replaced"):
        sourcelines.read_lines("/", str(p), ROOT_CREDS)


def test_the_file_system_type_without_fstatfs():
    """Where fstatfs cannot be called, /proc/self/mountinfo names the file system of the descriptor."""
    saved = list(safeopen._statfs)
    safeopen._statfs[:] = [None]
    try:
        for path, want in (("/proc/self/status", "proc"), ("/sys/devices/system/cpu/online", "sysfs"),
                           (sourcelines.__file__, None)):
            fd = os.open(path, os.O_PATH)
            try:
                assert safeopen.pseudo_fs(fd) == want, path
            finally:
                os.close(fd)
    finally:
        safeopen._statfs[:] = saved


@pytest.mark.live
@pytest.mark.parametrize("boot, why", [
    ("import time; time.sleep(60)", "did not answer"),
    ("import sys; sys.stdout.write('{\"uid\": 65534, \"files\": 3}')", "no usable answer"),
    ("import sys; sys.stdout.write('x' * (1 << 26))", "answered too much"),
])
def test_a_misbehaving_reader_changes_nothing(public_dir, monkeypatch, boot, why):
    """The child runs as the target's user, so the target may take it over: its answer is bounded in
    time and size, checked, and on failure the files are checked by hand instead."""
    _needs_root()
    monkeypatch.setattr(sourcelines, "_BOOT", boot)
    monkeypatch.setattr(sourcelines, "READER_TIMEOUT_S", 1.5)
    monkeypatch.setattr(sourcelines, "_working_interpreter", {})
    wanted = [("/proc/1/maps", [1]), (str(public_dir / "legit.py"), [2])]
    t0 = time.monotonic()
    results, how = sourcelines.read_files("/", wanted, NOBODY_CREDS)
    assert time.monotonic() - t0 < 8
    assert how.startswith("checked by hand for uid 65534") and why in how, how
    assert isinstance(results[0], str) and results[1] == {2: LEGIT_LINE}


def test_an_answer_holds_only_what_was_asked():
    wanted = [("/a.py", [2]), ("/b.py", [1])]
    raw = json.dumps({"uid": 65534, "files": [{"lines": {"2": "x" * 10000, "7": "not asked", "zz": "y"}},
                                              {"skip": "nope"}]}).encode()
    got = sourcelines._parse_answer(raw, NOBODY_CREDS, wanted)
    assert got == [{2: "x" * safeopen.MAX_LINE_CHARS}, "nope"]
    for bad in (b"[]", b"{}", json.dumps({"uid": 0, "files": [{}, {}]}).encode(),
                json.dumps({"uid": 65534, "files": [{"lines": 1}, {"skip": "x"}]}).encode()):
        with pytest.raises((ValueError, AttributeError, TypeError)):
            sourcelines._parse_answer(bad, NOBODY_CREDS, wanted)


# -- the attack, end to end ----------------------------------------------------------------------------

JOB = r'''
import sys, threading, time
# Each unit is one line, so the frame is at line 1 of the named file: /proc/PID/stat has one line.
src = "while True: time.sleep(0.005)"
for name in sys.argv[1:]:
    threading.Thread(target=exec, args=(compile(src, name, "exec"), {"time": time}), daemon=True).start()
print("READY", flush=True)
while True:
    time.sleep(0.005)
'''


@pytest.mark.live
@pytest.mark.slow
def test_a_hostile_job_gets_no_kernel_file_into_the_bundle(public_dir, tmp_path):
    _needs_root()
    if not (Path(PY).parent / "py-spy").exists() and shutil.which("py-spy") is None:
        pytest.skip("py-spy is not installed")
    exe = _nobody_python()
    if exe is None:
        pytest.skip("no python3 that an unprivileged user may run")
    job = public_dir / "job.py"
    job.write_text(JOB)
    job.chmod(0o644)
    bad = _pseudo_paths() + [str(public_dir / "fifo"), str(public_dir / "sock")]
    legit = str(public_dir / "legit.py")
    (public_dir / "legit.py").write_text(f"{LEGIT_LINE}; import time\n")   # its frame is at line 1 too
    proc = subprocess.Popen([exe, str(job), *bad, legit], cwd=str(public_dir), env={"PATH": "/usr/bin:/bin"},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            user=NOBODY, group=NOBODY, extra_groups=[])
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "READY"
        env = dict(os.environ, NO_COLOR="1", PYTHONPATH=str(REPO))
        env.pop("SUDO_UID", None)
        r = subprocess.run([PY, "-m", "trainprobe.agent", "diagnose", "--pid", str(proc.pid), "--duration", "2",
                            "--probes", "pyspy", "--json", "--save", str(tmp_path / "bundle")],
                           cwd=str(REPO), capture_output=True, timeout=120, env=env)
        assert r.returncode == 0, r.stderr.decode(errors="replace")
    finally:
        proc.kill()
        proc.wait()
    cap = json.loads((tmp_path / "bundle" / "captures" / "pyspy.json").read_text())
    trace = cap["artifacts"]["chrometrace.json"]
    lines = json.loads(cap["artifacts"]["source_lines.json"])
    skipped = json.loads(cap["artifacts"]["source_skipped.json"])
    seen = [p for p in bad if f'"{p}"' in trace]
    assert len(seen) >= len(bad) - 2, f"py-spy saw too few of the planted frames: {seen}"
    for p in seen:
        assert not any(k.startswith(p + ":") for k in lines), f"{p} was read into source_lines.json"
        assert p in skipped, p
    assert lines.get(f"{legit}:1", "").startswith(LEGIT_LINE), lines
    notes = [e["what"] for e in cap["provenance"] if e["kind"] == "file"]
    assert any(legit in w and "(read as uid 65534)" in w for w in notes), notes
    # Nothing of a root process's memory map (this test's own) reached any byte written or printed.
    first_map_line = Path(f"/proc/{os.getpid()}/maps").read_text().splitlines()[0].split()[0]
    for p in [*(tmp_path / "bundle").rglob("*")]:
        if p.is_file():
            assert first_map_line.encode() not in p.read_bytes(), p
    assert first_map_line.encode() not in r.stdout + r.stderr
    assert stat.S_IMODE((tmp_path / "bundle").stat().st_mode) == 0o700
