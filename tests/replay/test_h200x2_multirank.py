"""A real 2-rank DDP job over NCCL on two H200s (tests/data/h200x2), re-diagnosed offline: every rank
found with its GPU, the starved rank named, the other rank's GPU time attributed to waiting for it."""
import json

import pytest

from tests.helpers import DATA, run_cli

X2 = DATA / "h200x2"


def report(name):
    r = run_cli("report", str(X2 / name), "--json")
    assert r.rc == 0, r.err
    return r.json()


def test_starved_rank_is_named_and_the_other_rank_waits_in_collectives():
    rep = report("starved-rank1.tar.gz")
    live = json.loads((X2 / "starved-rank1-launcher.json").read_text())
    ranks = {r["pid"] for r in rep["target"]["ranks"]}
    assert len(ranks) == 2 and ranks == {r["pid"] for r in live["target"]["ranks"]}
    f = rep["findings"][0]
    assert f["id"] == "dataloader.starved"
    straggler = f["details"]["rank_pid"]
    assert straggler in ranks and str(straggler) in f["title"] and "straggler" in f["title"]
    other = (ranks - {straggler}).pop()
    facts = {e["fact"]: e["value"] for e in f["evidence"]}
    own = [v for k, v in facts.items() if k.startswith(f"rank PID {other}: share waiting for or loading its own")]
    assert own == [0.0]                                   # not its own input pipeline
    wait = [v for k, v in facts.items() if k.startswith(f"rank PID {other}: GPU") and "collectives wait" in k]
    assert wait and wait[0] > 0.5                        # its GPU mostly waits in NCCL for the straggler
    assert f["expected_speedup"] > 2.0


def test_by_rank_pid_the_whole_job_is_watched():
    rep = json.loads((X2 / "starved-rank1-rank.json").read_text())
    assert rep["target"]["requested_pid"] != rep["target"]["pid"]
    assert rep["target"]["requested_pid"] in {r["pid"] for r in rep["target"]["ranks"]}
    assert rep["findings"][0]["details"]["rank_pid"] in {r["pid"] for r in rep["target"]["ranks"]}


def test_every_rank_has_its_own_gpu():
    rep = json.loads((X2 / "starved-rank1-launcher.json").read_text())
    assert len(rep["host"]["gpus"]) == 2
    assert sorted(rep["gpu"]["target_gpus"]) == [0, 1]


def test_healthy_two_rank_job_is_compute_bound():
    rep = report("healthy.tar.gz")
    assert [f["id"] for f in rep["findings"]] == ["compute.bound"]


def test_no_numa_locality_means_no_numactl_line():
    # Firmware reports numa_node -1 for both GPUs on this node: unknown, never guessed.
    rep = report("starved-rank1.tar.gz")
    assert not [fx for f in rep["findings"] for fx in f["fixes"] if (fx.get("command") or "").startswith("numactl")]
    assert "numa.remote" not in [f["id"] for f in rep["findings"]]


def test_a_clock_throttled_gpu_names_its_rank_the_straggler():
    """The healthy capture with GPU 1's NVML clock reads as a driver returns them for a thermally slowed
    GPU (tests/data/h200x2/derive_clock_throttled.py): 1275 of 1980 MHz, reasons 0x60. The hosts' waits
    agree (both ranks compute-bound), so the straggler is named by its GPU's clocks."""
    rep = report("clock-throttled-rank1.tar.gz")
    ranks = {r["pid"] for r in rep["target"]["ranks"]}
    f = next(x for x in rep["findings"] if x["id"] == "rank.straggler")
    slow = f["details"]["rank_pid"]
    gpu_of = {p["pid"]: p["gpu_index"] for p in rep["gpu"]["processes"]} if rep.get("gpu", {}).get("processes") else {}
    assert slow in ranks and f["details"]["cause"] == "gpu_slower" and f["details"]["named_by"] == "gpu"
    c = f["details"]["causes"][0]
    assert c["evidence"]["index"] == 1 and c["evidence"]["sm_clock_mhz"] == 1275
    assert c["evidence"]["others_sm_clock_mhz"] == 1980
    assert set(c["evidence"]["reasons"]) == {"sw_thermal_slowdown", "hw_thermal_slowdown"}
    assert "cooling" in c["fix"] and c["command"].startswith("nvidia-smi -q -i 1")
    # busy x (1 - 1275/1980) of the step: about 1.5x
    assert 1.4 < f["expected_speedup"] < 1.7
    assert not gpu_of or gpu_of.get(slow, 1) == 1


def test_no_straggler_in_the_healthy_job_and_the_clock_fields_replay():
    rep = report("healthy.tar.gz")
    assert "rank.straggler" not in [f["id"] for f in rep["findings"]]
    from trainprobe.agent import bundle
    from trainprobe.probes.gpu import GpuProbe
    caps = {c.probe: c for c in bundle.load(str(X2 / "clock-throttled-rank1.tar.gz")).captures}
    per = GpuProbe.parse(caps["gpu"])["per_gpu"]
    assert per[1]["sm_clock_mhz_mean"] == 1275 and per[0]["sm_clock_mhz_mean"] == 1980
    assert per[0]["max_sm_clock_mhz"] == 1980 and per[1]["pcie_replays"] == 0 and per[1]["ecc_uncorrected"] == 0
    assert per[1]["clocks_event_reasons"] == {"sw_thermal_slowdown": 1.0, "hw_thermal_slowdown": 1.0}
    # A capture from before the clock reads replays with the fields unknown, not wrong.
    old = {c.probe: c for c in bundle.load(str(X2 / "healthy.tar.gz")).captures}
    p0 = GpuProbe.parse(old["gpu"])["per_gpu"][0]
    assert p0["sm_clock_mhz_mean"] is None and p0["pcie_replays"] is None
