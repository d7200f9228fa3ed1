"""Output paths another user prepared, and identifiers another user chose, through the real CLI.

trainprobe runs as root beside the job's user (here uid 65534, as a forked child that drops to it
with setresuid), who may create anything in a sticky world-writable directory like /tmp: a FIFO
where the report is to go, read by that user or by nobody; a link to a FIFO; a link to a root-owned
file; a link to a directory. The job itself sets its own SLURM_JOB_ID, CUDA_VISIBLE_DEVICES,
LOCAL_RANK, RANK and WORLD_SIZE. The agent must never hang, never send an output to another
user's FIFO, never write through a planted link, and never put such a value raw into a file
name, a label or a printed line. Every CLI run has a strict timeout: a hang fails the test.
"""
import os
import re
import select
import shutil
import signal
import stat
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers import PY, REPO

pytestmark = pytest.mark.live

NOBODY = 65534
OTHER_USER = 12345              # a third, unprivileged user that is neither root nor the planter
PASSWD = "root:x:0:0:root:/root:/bin/bash\n"
HOSTILE_JOB_ID = "../" * 3000 + "etc/x\nid"
HOSTILE_CVD = "GPU-../../x," + "0," * 5000 + "\x1b]0;pwned\x07\u00e9"
HOSTILE_ENV = {"SLURM_JOB_ID": HOSTILE_JOB_ID, "CUDA_VISIBLE_DEVICES": HOSTILE_CVD, "LOCAL_RANK": "-1",
               "RANK": "9" * 5000, "WORLD_SIZE": "1e9"}
# A training-shaped job: torch mapped (what watch follows), its loop half on-CPU, half waiting.
JOB = """
import sys, time
import torch
print("READY", flush=True)
def train_step():
    t = time.monotonic()
    while time.monotonic() - t < 0.05:
        sum(range(2000))
    time.sleep(0.05)
while True:
    train_step()
"""


def _need_root():
    if os.geteuid() != 0:
        pytest.skip("needs root: the planter runs as another user and trainprobe as root")


def _drop_to(uid: int) -> None:
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)


def as_user(uid: int, fn, *args) -> int:
    """Run fn(*args) in a forked child as `uid`; its exit status (0 when fn returned)."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            signal.alarm(30)
            _drop_to(uid)
            os.umask(0)
            fn(*args)
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


class NobodyFifo:
    """A FIFO that uid 65534 creates at `path` (after `after` is called, when given); with
    `reader`, that user then opens it and reads everything, handed back by `received()`."""

    def __init__(self, path: Path, reader: bool = True):
        self.path, self.reader = path, reader
        self._data_r, data_w = os.pipe()
        self._ready_r, ready_w = os.pipe()
        self._go_r, self._go_w = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:
            code = 1
            try:
                signal.alarm(120)
                _drop_to(NOBODY)
                os.umask(0)
                os.read(self._go_r, 1)
                os.mkfifo(path, 0o622)
                os.write(ready_w, b"R")
                if reader:
                    fd = os.open(path, os.O_RDONLY)          # blocks until a writer opens it
                    while True:
                        chunk = os.read(fd, 65536)
                        if not chunk:
                            break
                        os.write(data_w, chunk)
                code = 0
            finally:
                os._exit(code)
        os.close(data_w)
        os.close(ready_w)

    def plant(self, timeout: float = 10.0) -> None:
        os.write(self._go_w, b"G")
        r, _, _ = select.select([self._ready_r], [], [], timeout)
        assert r and os.read(self._ready_r, 1) == b"R", "uid 65534 did not create its FIFO"
        st = os.lstat(self.path)
        assert stat.S_ISFIFO(st.st_mode) and st.st_uid == NOBODY

    def received(self) -> bytes:
        """What the reader got: it is stopped first (blocked in open() when nobody wrote)."""
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.waitpid(self.pid, 0)
        os.set_blocking(self._data_r, False)
        out = b""
        try:
            while True:
                chunk = os.read(self._data_r, 65536)
                if not chunk:
                    break
                out += chunk
        except BlockingIOError:
            pass
        for fd in (self._data_r, self._ready_r, self._go_r, self._go_w):
            os.close(fd)
        return out


@pytest.fixture
def shared_dir():
    """A sticky, world-writable directory, like /tmp, holding a root-owned passwd-like file."""
    _need_root()
    d = Path(tempfile.mkdtemp(prefix="trainprobe-outputs-", dir="/tmp"))
    d.chmod(0o1777)
    (d / "passwd").write_text(PASSWD)
    (d / "passwd").chmod(0o644)
    (d / "rootdir").mkdir(mode=0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def plant_link(target: Path, link: Path) -> None:
    assert as_user(NOBODY, os.symlink, str(target), str(link)) == 0
    assert os.lstat(link).st_uid == NOBODY


@pytest.fixture(scope="module")
def hostile_job():
    """A real Python training-shaped process whose environment holds hostile identifiers."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", **HOSTILE_ENV)
    proc = subprocess.Popen([PY, "-c", JOB], cwd="/", env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    assert proc.stdout is not None
    r, _, _ = select.select([proc.stdout], [], [], 90)
    line = proc.stdout.readline() if r else ""
    if line.strip() != "READY":
        proc.kill()
        pytest.fail(f"the job did not start: {line!r}")
    yield proc
    proc.kill()
    proc.wait()


def cli(*args: str, timeout: float, stdout=subprocess.PIPE) -> subprocess.CompletedProcess:
    env = dict(os.environ, NO_COLOR="1")
    env.pop("SUDO_UID", None)
    return subprocess.run([PY, "-m", "trainprobe.agent", *args], cwd=REPO, stdout=stdout, stderr=subprocess.PIPE,
                          text=True, timeout=timeout, env=env)


def last_line(r: subprocess.CompletedProcess) -> str:
    assert "Traceback" not in r.stderr, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert lines, "expected a message on stderr"
    return lines[-1]


@pytest.fixture
def folded(tmp_path):
    p = tmp_path / "in.folded"
    p.write_text("MainThread;train (t.py:9);next (loader.py:3) 700\nMainThread;train (t.py:9);step (t.py:4) 300\n")
    return str(p)


# -- FIFOs and links planted by the job's user ----------------------------------------------------------

def test_flamegraph_refuses_another_users_fifo_read_or_not_and_never_hangs(shared_dir, folded):
    for reader in (True, False):
        fifo = NobodyFifo(shared_dir / f"fg-{reader}.svg", reader=reader)
        fifo.plant()
        t0 = time.monotonic()
        r = cli("flamegraph", "--input", folded, "-o", str(fifo.path), timeout=30)
        assert time.monotonic() - t0 < 25
        assert r.returncode == 2, r.stderr
        assert "FIFO owned by uid 65534" in last_line(r)
        assert fifo.received() == b""                     # not one byte went to that user
        assert stat.S_ISFIFO(os.lstat(fifo.path).st_mode)


def test_a_link_to_a_fifo_or_a_root_file_is_replaced_never_followed(shared_dir, folded):
    lonely = NobodyFifo(shared_dir / "lonely", reader=False)
    lonely.plant()
    lonely.received()
    plant_link(shared_dir / "lonely", shared_dir / "to-fifo.svg")
    plant_link(shared_dir / "passwd", shared_dir / "to-passwd.svg")
    for name in ("to-fifo.svg", "to-passwd.svg"):
        r = cli("flamegraph", "--input", folded, "-o", str(shared_dir / name), timeout=30)
        assert r.returncode == 0, r.stderr
        st = os.lstat(shared_dir / name)
        assert stat.S_ISREG(st.st_mode) and (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o600)
        assert "<svg" in (shared_dir / name).read_text()
    assert (shared_dir / "passwd").read_text() == PASSWD
    assert stat.S_ISFIFO(os.lstat(shared_dir / "lonely").st_mode)


def test_a_directory_link_of_another_user_is_not_followed(shared_dir, folded):
    plant_link(shared_dir / "rootdir", shared_dir / "evil")
    r = cli("flamegraph", "--input", folded, "-o", str(shared_dir / "evil" / "fg.svg"), timeout=30)
    assert r.returncode == 2 and "link owned by uid 65534" in last_line(r)
    assert os.listdir(shared_dir / "rootdir") == []


def test_dev_null_a_pipe_a_file_stdout_and_an_own_fifo_still_work(tmp_path, folded):
    r = cli("flamegraph", "--input", folded, "-o", "/dev/null", timeout=30)
    assert r.returncode == 0, r.stderr
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
    r = cli("flamegraph", "--input", folded, "--format", "folded", "--group", "line", "-o", "/dev/stdout", timeout=30)
    assert r.returncode == 0 and "next (loader.py:3) 700" in r.stdout              # stdout is a pipe
    with open(tmp_path / "captured.txt", "w") as fh:                                 # no terminal, a file
        r = cli("flamegraph", "--input", folded, "--format", "folded", "--group", "line", "-o", "/dev/stdout",
                timeout=30, stdout=fh)
    assert r.returncode == 0 and "step (t.py:4) 300" in (tmp_path / "captured.txt").read_text()
    assert os.path.islink("/dev/stdout")                                              # written into, not replaced
    own = tmp_path / "own.fifo"
    os.mkfifo(own)
    reader = subprocess.Popen(["cat", str(own)], stdout=subprocess.PIPE)
    r = cli("flamegraph", "--input", folded, "--format", "folded", "--group", "line", "-o", str(own), timeout=30)
    out, _ = reader.communicate(timeout=30)
    assert r.returncode == 0 and b"step (t.py:4) 300" in out
    lonely = tmp_path / "lonely.fifo"                                                 # own, never read
    os.mkfifo(lonely)
    t0 = time.monotonic()
    r = cli("flamegraph", "--input", folded, "-o", str(lonely), timeout=30)
    assert r.returncode == 2 and "no process reads" in last_line(r) and time.monotonic() - t0 < 25


def test_sticky_directory_file_of_another_user(shared_dir):
    """Root may replace it (CAP_FOWNER); an unprivileged agent may not, and says so in one line."""
    from trainprobe.reports import output
    theirs = shared_dir / "theirs.html"
    assert as_user(NOBODY, lambda: Path(theirs).write_text("theirs")) == 0
    rd, wr = os.pipe()

    def try_write():
        try:
            output.write(str(theirs), "mine")
            os.write(wr, b"written")
        except OSError as exc:
            os.write(wr, (exc.strerror or str(exc)).encode()[:500])

    assert as_user(OTHER_USER, try_write) == 0
    said = os.read(rd, 1000).decode()
    assert "belongs to uid 65534 in a sticky directory" in said, said
    assert theirs.read_text() == "theirs"
    output.write(str(theirs), "root's")                  # as root: replaced, not written through
    st = os.lstat(theirs)
    assert theirs.read_text() == "root's" and st.st_uid == 0 and stat.S_IMODE(st.st_mode) == 0o600


@pytest.mark.slow
def test_diagnose_html_and_save_against_a_planted_fifo_and_link(shared_dir, hostile_job):
    """--save through a link to a FIFO nobody reads replaces the link; an --html FIFO that the job's
    user plants and reads during the window gets nothing, and the run ends with exit 2."""
    lonely = NobodyFifo(shared_dir / "lonely", reader=False)
    lonely.plant()
    lonely.received()
    plant_link(shared_dir / "lonely", shared_dir / "bundle.tar.gz")
    late = NobodyFifo(shared_dir / "report.html", reader=True)
    p = subprocess.Popen([PY, "-m", "trainprobe.agent", "diagnose", "--pid", str(hostile_job.pid), "--duration", "2",
                          "--json", "--save", str(shared_dir / "bundle.tar.gz"), "--html", str(late.path)],
                         cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=dict(os.environ, NO_COLOR="1"))
    try:
        assert p.stderr is not None
        deadline = time.monotonic() + 60
        seen = []
        while time.monotonic() < deadline:                # plant once the output paths were checked
            line = p.stderr.readline()
            seen.append(line)
            if not line or "watching PID" in line:
                break
        assert any("watching PID" in ln for ln in seen), seen
        late.plant()
        out, err = p.communicate(timeout=90)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 2, err
    assert "Traceback" not in err and "FIFO owned by uid 65534" in err.strip().splitlines()[-1]
    assert late.received() == b""
    saved = os.lstat(shared_dir / "bundle.tar.gz")
    assert stat.S_ISREG(saved.st_mode) and (saved.st_uid, stat.S_IMODE(saved.st_mode)) == (0, 0o600)
    assert stat.S_ISFIFO(os.lstat(shared_dir / "lonely").st_mode)
    # The job's identifiers, in the bundle as in what was printed: bounded and parsed, never raw.
    with tarfile.open(shared_dir / "bundle.tar.gz") as tar:
        blobs = [tar.extractfile(m).read().decode() for m in tar.getmembers() if m.isfile()]
    for text in blobs + [out, err]:
        for raw in ("../" * 10, "GPU-..", "pwned", "9" * 100, "0," * 100):
            assert raw not in text
    assert hostile_job.poll() is None


@pytest.mark.slow
def test_flamegraph_of_a_live_job_through_a_link_to_a_root_file(shared_dir, hostile_job):
    plant_link(shared_dir / "passwd", shared_dir / "live.svg")
    r = cli("flamegraph", "--pid", str(hostile_job.pid), "--duration", "1", "-o", str(shared_dir / "live.svg"),
            timeout=60)
    assert r.returncode == 0, r.stderr
    assert (shared_dir / "passwd").read_text() == PASSWD
    assert not os.path.islink(shared_dir / "live.svg") and "train_step" in (shared_dir / "live.svg").read_text()
    assert hostile_job.poll() is None


def test_an_input_path_that_is_a_fifo_is_refused_without_blocking(shared_dir, folded):
    """flamegraph --input/--diff and preflight --profile/--replay read only regular files: a FIFO the job's
    user left there (nobody ever writes to it) would otherwise block open() for ever."""
    fifo = NobodyFifo(shared_dir / "profile.json", reader=False)
    fifo.plant()
    fifo.received()
    for args, code in ((("flamegraph", "--input", str(fifo.path)), 2),
                       (("flamegraph", "--input", folded, "--diff", str(fifo.path)), 2),
                       (("preflight", "--profile", str(fifo.path)), 3),           # preflight's bad input
                       (("preflight", "--replay", str(fifo.path)), 3)):
        r = cli(*args, timeout=30)
        assert r.returncode == code and "not a regular file" in last_line(r), (args, r.stderr)


# -- watch: the textfile and the bundles -----------------------------------------------------------------

def test_watch_refuses_another_users_fifo_as_textfile(shared_dir):
    fifo = NobodyFifo(shared_dir / "watch.prom", reader=True)
    fifo.plant()
    r = cli("watch", "--listen", "none", "--textfile", str(fifo.path), "--duration", "30", timeout=30)
    assert r.returncode == 2 and "FIFO owned by uid 65534" in last_line(r)
    assert fifo.received() == b""


@pytest.mark.slow
def test_watch_textfile_through_a_link_and_a_bundle_named_safely(shared_dir, hostile_job):
    plant_link(shared_dir / "passwd", shared_dir / "watch.prom")
    bundles = shared_dir / "bundles"
    w = subprocess.Popen([PY, "-m", "trainprobe.agent", "watch", "--listen", "none", "--textfile",
                          str(shared_dir / "watch.prom"), "--interval", "0.5", "--trigger", "loop-wait>0.1", "--for", "0",
                          "--diagnose-seconds", "1", "--bundle-dir", str(bundles), "--pid", str(hostile_job.pid)],
                         cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=dict(os.environ, NO_COLOR="1"))
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not (bundles.is_dir() and os.listdir(bundles)):
            assert w.poll() is None, w.communicate()[1]
            time.sleep(0.5)
        time.sleep(1.0)                                   # one more sample after the diagnosis
    finally:
        w.terminate()
        try:
            _, err = w.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            w.kill()
            _, err = w.communicate()
    assert "Traceback" not in err, err
    kept = os.listdir(bundles)
    assert len(kept) == 1 and re.fullmatch(r"trainprobe-\d{8}T\d{6}-jobunknown-pid\d+\.tar\.gz", kept[0]), kept
    assert sorted(os.listdir(shared_dir)) == ["bundles", "passwd", "rootdir", "watch.prom"]
    assert (shared_dir / "passwd").read_text() == PASSWD
    st = os.lstat(shared_dir / "watch.prom")
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o644
    labels = [s.labels for fam in text_string_to_metric_families((shared_dir / "watch.prom").read_text())
              for s in fam.samples if "slurm_job" in s.labels]
    assert labels and {lab["slurm_job"] for lab in labels} == {"unknown"}
    assert "../" * 10 not in err and "pwned" not in err
    assert hostile_job.poll() is None


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
