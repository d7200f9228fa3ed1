"""preflight on a node without GPUs: the default profile names the cpu-node profile, which ships and
runs the host checks only; the table wraps its cells instead of cutting them mid-word. Replayed from
this VM's saved preflight bundle (no NVIDIA PCI device, no driver)."""
import io
import json
import re

from trainprobe.agent.preflight import profile as profiles
from trainprobe.agent.preflight.engine import Context
from trainprobe.agent.preflight.runner import load_replay, run
from trainprobe.reports import output
from tests.helpers import run_cli
from tests.preflight_fixtures import PREFLIGHT

SAVED = PREFLIGHT / "bundle-vm"


def _checks(profile_name):
    res = run(Context(profile=profiles.load(profile_name)), ("host", "gpu"), replay=load_replay(str(SAVED)))
    return {r.check: r.result for r in res.records}


def test_default_profile_on_a_node_without_gpus_names_the_cpu_node_profile():
    r = _checks(None)["gpu.count"]
    assert r.status == "unknown"
    assert r.message.startswith("no GPU on this node (no NVIDIA PCI device")
    assert "--profile cpu-node" in r.remediation


def test_the_cpu_node_profile_ships_and_runs_host_checks_only():
    p = profiles.load("cpu-node")
    assert p["name"] == "cpu-node" and int(p["gpu"]["count"]) == 0
    checks = _checks("cpu-node")
    assert checks and not [c for c in checks if c.startswith(("gpu.", "active."))]
    assert "host.memory" in checks


def test_table_cells_wrap_instead_of_being_cut():
    r = run_cli("preflight", "--replay", str(SAVED), "--json")
    rep = json.loads(r.out)
    buf = io.StringIO()
    output.emit("preflight", "text", rep, buf)
    text = buf.getvalue()
    assert not re.search(r"\w\.\.\. ", text), "a cell was cut"
    gpu = next(c for c in rep["checks"] if c["check"] == "gpu.count")
    # Every word of the observed cell is in the table, in order.
    words = [w for ln in text.splitlines() for w in ln.split()]
    obs = gpu["observed"].split()
    joined = " ".join(words)
    assert " ".join(obs[:4]) in joined and obs[-1] in words
    assert max(len(ln) for ln in text.splitlines() if not ln.startswith(" " * 10 + "fix")) <= 140
