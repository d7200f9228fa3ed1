"""The placement probe: on the project's two-moment torchrun tree, and on real processes."""
import json
import os
import threading
import time

import pytest

from trainprobe.probes.base import Capture, Recorder, WatchSpec
from trainprobe.probes.placement import PlacementProbe, capture_from_roots, parse_numa_maps
from tests.helpers import DATA

TOPO = DATA / "topo"
MOMENTS = [str(TOPO / "2s4g"), str(TOPO / "2s4g-t1")]
FIXTURE_SECRETS = ("fixture-secret-wandb-0c1d2e3f", "hf_fixtureSecretToken42", "WANDB_API_KEY", "HF_TOKEN", "/usr/local/bin:/usr/bin")


def placement(pid, roots=MOMENTS):
    cap = capture_from_roots(pid, roots)
    return cap, PlacementProbe.parse(cap)


def test_numa_maps_pages_by_node_data_apart_from_libraries():
    text = ("55d4c8a00000 default file=/usr/bin/python3.12 mapped=900 N0=600 N1=300 kernelpagesize_kB=4\n"
            "7f2a40000000 default file=/usr/lib/x86_64-linux-gnu/libcuda.so.580.159.04 mapped=10 N1=10 kernelpagesize_kB=4\n"
            "55d4ca000000 default heap anon=300 dirty=300 N0=100 N1=200 kernelpagesize_kB=4\n"
            "7f1b00000000 bind:1 file=/dev/shm/torch_1_2_0 dirty=50 mapmax=2 N1=50 kernelpagesize_kB=4\n"
            "7f0000000000 prefer:1 anon=2 dirty=2 N1=2 kernelpagesize_kB=2048\n"
            "7ffd5a000000 default stack anon=40 dirty=40 N0=40 kernelpagesize_kB=4\n"
            "7fff00000000 default\n")
    m = parse_numa_maps(text)
    kb = 1024
    assert m["data_bytes_by_node"] == {"0": 140 * 4 * kb, "1": 250 * 4 * kb + 2 * 2048 * kb}
    assert m["bytes_by_node"]["0"] == (600 + 140) * 4 * kb
    assert m["maps_cuda"] is True
    assert m["policies"] == {"default": 5, "bind:1": 1, "prefer:1": 1}
    assert parse_numa_maps("7f default file=/usr/lib/libc.so.6 N0=1\n")["maps_cuda"] is False


def test_torchrun_tree_target_launcher_ranks_workers_and_where_they_ran():
    cap, pl = placement(4000)
    assert pl["window_s"] == pytest.approx(2.0) and pl["samples"] == 2
    procs = {p["pid"]: p for p in pl["processes"]}
    assert procs[4000]["role"] == "main" and procs[4000]["local_rank"] is None
    assert [(p, procs[p]["role"], procs[p]["local_rank"]) for p in (4101, 4102, 4103, 4104)] == [
        (4101, "rank", 0), (4102, "rank", 1), (4103, "rank", 2), (4104, "rank", 3)]
    # Workers inherit LOCAL_RANK from their rank, and are still workers.
    assert all(procs[w]["role"] == "dataloader_worker" and procs[w]["rank_pid"] == w - 100
               for w in (4201, 4202, 4203, 4204))
    assert [r["local_rank"] for r in pl["ranks"]] == [0, 1, 2, 3]
    assert pl["ranks"][2]["members"] == [4103, 4203]
    assert pl["launcher"]["is_target"] and pl["launcher"]["torchrun"]
    r2 = procs[4103]
    assert (r2["cpus_allowed"], r2["mems_allowed"], r2["nodes_allowed"]) == ("0-7", "0", [0])
    assert r2["cpu_seconds_by_node"] == {"0": pytest.approx(2.13)}
    assert r2["cpu_seconds_by_cpu"] == {"0": pytest.approx(1.865), "1": pytest.approx(0.265)}   # tid 6103 moved 0 -> 1
    assert r2["main_thread_busy"] == pytest.approx(0.91)
    assert set(r2["memory"]["data_bytes_by_node"]) == {"0"}
    assert procs[4104]["cpu_seconds_by_node"] == {"1": pytest.approx(2.1)}
    assert procs[4204]["cpu_seconds_by_node"] == {"0": pytest.approx(1.49)}         # the drifted worker
    assert procs[4204]["cpus_ran_on"] == "3-4"
    assert procs[4101]["uses_cuda"] and not procs[4000]["uses_cuda"]
    assert procs[4101]["argv"] == ["/usr/bin/python3", "-u", "train.py", "--epochs", "10", "--batch-size", "256"]


def test_torchrun_tree_target_one_rank_finds_its_launcher():
    _, pl = placement(4103)
    assert pl["target_is_rank"]
    assert [r["pid"] for r in pl["ranks"]] == [4103] and pl["ranks"][0]["local_rank"] == 2
    assert pl["launcher"]["pid"] == 4000 and not pl["launcher"]["is_target"] and pl["launcher"]["torchrun"]
    assert pl["launcher"]["argv"][1] == "/usr/local/bin/torchrun"
    assert [p["role"] for p in pl["processes"]] == ["main", "dataloader_worker"]


def test_no_environment_value_but_the_two_named_leaves_the_probe():
    cap, pl = placement(4000)
    for blob in (json.dumps(cap.to_dict()), json.dumps(pl)):
        for secret in FIXTURE_SECRETS:
            assert secret not in blob
    assert "LOCAL_RANK" in json.dumps(cap.artifacts)          # the named one is kept


def test_placement_replays_from_its_stored_capture():
    cap, pl = placement(4000)
    assert PlacementProbe.parse(Capture.from_dict(json.loads(json.dumps(cap.to_dict())))) == pl


# -- real processes --------------------------------------------------------------------------------

def _capture_live(pid, window_s=2.0):
    cap = Capture("placement")
    # This host has one NUMA node, where numa_maps is skipped by default: read it to test the read.
    spec = WatchSpec(pid=pid, window_s=window_s, options={"numa_maps_one_node": True})
    PlacementProbe().capture(spec, Recorder(cap, threading.Event()),
                             time.monotonic() + window_s)
    return cap, PlacementProbe.parse(cap)


@pytest.mark.live
def test_live_workload_placement_and_only_named_environment(workload):
    secret = "tp-secret-7f3a9c"
    w = workload("--seconds", "60", "--num-workers", "1", "--sample-work", "3000",
                 env={"CUDA_VISIBLE_DEVICES": "0", "MY_API_TOKEN": secret, "AWS_SECRET_ACCESS_KEY": secret + "x"})
    cap, pl = _capture_live(w.pid)
    procs = {p["pid"]: p for p in pl["processes"]}
    main = procs[w.pid]
    assert main["role"] == "main" and main["cuda_visible_devices"] == "0" and main["local_rank"] is None
    status = open(f"/proc/{w.pid}/status").read()
    allowed = next(ln.split(":", 1)[1].strip() for ln in status.splitlines() if ln.startswith("Cpus_allowed_list"))
    assert main["cpus_allowed"] == allowed
    assert main["cpu_seconds"] > 0.1 and main["cpus_ran_on"]
    assert set(main["cpu_seconds_by_node"]) == {"0"}                  # one node here
    assert main["memory"]["data_bytes_by_node"].keys() == {"0"} and main["memory"]["data_bytes_by_node"]["0"] > 1 << 20
    workers = [p for p in pl["processes"] if p["role"] == "dataloader_worker"]
    assert len(workers) == 1 and workers[0]["rank_pid"] == w.pid and workers[0]["cpu_seconds"] > 0.1
    assert pl["samples"] >= 4 and 1.5 < pl["window_s"] < 3.5
    blob = json.dumps(cap.to_dict()) + json.dumps(pl)
    assert secret not in blob and "MY_API_TOKEN" not in blob and "AWS_SECRET" not in blob
    assert cap.meta["overhead"]["proc_reads"] > 0
    assert w.alive()


@pytest.mark.live
def test_live_probe_reports_a_vanished_target(workload):
    w = workload("--seconds", "60", "--sample-work", "0")
    w.stop()
    av = PlacementProbe().check(WatchSpec(pid=w.pid, window_s=1))
    assert not av.ok and str(w.pid) in av.reason


def test_a_huge_process_keeps_its_cpu_placement_but_skips_the_page_walk():
    from trainprobe.probes.placement import Sampler
    s = Sampler(4000, MOMENTS[0], numa_maps_max_rss_gb=2.0)          # ranks hold 2.5 GB, workers 0.9 GB
    s.sample(MOMENTS[0])
    s.sample(MOMENTS[1])
    s.finish(MOMENTS[1])
    pl = PlacementProbe.parse(Capture("placement", artifacts={"placement.json": json.dumps(s.artifact())}))
    procs = {p["pid"]: p for p in pl["processes"]}
    assert procs[4103]["memory"] is None and "2 GB" in procs[4103]["numa_maps_skipped"]
    assert procs[4103]["cpu_seconds_by_node"] == {"0": pytest.approx(2.13)}
    assert procs[4203]["memory"] is not None and procs[4203]["numa_maps_skipped"] is None
