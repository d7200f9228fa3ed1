"""End to end: a real Python job holds credentials of many shapes in its argv, its environment, its
thread names and a source line; `trainprobe diagnose --json --save B.tar.gz --html H` runs on it
through the real command line. No secret value may appear in what it printed, in the HTML, or in
any member of the bundle; the redacted names (and the counts that are not secrets) must be there.
"""
from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from tests.helpers import PY, REPO

HF = "hf_E2ESECREThfpositional0123456789"
GH = "ghp_E2ESECRETgithubthread0123456789abc"
OPENAI = "sk-E2ESECRETopenaithread0123456789"
JWT = "eyJE2ESECRETjwtheader01.eyJE2ESECRETjwtpayload01.E2ESECRETjwtsig01"
ARGV = [
    "--passphrase=E2ESECRET01", "--pass", "E2ESECRET02", "--db-pass=E2ESECRET03", "--authorization=E2ESECRET04",
    "--tokens=E2ESECRET05", "--bearer", "E2ESECRET06", "-p", "E2ESECRET07", "--api-keys=E2ESECRET08",
    "--secrets=E2ESECRET09", "--passwords=E2ESECRET10", "--cookies=E2ESECRET11", "--password", "-x9E2ESECRET12",
    "--header", "Authorization: Bearer E2ESECRET13", '--conf={"password": "E2ESECRET14", "lr": 0.1}',
    "api_key: E2ESECRET15", "https://alice:E2ESECRET16@hub.example/m?token=E2ESECRET17&sig=E2ESECRET18",
    "--api-key=E2ESECRET19", "--hf-token", "E2ESECRET20", HF, "--max-tokens", "512", "--num-workers", "0",
]
ENV = {"HF_TOKEN": "E2ESECRETenv21", "WANDB_API_KEY": "E2ESECRETenv22", "AWS_SECRET_ACCESS_KEY": "E2ESECRETenv23",
       "OPENAI_API_KEY": "E2ESECRETenv24", "MY_SERVICE_TOKEN": "E2ESECRETenv25", "DB_PASSWORD": "E2ESECRETenv26"}

JOB = r'''
import sys, threading, time
def spin():
    while True:
        y = sum(range(3000))
for name in ["cookie-thread Cookie: sid=E2ESECRETthread27", "tok %s" % sys.argv[1], "jwt %s" % sys.argv[2],
             "oa %s" % sys.argv[3]]:
    threading.Thread(target=spin, name=name, daemon=True).start()
print("READY", flush=True)
while True:
    x = sum(range(3000)); cfg = {"password": "E2ESECRETsource28"}
'''


@pytest.fixture
def planted_job(tmp_path):
    job = tmp_path / "job.py"
    job.write_text(JOB)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONUNBUFFERED": "1", **ENV}
    proc = subprocess.Popen([sys.executable, str(job), GH, JWT, OPENAI, *ARGV], cwd=str(tmp_path), env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.strip() == "READY", line
    time.sleep(0.3)
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def _secrets() -> list[str]:
    """Every planted value: the part of each that must not appear anywhere."""
    import re
    found = set(re.findall(r"E2ESECRET\w*?\d\d", " ".join(ARGV + list(ENV.values()) + [JOB, HF, GH, OPENAI, JWT])))
    return sorted(found)


@pytest.mark.live
def test_no_credential_shape_reaches_any_output(planted_job, tmp_path):
    if not (Path(PY).parent / "py-spy").exists() and shutil.which("py-spy") is None:
        pytest.skip("py-spy is not installed")
    if os.geteuid() != 0:
        pytest.skip("needs root: py-spy attaches to the job")
    bundle, page = tmp_path / "b.tar.gz", tmp_path / "h.html"
    env = dict(os.environ, NO_COLOR="1", PYTHONPATH=str(REPO))
    env.pop("SUDO_UID", None)
    r = subprocess.run([PY, "-m", "trainprobe.agent", "diagnose", "--pid", str(planted_job.pid), "--duration", "2",
                        "--json", "--save", str(bundle), "--html", str(page)],
                       cwd=str(REPO), capture_output=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    rep = json.loads(r.stdout)
    assert {p["name"]: p["status"] for p in rep["probes"]}["pyspy"] == "ok"

    blobs = [("stdout", r.stdout), ("stderr", r.stderr), ("html", page.read_bytes())]
    with tarfile.open(bundle, "r:gz") as tar:
        members = [m for m in tar.getmembers() if m.isfile()]
        for m in members:
            fh = tar.extractfile(m)
            assert fh is not None
            blobs.append((m.name, fh.read()))
    assert any(n.endswith("pyspy.json") for n, _ in blobs), [n for n, _ in blobs]

    secrets = _secrets()
    assert len(secrets) >= 28, secrets
    for secret in secrets:
        leaks = [name for name, data in blobs if secret.encode() in data]
        assert not leaks, f"{secret} leaked into {leaks}"

    # The data did flow, so the test can fail: the names are there with their values hidden, the
    # counts kept, and the trace holds the threads and the source line.
    cmd = rep["target"]["cmdline"]
    for shown in ("--passphrase=***", "--pass ***", "-p ***", "--password ***", "--header Authorization: Bearer ***",
                  '--conf={"password": "***", "lr": 0.1}', "https://***@hub.example/m?token=***&sig=***",
                  "hf_***", "--max-tokens 512", "--num-workers 0"):
        assert shown in cmd, (shown, cmd)
    everything = b"\n".join(data for _, data in blobs)
    for shown in (b"ghp_***", b"eyJ***", b"sk-***", b"Cookie: ***"):
        assert shown in everything, shown
