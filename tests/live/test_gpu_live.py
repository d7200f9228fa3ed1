"""The gpu probe in a live diagnosis on this machine, which has no NVIDIA driver: the probe is
skipped with the precise reason and the rest of the diagnosis completes."""
import pytest

from trainprobe.agent.rules import all_rules
from tests.helpers import run_cli
from tests.replay.test_gpu_probe import _driver_present

pytestmark = [pytest.mark.live,
              pytest.mark.skipif(_driver_present(), reason="an NVIDIA driver is present: this is the no-driver path")]


def test_no_driver_skips_the_gpu_probe_and_the_diagnosis_completes(workload):
    w = workload("--seconds", "60", "--num-workers", "0")
    r = run_cli("diagnose", "--pid", str(w.pid), "--duration", "2.5", "--json")
    assert r.rc == 0, r.err
    rep = r.json()
    gpu = next(p for p in rep["probes"] if p["name"] == "gpu")
    assert gpu["status"] == "skipped"
    assert gpu["reason"].startswith("no NVIDIA driver") and "libnvidia-ml.so" in gpu["reason"]
    assert "gpu: skipped (no NVIDIA driver" in r.err
    assert rep["host"]["gpus"] == []
    assert {p["name"]: p["status"] for p in rep["probes"]}["pyspy"] == "ok"
    assert rep["findings"] and rep["findings"][0]["id"] == "dataloader.starved"
    needs_gpu = {r.name for r in all_rules() if "gpu" in r.requires}
    gpu_rules = [x for x in rep["rules"] if x["rule"] in needs_gpu]
    assert gpu_rules and all(x["status"] == "skipped" for x in gpu_rules)
    assert w.alive()
