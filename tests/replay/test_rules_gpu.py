"""The GPU-side rules on the real H200 captures (NVML streams + py-spy, on one clock): each mode
gets the finding a live run should give, with a number derived from the attribution."""
import re

import pytest

from trainprobe.agent import evidence
from trainprobe.agent.report import diagnose
from trainprobe.agent.rules import all_rules
from tests.helpers import (H200_MODES, h200_anchored_pyspy_capture, h200_evidence, h200_gpu_capture,
                           h200_nvml)

# What the captures measured (tests/data/h200/README.md): the fixes' real worth.
MEASURED = {"starved->fixed": 217.0 / 34.8, "pageable->pinned": 124.9 / 20.9}


def findings(mode, **kw):
    f, runs = diagnose(h200_evidence(mode, **kw))
    errors = [r for r in runs if r.status == "error"]
    assert not errors, errors
    return f


def ids(mode):
    return [f.id for f in findings(mode)]


def test_starved_top_finding_is_dataloader_starved_with_gpu_evidence():
    f = findings("starved")
    top = f[0]
    assert top.id == "dataloader.starved"
    facts = {e.fact: e.value for e in top.evidence}
    assert any(e.probe == "gpu+pyspy" and "idled while the loop loaded" in e.fact for e in top.evidence)
    assert any("NVML sample period" in k for k in facts)
    # The GPU side is evidence, not a cap: the model's estimate may exceed 1/(1-x) of the GPU's idle share.
    assert ": <= " not in top.speedup_bound and "an estimate" in top.speedup_bound
    # The fix measured 6.24x on this capture's node: inside the finding's interval.
    lo, hi = top.interval
    assert lo <= MEASURED["starved->fixed"] <= hi, (top.expected_speedup, top.interval)
    assert "pin_memory=True" in top.fixes[0].change


def test_healthy_is_compute_bound_and_nothing_else():
    f = findings("healthy")
    assert [x.id for x in f] == ["compute.bound"]
    facts = [e.fact for e in f[0].evidence]
    assert any("sw_power_cap" in x for x in facts)            # the GPU side's facts were merged in


def test_sync_is_launch_bound_or_sync():
    f = findings("sync")
    assert f[0].id in ("host.launch_bound", "host.sync")
    assert f[0].expected_speedup > 2.0
    assert "compute.bound" not in [x.id for x in f]
    assert any('torch.compile(model, mode="reduce-overhead")' in (fx.change or "") for fx in f[0].fixes)


def test_pageable_is_h2d_pageable_with_pcie_bound_and_pinning_fix():
    f = findings("pageable")
    top = f[0]
    assert top.id == "h2d.pageable"
    assert "pin_memory=True" in top.fixes[0].change and "non_blocking=True" in top.fixes[0].change
    assert top.details["pcie_rx_gbps"] == pytest.approx(7.3, abs=0.5)
    # The exact ceiling is a fact (Gen5 x16: 63.02 GB/s one way); the sentence rounds it to 3
    # significant digits, which the "<= N.Nx" beside it does not need more of.
    link = next(x for x in top.evidence if x.fact.startswith("PCIe link ceiling"))
    assert link.value == pytest.approx(63.02, abs=0.01)
    shown = re.search(r"the link's ([0-9.]+) GB/s instead of today's ([0-9.]+) GB/s: <= ([0-9.]+)x", top.speedup_bound)
    assert shown, top.speedup_bound
    assert float(shown.group(1)) == pytest.approx(link.value, rel=0.005)
    assert float(shown.group(3)) == pytest.approx(link.value / top.details["pcie_rx_gbps"], abs=0.06)
    assert 1 / 1.6 < top.expected_speedup / MEASURED["pageable->pinned"] < 1.6


def test_fixed_is_no_longer_starved():
    assert "dataloader.starved" not in ids("fixed")


def test_fixed_with_pinned_batches_is_not_called_pageable():
    # 14% of its loop is in x.cuda(non_blocking=True) from pinned memory: call overhead, not a copy stall.
    assert "h2d.pageable" not in ids("fixed")


def test_pinned_is_no_longer_pageable():
    f = findings("pinned")
    assert "h2d.pageable" not in [x.id for x in f]
    assert f[0].id == "compute.bound"


@pytest.mark.parametrize("mode", H200_MODES)
def test_every_gpu_finding_says_how_its_number_was_derived(mode):
    for f in findings(mode):
        assert f.speedup_bound and f.confidence in ("high", "medium", "low")
        assert all(e.probe in ("gpu", "pyspy", "process", "gpu+pyspy") for e in f.evidence)
        if f.id != "compute.bound":
            assert f.fixes


def test_a_busy_gpu_silences_a_host_that_waits_on_data():
    # The starved job's py-spy capture against the healthy job's NVML stream (99% busy), moved onto
    # its clock: the loop "waits" 90% of the time, yet the GPU never idles. No host problem to invent.
    spy = h200_anchored_pyspy_capture("starved")
    healthy = h200_nvml("healthy")
    spy.meta["launch_unix"] = healthy["started_unix_us"] / 1e6
    gpu = h200_gpu_capture("healthy")
    import json
    raw = json.loads(gpu.artifacts["nvml.json"])
    for row in raw["proc_util"]:
        row[1] = spy.meta["pid"]                 # the same process, as far as NVML is concerned
    raw["pid"] = spy.meta["pid"]
    gpu.artifacts["nvml.json"] = json.dumps(raw)
    ev = evidence.build([spy, gpu], {"cpus_available": 16, "uses_cuda": True})
    f, _ = diagnose(ev)
    assert [x.id for x in f] == ["compute.bound"]


def test_without_gpu_evidence_the_py_spy_rules_still_decide():
    ev = evidence.build([h200_anchored_pyspy_capture("starved")], {"cpus_available": 16, "uses_cuda": True})
    f, runs = diagnose(ev)
    assert f[0].id == "dataloader.starved"
    needs_gpu = {r.name for r in all_rules() if "gpu" in r.requires}
    skipped = [r for r in runs if r.rule in needs_gpu]
    assert skipped and all(r.status == "skipped" and "gpu: not run" in r.reason for r in skipped)
