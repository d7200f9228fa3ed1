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
