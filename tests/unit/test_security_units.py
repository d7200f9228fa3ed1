"""One test (at least) per item of the security model: redaction, safe source lines, quoted
commands, bundle validation, private atomic files, terminal escaping, exit codes, CI strictness."""
from __future__ import annotations

import gzip
import io
import json
import os
import shlex
import signal
import stat
import subprocess
import sys
import tarfile
import textwrap
import threading
import time
from pathlib import Path

import pytest

from trainprobe.probes.parsers import redact
from trainprobe.probes.support import sourcelines
from trainprobe.reports import output
from tests.helpers import DATA, PY, REPO, interruptible, run_cli


@pytest.fixture(autouse=True)
def _no_extra_patterns():
    yield
    redact.configure(())


# -- 2. redaction ------------------------------------------------------------------------------------

@pytest.mark.parametrize("given, hidden", [
    (["train.py", "--api-key=K1"], "K1"),
    (["train.py", "--hf-token", "K2"], "K2"),
    (["train.py", "--HF_TOKEN", "K2b"], "K2b"),
    (["train.py", "password=K3"], "K3"),
    (["train.py", "DB_PASSWD=K4"], "K4"),
    (["train.py", "--wandb-api-key", "K5"], "K5"),
    (["train.py", "--data", "https://user:K6@host/x"], "K6"),
    (["train.py", "--auth=K7"], "K7"),
    (["train.py", "--client-secret", "K8 with space"], "K8 with space"),
    (["train.py", "--credentials=K9"], "K9"),
])
def test_argv_credentials_are_redacted(given, hidden):
    out = redact.argv(given)
    assert hidden not in " ".join(out)
    assert len(out) == len(given) and out[0] == "train.py"   # names stay, so a reader sees something was there
    raw = "\0".join(given).encode()
    from trainprobe.probes.parsers import procfs
    assert hidden not in procfs.parse_cmdline(raw) and procfs.parse_argv(raw) == out


@pytest.mark.parametrize("plain", ["--lr=0.1", "--max-tokens 20", "--keyboard 3", "--batch-size=64",
                                   "tokens=5", "author=me"])
def test_ordinary_options_are_kept(plain):
    assert redact.text(plain) == plain


def test_free_text_forms():
    assert redact.text('process 1:"python t.py --api-key=zz"') == 'process 1:"python t.py --api-key=***"'
    assert redact.text('    api_token = "abc"  # x') == '    api_token = "***"  # x'
    assert redact.text("git clone https://bob:pw@github.com/x") == "git clone https://***@github.com/x"


def test_json_artifacts_are_redacted_string_by_string():
    doc = json.dumps({"lines": {"t.py:3": 'password = "hunter2"'}, "name": "ok"})
    out = redact.artifact("source_lines.json", doc)
    assert "hunter2" not in out and json.loads(out)["name"] == "ok"


def test_extra_patterns_and_a_bad_pattern():
    redact.configure([r"ACME-\d+"])
    assert redact.text("job ACME-1234 runs") == "job *** runs"
    with pytest.raises(redact.RedactPatternError):
        redact.configure(["(unclosed"])
    r = run_cli("report", "/nonexistent", "--redact", "(unclosed")
    assert r.rc == 2 and "--redact" in r.err and "Traceback" not in r.err


def test_the_recorder_redacts_every_artifact_and_provenance_line():
    import threading

    from trainprobe.probes.base import Capture, Recorder
    rec = Recorder(Capture("x"), threading.Event())
    rec.add("log.txt", "started with --api-key=SECRET1")
    rec.note("command", "tool --token SECRET2", 0, 0.0, 0.0)
    dumped = json.dumps(rec.capture.to_dict())
    assert "SECRET1" not in dumped and "SECRET2" not in dumped


# -- 1. source lines ---------------------------------------------------------------------------------

ME = sourcelines.Creds(os.getuid(), os.getgid(), frozenset(os.getgroups()) | {os.getgid()})
NOBODY = sourcelines.Creds(65534, 65534, frozenset({65534}))


def test_a_fifo_is_never_opened_for_reading(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    t0 = time.monotonic()
    with pytest.raises(sourcelines.Skip, match="regular"):
        sourcelines.read_lines("/", str(fifo), ME)
    assert time.monotonic() - t0 < 2


@pytest.mark.parametrize("dev", ["/dev/zero", "/dev/urandom", "/proc/self/fd/0"])
def test_devices_and_magic_links_are_not_read(dev):
    with pytest.raises(sourcelines.Skip):
        sourcelines.read_lines("/", dev, ME)


def test_large_files_are_not_read(tmp_path, monkeypatch):
    p = tmp_path / "big.py"
    p.write_text("x = 1\n" * 1000)
    monkeypatch.setattr(sourcelines, "MAX_FILE_BYTES", 100)
    with pytest.raises(sourcelines.Skip, match="larger"):
        sourcelines.read_lines("/", str(p), ME)


@pytest.fixture
def public_dir():
    """A directory every user may search (pytest's own tmp_path is private to its user)."""
    import shutil
    import tempfile
    d = Path(tempfile.mkdtemp(prefix="trainprobe-test-", dir="/tmp"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_the_targets_rights_decide(public_dir):
    tmp_path = public_dir
    p = tmp_path / "secret.py"
    p.write_text("a\nb\n")
    p.chmod(0o600)
    assert sourcelines.read_lines("/", str(p), ME) == ["a", "b"]
    with pytest.raises(sourcelines.Skip, match="may not read"):
        sourcelines.read_lines("/", str(p), NOBODY)
    p.chmod(0o644)
    assert sourcelines.read_lines("/", str(p), NOBODY) == ["a", "b"]
    tmp_path.chmod(0o700)
    try:
        with pytest.raises(sourcelines.Skip, match="search"):
            sourcelines.read_lines("/", str(p), NOBODY)
    finally:
        tmp_path.chmod(0o755)


def test_links_stay_inside_the_root(tmp_path):
    """An absolute link inside a target's root resolves inside that root, never in ours."""
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "passwd").write_text("the target's own passwd\n")
    (root / "app").mkdir()
    (root / "app" / "link.py").symlink_to("/etc/passwd")
    (root / "app" / "up.py").symlink_to("../../../../../../etc/passwd")
    assert sourcelines.read_lines(str(root), "/app/link.py", ME) == ["the target's own passwd"]
    assert sourcelines.read_lines(str(root), "/app/up.py", ME) == ["the target's own passwd"]
    assert sourcelines.read_lines(str(root), "/../../../../etc/passwd", ME) == ["the target's own passwd"]
    loop = root / "app" / "loop.py"
    loop.symlink_to("loop.py")
    with pytest.raises(sourcelines.Skip, match="symbolic links"):
        sourcelines.read_lines(str(root), "/app/loop.py", ME)


def test_read_leaf_sources_explains_each_skip(tmp_path):
    good = tmp_path / "good.py"
    good.write_text("first\nsecond\n")
    fifo = tmp_path / "f"
    os.mkfifo(fifo)
    ev = []
    for fn in (str(good), str(fifo), "/dev/zero"):
        ev += [{"ph": "B", "pid": 1, "tid": 1, "args": {"filename": fn, "line": 2}},
               {"ph": "E", "pid": 1, "tid": 1}]
    lines, skipped = sourcelines.read_leaf_sources(ev, None, "/", creds=ME)
    assert lines == {f"{good}:2": "second"}
    assert set(skipped) == {str(fifo), "/dev/zero"}


# -- 3. quoted commands --------------------------------------------------------------------------------

def test_fix_commands_quote_the_targets_argv():
    from trainprobe.agent import evidence
    from trainprobe.agent.ranking import rank
    from trainprobe.agent.report import diagnose as run_rules
    from trainprobe.probes.base import Capture
    scen = DATA / "bcc" / "oversubscribed"
    caps = []
    for p in sorted(scen.glob("*.capture.json.gz")):
        with gzip.open(p, "rt") as fh:
            caps.append(Capture.from_dict(json.load(fh)))
    if not caps:
        pytest.skip(f"no captures in {scen}")
    evil = ["python", "train.py", "--out", "a b", "--tag", "$(touch /tmp/pwned); rm -rf ~"]
    for c in caps:
        if c.probe == "process":
            snaps = json.loads(c.artifacts["snapshots.json"])
            for snap in (snaps["start"], snaps["end"]):
                main = snap["procs"].get(str(snaps["pid"]))
                if main:
                    main["argv"], main["cmdline"] = evil, " ".join(evil)
            c.artifacts["snapshots.json"] = json.dumps(snaps)
    ctx = json.loads((scen / "context.json").read_text())
    findings, _runs = run_rules(evidence.build(caps, ctx))
    commands = [fx.command for f in rank(findings) for fx in f.fixes if fx.command]
    assert commands, "the oversubscribed capture gives a command to run"
    for cmd in commands:
        words = shlex.split(cmd)
        assert words[-len(evil):] == evil, cmd


# -- 4. bundles ----------------------------------------------------------------------------------------

def _index(captures):
    return json.dumps({"schema": "trainprobe.bundle/1", "context": {"window": {"seconds": 1}}, "captures": captures})


@pytest.mark.parametrize("name", ["../../etc/passwd", "/etc/passwd", "captures/../../x.json", "captures/a/b.json",
                                  "report.txt"])
def test_directory_bundle_names_are_checked(tmp_path, name):
    (tmp_path / "bundle.json").write_text(_index([name]))
    r = run_cli("report", str(tmp_path))
    assert r.rc == 2 and "Traceback" not in r.err
    assert "root:" not in r.out + r.err


def test_directory_bundle_links_are_not_followed(tmp_path):
    (tmp_path / "captures").mkdir()
    (tmp_path / "captures" / "pyspy.json").symlink_to("/etc/passwd")
    (tmp_path / "bundle.json").write_text(_index(["captures/pyspy.json"]))
    r = run_cli("report", str(tmp_path))
    assert r.rc == 2 and "root:" not in r.out + r.err
    (tmp_path / "captures" / "pyspy.json").unlink()
    (tmp_path / "captures").rmdir()
    (tmp_path / "captures").symlink_to("/etc")
    r = run_cli("report", str(tmp_path))
    assert r.rc == 2


def _tar(path, members):
    with tarfile.open(path, "w:gz") as tar:
        for name, data, kind in members:
            info = tarfile.TarInfo(name)
            if kind == "link":
                info.type, info.linkname = tarfile.SYMTYPE, data.decode()
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))


def test_archive_members_are_checked_and_capped(tmp_path, monkeypatch):
    from trainprobe.agent import bundle
    p = tmp_path / "b.tar.gz"
    _tar(p, [("b/../../x/bundle.json", _index([]).encode(), "file")])
    with pytest.raises(bundle.BundleError, match="unsafe"):
        bundle.load(str(p))
    _tar(p, [("b/bundle.json", _index(["captures/pyspy.json"]).encode(), "file"),
             ("b/captures/pyspy.json", b"/etc/passwd", "link")])
    with pytest.raises(bundle.BundleError, match="symbolic link"):
        bundle.load(str(p))
    # A bomb: 64 MiB of zeros compress to a few KB; the member cap stops it before it is read.
    monkeypatch.setattr(bundle, "MAX_MEMBER_BYTES", 1 << 20)
    _tar(p, [("b/bundle.json", _index(["captures/big.json"]).encode(), "file"),
             ("b/captures/big.json", bytes(64 << 20), "file")])
    assert p.stat().st_size < 1 << 20
    with pytest.raises(bundle.BundleError, match="larger than"):
        bundle.load(str(p))


def test_a_bad_bundle_exits_2_with_one_line(tmp_path):
    p = tmp_path / "b.tar.gz"
    _tar(p, [("/abs/bundle.json", _index([]).encode(), "file")])
    r = run_cli("report", str(p))
    assert r.rc == 2 and "Traceback" not in r.err and len(r.err.strip().splitlines()) == 1


# -- 5. files --------------------------------------------------------------------------------------------

def test_output_is_atomic_private_and_replaces_a_planted_link(tmp_path):
    from trainprobe.reports import output
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    dest = tmp_path / "report.html"
    dest.symlink_to(victim)
    output.write(str(dest), "new")
    assert victim.read_text() == "keep me"
    assert not dest.is_symlink() and dest.read_text() == "new"
    assert stat.S_IMODE(dest.stat().st_mode) == 0o600
    output.write(str(tmp_path / "m.prom"), "x 1\n", private=False)
    assert stat.S_IMODE((tmp_path / "m.prom").stat().st_mode) == 0o644
    assert sorted(os.listdir(tmp_path)) == ["m.prom", "report.html", "victim"]


def test_outputs_go_back_to_the_user_behind_sudo(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root (as under sudo)")
    folded = tmp_path / "in.folded"
    folded.write_text("a;b 10\n")
    r = run_cli("flamegraph", "--input", str(folded), "-o", str(tmp_path / "fg.svg"),
                env={"SUDO_UID": "4321", "SUDO_GID": "4322"})
    assert r.rc == 0, r.err
    st = (tmp_path / "fg.svg").stat()
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (4321, 4322, 0o600)


def test_no_writer_bypasses_reports_output():
    offenders = []
    for d in ("agent", "reports"):
        for p in (REPO / d).rglob("*.py"):
            text = p.read_text()
            if p.name == "output.py":
                continue
            if ".tmp" in text or 'open(tmp' in text or ', "w")' in text or ", 'w')" in text \
                    or '"wb")' in text or "mkstemp" in text:
                offenders.append(str(p.relative_to(REPO)))
    assert not offenders, offenders


def test_make_writes_no_log_at_a_fixed_tmp_path():
    mk = (REPO / "Makefile").read_text()
    assert "/tmp/trainprobe" not in mk and "mktemp" in mk


# -- 6. terminal -------------------------------------------------------------------------------------------

def test_terminal_escapes_are_shown_escaped():
    from trainprobe.reports import text as text_report
    from trainprobe.reports.output import terminal_safe
    assert terminal_safe("a\x1b[2Jb\x07\u202e") == "a\\x1b[2Jb\\x07\\u202e"
    assert terminal_safe("two\nlines") == "two\\nlines"
    assert terminal_safe("keep\nthis", multiline=True) == "keep\nthis"
    from tests.report_fixtures import h200_report
    rep = h200_report("starved")[0]
    rep["target"]["cmdline"] = "python \x1b]0;pwned\x07train.py"
    buf = io.StringIO()
    text_report.render(rep, buf, color=False)
    assert "\x1b" not in buf.getvalue() and "\\x1b]0;pwned" in buf.getvalue()


# -- 7. exit codes -----------------------------------------------------------------------------------------

# `python -m trainprobe.agent ARGS`, less the interpreter's own start-up: the child says when site and
# the interpreter are up (a line on stderr), and the delay counts from there. On a loaded 2-CPU
# machine the interpreter's start-up alone took over 0.7 s, and a SIGINT in it is Python's fatal
# error, not trainprobe's to handle.
_BOOT = ("import os, runpy; os.write(2, b'~started~\\n'); "
         "runpy.run_module('trainprobe.agent', run_name='__main__', alter_sys=True)")


def _sigint_after(args, delay):
    p = subprocess.Popen([PY, "-c", _BOOT, *args], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=dict(os.environ, NO_COLOR="1"), preexec_fn=interruptible)
    first = p.stderr.readline()
    time.sleep(delay)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    if first.strip() != "~started~":
        err = first + err
    return p.returncode, out, err


@pytest.mark.live
def test_ctrl_c_at_start_up_is_130(workload):
    w = workload("--seconds", "60", "--num-workers", "0")
    for args in (["diagnose", "--pid", str(w.pid), "--duration", "30"],
                 ["flamegraph", "--pid", str(w.pid), "--duration", "30", "-o", "/dev/null"]):
        # From when trainprobe's own code runs (the interpreter's start-up is Python's: _sigint_after
        # counts the delay from its end) to the window.
        for delay in (0.7, 1.4):
            rc, out, err = _sigint_after(args, delay)
            assert rc == 130, (args, delay, err)
            assert "Aborted!" not in err and "Traceback" not in err, err


def test_flamegraph_interrupted_before_any_stack_is_130(monkeypatch, capsys):
    """Ctrl-C lands after py-spy started but before it caught a Python stack: the empty profile is
    the interruption's, not a failure (exit 130, not 1). The session is the unit's boundary here;
    the live test above reaches this path only when the signal lands in that fraction of a second."""
    import trainprobe.agent.session as session
    from trainprobe.agent import cli
    from trainprobe.probes.base import Capture

    def interrupted_early(spec, probes, progress, target_alive=None):
        caps = [Capture(probe="pyspy", artifacts={"chrometrace.json": "[]"}, meta={"pid": spec.pid}),
                Capture(probe="process")]
        return session.SessionResult(captures=caps, started_unix=time.time(), window_s=30.0,
                                     observed_s=0.2, interrupted=True)

    monkeypatch.setattr(session, "run_session", interrupted_early)
    p = subprocess.Popen([PY, "-c", "import time; time.sleep(30)"])
    try:
        rc = cli._run(["flamegraph", "--pid", str(p.pid), "--duration", "30", "-o", "/dev/null"])
    finally:
        p.kill()
        p.wait()
    err = capsys.readouterr().err
    assert rc == 130, err
    assert "interrupted before py-spy gathered anything" in err and "Traceback" not in err


@pytest.mark.live
def test_flamegraph_ctrl_c_during_the_window_is_130(workload, tmp_path):
    w = workload("--seconds", "60", "--num-workers", "0")
    rc, out, err = _sigint_after(["flamegraph", "--pid", str(w.pid), "--duration", "30",
                                  "-o", str(tmp_path / "fg.svg")], 4)
    assert rc == 130, err
    assert "Aborted!" not in err and "Traceback" not in err


@pytest.mark.live
def test_pyspy_refused_during_capture_is_exit_4(workload, tmp_path):
    """py-spy passes its availability check, then the kernel refuses it during the window (as a
    seccomp'd container or an LSM would): diagnose still reports, and exits 4."""
    fake = tmp_path / "py-spy"
    fake.write_text("#!/bin/sh\necho 'Error: Permission denied (os error 13)' >&2\nexit 1\n")
    fake.chmod(0o755)
    w = workload("--seconds", "60", "--num-workers", "0")
    code = textwrap.dedent(f"""
        import sys
        import trainprobe.probes.pyspy as p
        p.pyspy_binary = lambda: {str(fake)!r}
        from trainprobe.agent.cli import run
        run(["diagnose", "--pid", "{w.pid}", "--duration", "1", "--probes", "pyspy,process", "--json"])
    """)
    r = subprocess.run([PY, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert r.returncode == 4, r.stderr
    rep = json.loads(r.stdout)
    assert {p["name"]: p["status"] for p in rep["probes"]}["pyspy"] == "failed"
    assert "not permitted" in r.stderr.strip().splitlines()[-1]


def test_bad_option_is_2_and_not_usage_1():
    r = run_cli("diagnose", "--duration", "nope")
    assert r.rc == 2 and "Traceback" not in r.err


# -- 11. CI cannot pass by skipping --------------------------------------------------------------------------

def test_require_live_turns_capability_skips_into_failures(tmp_path):
    (tmp_path / "conftest.py").write_text("from tests.conftest import pytest_runtest_makereport  # noqa\n")
    (tmp_path / "test_x.py").write_text(textwrap.dedent("""
        import pytest
        def test_cap(): pytest.skip("perf is not installed on this host")
        @pytest.mark.skipif(True, reason="needs root")
        def test_static(): pass
        def test_data(): pytest.skip("../shared fixtures absent: the third-party sysfs captures live beside the project")
        def test_driver(): pytest.skip("an NVIDIA driver is present")
    """))

    def run(env):
        return subprocess.run([PY, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)], cwd=tmp_path,
                              capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(REPO), **env))
    strict = run({"TRAINPROBE_REQUIRE_LIVE": "1"})
    assert strict.returncode != 0
    assert "1 failed" in strict.stdout and "1 error" in strict.stdout and "2 skipped" in strict.stdout, strict.stdout
    relaxed = run({"TRAINPROBE_REQUIRE_LIVE": "0"})
    assert relaxed.returncode == 0 and "4 skipped" in relaxed.stdout, relaxed.stdout


def test_make_test_does_not_change_the_host():
    r = subprocess.run(["make", "-n", "test"], cwd=REPO, capture_output=True, text=True,
                       env={k: v for k, v in os.environ.items() if k != "TRAINPROBE_PREPARE_HOST"})
    assert "prepare-host" not in r.stdout
    r = subprocess.run(["make", "-n", "test"], cwd=REPO, capture_output=True, text=True,
                       env=dict(os.environ, TRAINPROBE_PREPARE_HOST="1"))
    assert "prepare-host" in r.stdout
    ci = (REPO / ".ci" / "run").read_text()
    assert "TRAINPROBE_PREPARE_HOST=1" in ci and "TRAINPROBE_REQUIRE_LIVE=1" in ci


def test_writing_to_dev_null_or_a_pipe_leaves_the_device_in_place(tmp_path):
    """An output named /dev/null or a FIFO is written into, never replaced by a regular file."""
    output.write("/dev/null", "report")
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(open(fifo).read()))
    reader.start()
    output.write(str(fifo), "through the pipe")
    reader.join(5)
    assert got == ["through the pipe"] and stat.S_ISFIFO(os.stat(fifo).st_mode)
