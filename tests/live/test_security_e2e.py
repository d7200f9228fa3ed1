"""End to end: a job run by an unprivileged user plants secrets in its argv, its environment, its
thread names and its stack, and runs code whose frames are named after a root-only file and a FIFO.
trainprobe diagnoses it as root (--save, --html, --json, the terminal report, a .tar.gz bundle),
re-reads the bundle (`report`), and draws its flame graphs in every format. No secret and nothing of
the root-only file may appear in any byte trainprobe wrote or printed; the FIFO must not hang it.
"""
from __future__ import annotations

import gzip
import io
import os
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import pytest

from tests.helpers import PY, REPO

NOBODY = 65534
SECRETS = {
    "argv --api-key=": "ARGSECRETapikey1",
    "argv --hf-token": "ARGSECREThftoken2",
    "argv password=": "ARGSECRETpassword3",
    "argv URL user-info": "ARGSECRETurlpass4",
    "environment HF_TOKEN": "ENVSECREThf5",
    "environment AWS_SECRET_ACCESS_KEY": "ENVSECRETaws6",
    "thread name": "THREADSECRETname7",
    "source line": "SRCSECRETline8",
    "frame name (--redact)": "STACKSECRETfn9",
}
ROOT_FILE_CONTENT = "ROOTONLYCONTENTshadowline"

JOB = r'''
import sys, threading, time
def hot_STACKSECRETfn9():
    t0 = time.time()
    while True:
        x = sum(range(3000)); api_token = "SRCSECRETline8"
rootonly, fifo = sys.argv[1], sys.argv[2]
# Line 3 of each compiled unit spins: its frame is named after the given file, line 3.
src = "def spin():\n    while True:\n        y = sum(range(3000))\n"
ns1, ns2 = {}, {}
exec(compile(src, rootonly, "exec"), ns1)
exec(compile(src, fifo, "exec"), ns2)
threading.Thread(target=ns1["spin"], name="loader --auth-token=THREADSECRETname7 \x1b]0;pwned\x07\x1b[2J",
                 daemon=True).start()
threading.Thread(target=ns2["spin"], name="fifo-reader", daemon=True).start()
print("READY", flush=True)
hot_STACKSECRETfn9()
'''


def _nobody_python() -> str | None:
    for exe in ("/usr/bin/python3", sys.executable):
        r = subprocess.run([exe, "-c", "print(1)"], capture_output=True, user=NOBODY, group=NOBODY,
                           extra_groups=[], cwd="/")
        if r.returncode == 0:
            return exe
    return None


@pytest.fixture
def planted_job():
    if os.geteuid() != 0:
        pytest.skip("needs root: the job runs as another user and trainprobe as root")
    exe = _nobody_python()
    if exe is None:
        pytest.skip("no python3 that an unprivileged user may run")
    d = Path(tempfile.mkdtemp(prefix="trainprobe-sec-", dir="/tmp"))
    d.chmod(0o755)
    job = d / "job.py"
    job.write_text(JOB)
    job.chmod(0o644)
    secret_dir = d / "rootonly"
    secret_dir.mkdir(mode=0o755)
    rootonly = secret_dir / "shadow"
    rootonly.write_text("\n".join([ROOT_FILE_CONTENT + "1", ROOT_FILE_CONTENT + "2", ROOT_FILE_CONTENT + "3",
                                   ROOT_FILE_CONTENT + "4"]) + "\n")
    rootonly.chmod(0o600)
    fifo = d / "fifo"
    os.mkfifo(fifo, 0o666)
    argv = [exe, str(job), str(rootonly), str(fifo), "--api-key=" + SECRETS["argv --api-key="],
            "--hf-token", SECRETS["argv --hf-token"], "password=" + SECRETS["argv password="],
            f"https://alice:{SECRETS['argv URL user-info']}@hub.example/org/model"]
    env = {"PATH": "/usr/bin:/bin", "HF_TOKEN": SECRETS["environment HF_TOKEN"],
           "AWS_SECRET_ACCESS_KEY": SECRETS["environment AWS_SECRET_ACCESS_KEY"], "PYTHONUNBUFFERED": "1"}
    # argv[1:3] are the job's own arguments; the rest are there to be seen in /proc/PID/cmdline.
    proc = subprocess.Popen(argv, cwd=str(d), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            user=NOBODY, group=NOBODY, extra_groups=[])
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.strip() == "READY", line
    time.sleep(0.5)
    try:
        yield proc, d, rootonly
    finally:
        proc.kill()
        proc.wait()
        shutil.rmtree(d, ignore_errors=True)


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ, NO_COLOR="1", PYTHONPATH=str(REPO))
    env.pop("SUDO_UID", None)
    return subprocess.run([PY, "-m", "trainprobe.agent", *args], cwd=str(REPO), capture_output=True, timeout=timeout, env=env)


def _all_bytes(out: Path, printed: list[bytes]) -> list[tuple[str, bytes]]:
    """Every byte trainprobe produced: what it printed, every file it wrote, every member of every
    archive (decompressed)."""
    blobs = [(f"printed #{i}", b) for i, b in enumerate(printed)]
    for p in sorted(out.rglob("*")):
        if not p.is_file():
            continue
        data = p.read_bytes()
        blobs.append((str(p), data))
        if p.name.endswith((".tar.gz", ".tgz")):
            with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
                for m in tar.getmembers():
                    fh = tar.extractfile(m)
                    if fh is not None:
                        blobs.append((f"{p}:{m.name}", fh.read()))
            blobs.append((f"{p} (gunzipped)", gzip.decompress(data)))
    return blobs


@pytest.mark.live
@pytest.mark.slow
def test_no_secret_and_no_root_only_file_in_any_output(planted_job, tmp_path):
    if not (Path(PY).parent / "py-spy").exists() and shutil.which("py-spy") is None:
        pytest.skip("py-spy is not installed")
    proc, jobdir, rootonly = planted_job
    out = tmp_path / "out"
    out.mkdir()
    redact = ["--redact", r"STACKSECRET\w*"]
    printed: list[bytes] = []

    t0 = time.monotonic()
    r = _cli("diagnose", "--pid", str(proc.pid), "--duration", "3", "--json", *redact,
             "--save", str(out / "bundle"), "--html", str(out / "report.html"))
    assert time.monotonic() - t0 < 90, "a frame named after a FIFO must not hang the probe"
    printed += [r.stdout, r.stderr]
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    import json
    rep = json.loads(r.stdout)
    assert {p["name"]: p["status"] for p in rep["probes"]}["pyspy"] == "ok"
    # The data did flow: the redacted command line is there, with its names.
    assert "--api-key=***" in rep["target"]["cmdline"] and "--hf-token ***" in rep["target"]["cmdline"]

    r = _cli("diagnose", "--pid", str(proc.pid), "--duration", "2", *redact, "--save", str(out / "bundle.tar.gz"))
    printed += [r.stdout, r.stderr]
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    assert b"\x1b" not in r.stdout and b"\x07" not in r.stdout, "escapes from a thread name reached the terminal"

    r = _cli("report", str(out / "bundle"), "--json", "--html", str(out / "report2.html"))
    printed += [r.stdout, r.stderr]
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    r = _cli("report", str(out / "bundle.tar.gz"))
    printed += [r.stdout, r.stderr]
    assert r.returncode == 0, r.stderr.decode(errors="replace")

    r = _cli("flamegraph", "--pid", str(proc.pid), "--duration", "2", "--threads", "--subprocesses", *redact,
             "-o", str(out / "live.svg"))
    printed += [r.stdout, r.stderr]
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    for fmt, name in (("svg", "fg.svg"), ("html", "fg.html"), ("speedscope", "fg.json"), ("folded", "fg.folded")):
        r = _cli("flamegraph", "--input", str(out / "bundle"), "--threads", "--subprocesses", "--format", fmt,
                 "-o", str(out / name))
        printed += [r.stdout, r.stderr]
        assert r.returncode == 0, (fmt, r.stderr.decode(errors="replace"))
    r = _cli("flamegraph", "--input", str(out / "bundle.tar.gz"), "--threads", "--format", "folded")
    printed += [r.stdout, r.stderr]
    assert r.returncode == 0

    blobs = _all_bytes(out, printed)
    assert len(blobs) > 15
    for what, secret in SECRETS.items():
        leaks = [name for name, data in blobs if secret.encode() in data]
        assert not leaks, f"the {what} secret leaked into {leaks}"
    leaks = [name for name, data in blobs if ROOT_FILE_CONTENT.encode() in data]
    assert not leaks, f"the root-only file's content leaked into {leaks}"

    # The frames were seen (so the test could fail), and the skip is explained.
    cap = json.loads((out / "bundle" / "captures" / "pyspy.json").read_text())
    trace = cap["artifacts"]["chrometrace.json"]
    assert str(rootonly) in trace and "hot_***" in trace
    skipped = json.loads(cap["artifacts"]["source_skipped.json"])
    assert "may not read" in skipped[str(rootonly)]
    assert "not a regular file" in skipped[str(jobdir / "fifo")]
    assert any('api_token = "***"' in v for v in json.loads(cap["artifacts"]["source_lines.json"]).values())

    # Everything written holds stacks and argv: private files, in a private bundle directory.
    for p in out.rglob("*"):
        want = 0o700 if p.is_dir() else 0o600
        assert stat.S_IMODE(p.stat().st_mode) == want, p
