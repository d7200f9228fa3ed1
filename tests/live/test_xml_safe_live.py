"""A real job names its function, its code's file and its thread with characters XML 1.0 forbids,
and passes them in its argv: the HTML report and the flame graphs drawn from its real py-spy trace
stay well-formed, and show each odd character as a visible escape."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.helpers import PY, REPO

ODD = "\x01\x0b\x0c\x1b\x1f\ufffe\uffff"
SHOWN = "\\x01\\x0b\\x0c\\x1b\\x1f\\ufffe\\uffff"
ANY_FORBIDDEN = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")
JOB = r'''
import sys, threading, time
ODD = "\x01\x0b\x0c\x1b\x1f\ufffe\uffff"
def spin():
    while True:
        sum(range(3000))
spin.__code__ = spin.__code__.replace(co_name="spin" + ODD + "x", co_qualname="spin" + ODD + "x",
                                      co_filename=sys.argv[1] + "/f" + ODD + ".py")
def idle():
    while True:
        time.sleep(0.01)
threading.Thread(target=idle, name="thr" + ODD, daemon=True).start()
print("READY", flush=True)
spin()                      # the training thread: its flame graph is in the HTML report
'''


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, NO_COLOR="1", PYTHONPATH=str(REPO))
    return subprocess.run([PY, "-m", "trainprobe.agent", *args], cwd=str(REPO), capture_output=True, timeout=120,
                          env=env)


@pytest.mark.live
@pytest.mark.slow
def test_odd_names_of_a_real_job_keep_every_xml_output_well_formed(tmp_path):
    if not (Path(PY).parent / "py-spy").exists() and shutil.which("py-spy") is None:
        pytest.skip("py-spy is not installed")
    job = tmp_path / "job.py"
    job.write_text(JOB)
    proc = subprocess.Popen([PY, str(job), str(tmp_path), f"--tag={ODD}"], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "READY"
        out = tmp_path / "out"
        out.mkdir()
        r = _cli("diagnose", "--pid", str(proc.pid), "--duration", "2", "--probes", "pyspy",
                 "--html", str(out / "report.html"), "--save", str(out / "bundle"))
        assert r.returncode == 0, r.stderr.decode(errors="replace")
    finally:
        proc.kill()
        proc.wait()
    for fmt, name, extra in (("svg", "fg.svg", ["--threads"]), ("html", "fg.html", [])):
        r = _cli("flamegraph", "--input", str(out / "bundle"), "--format", fmt, "-o", str(out / name), *extra)
        assert r.returncode == 0, r.stderr.decode(errors="replace")

    svg_text = (out / "fg.svg").read_text(encoding="utf-8")
    assert not ANY_FORBIDDEN.search(svg_text)
    root = ET.parse(out / "fg.svg").getroot()
    titles = "\n".join(t.text or "" for t in root.iter("{http://www.w3.org/2000/svg}title"))
    assert f"spin{SHOWN}x" in titles and f"thr{SHOWN}" in titles and f"f{SHOWN}.py" in titles, titles[:2000]

    for name in ("report.html", "fg.html"):
        text = (out / name).read_text(encoding="utf-8")
        assert not ANY_FORBIDDEN.search(text), name
        svgs = [ET.fromstring(s) for s in re.findall(r"<svg\b.*?</svg>", text, flags=re.S)]
        assert svgs, name
        assert f"spin{SHOWN}x" in text, name
    assert f"--tag={SHOWN}" in (out / "report.html").read_text(encoding="utf-8")
