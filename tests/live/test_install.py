"""A non-editable install of the checkout into a fresh virtual environment: only `trainprobe` lands
at the top of site-packages, and the installed console script diagnoses a live job and runs the
node health check."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import PY, REPO, start_workload

pytestmark = pytest.mark.live


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    venv = tmp_path_factory.mktemp("fresh") / "venv"
    subprocess.run([PY, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    vpy = venv / "bin" / "python"
    site = Path(subprocess.run([str(vpy), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    # The dependencies (click, psutil, py-spy, ...) and the build backend come from this
    # environment's site-packages, appended after the fresh one's own; this environment's pip builds
    # the checkout and installs it into the fresh one.
    (site / "zz-deps.pth").write_text("".join(p + "\n" for p in sys.path if p.endswith("site-packages")))
    r = subprocess.run([PY, "-m", "pip", "--python", str(vpy), "install", "-q", "--no-deps", "--no-build-isolation",
                        "--no-cache-dir", str(REPO)], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1"))
    assert r.returncode == 0, r.stderr[-3000:]
    return venv, site


def test_only_trainprobe_lands_at_the_top_of_site_packages(installed):
    _venv, site = installed
    top = {p.name for p in site.iterdir() if not p.name.endswith((".dist-info", ".pth")) and p.name != "__pycache__"}
    assert top == {"trainprobe"}, top
    assert {p.name for p in (site / "trainprobe").iterdir()} >= {"agent", "probes", "reports"}
    assert (site / "trainprobe" / "agent" / "preflight" / "profiles" / "default.toml").is_file()


def test_the_installed_command_diagnoses_a_live_job_and_runs_preflight(installed, tmp_path):
    venv, site = installed
    exe = str(venv / "bin" / "trainprobe")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
    # py-spy is a dependency: its binary comes with the dependencies, from this environment.
    env["PATH"] = os.pathsep.join([os.path.dirname(PY), env.get("PATH", "")])
    w = start_workload("--seconds", "60", "--num-workers", "0")
    try:
        r = subprocess.run([exe, "diagnose", "--pid", str(w.pid), "--duration", "2", "--json"], cwd=tmp_path,
                           capture_output=True, text=True, timeout=120, env=env)
        assert r.returncode == 0, r.stderr[-2000:]
        rep = json.loads(r.stdout)
        assert rep["target"]["pid"] == w.pid
        assert {p["name"]: p["status"] for p in rep["probes"]}["pyspy"] == "ok"
        assert w.alive()
    finally:
        w.stop()
    r = subprocess.run([exe, "preflight", "--json"], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                       env=env)
    assert r.returncode in (0, 1, 2, 3), r.stderr[-2000:]
    assert json.loads(r.stdout)["command"] == "preflight"
    # The code that ran is the installed copy, not the checkout.
    r = subprocess.run([str(venv / "bin" / "python"), "-c", "import trainprobe.agent as a; print(a.__file__)"],
                       cwd=tmp_path, capture_output=True, text=True, env=env, check=True)
    assert r.stdout.strip().startswith(str(site))
