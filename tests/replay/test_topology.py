"""The topology probe on the project's own trees, on real third-party trees and on this host."""
import json
import re
import threading
import time
from pathlib import Path

import pytest

from trainprobe.probes.base import Capture, Recorder, WatchSpec
from trainprobe.probes.topology import (TopologyProbe, canonical_bdf, classify, link_gbps, parse_cpumask, parse_link_speed,
                             pcie_gen, read_topology)
from tests.helpers import DATA, H200, REPO, extracted_tree

TOPO = DATA / "topo"
HWLOC = REPO.parent / "shared" / "fixtures" / "sysfs"


def by_bdf(topo):
    return {d["bdf"]: d for d in topo["pci"]}


# -- pure helpers ----------------------------------------------------------------------------------

def test_bus_ids_of_nvml_and_sysfs_are_the_same_address():
    assert canonical_bdf("00000000:00:06.0") == "0000:00:06.0"
    assert canonical_bdf("0000:00:06.0") == "0000:00:06.0"
    assert canonical_bdf("00000000:B1:00.0") == "0000:b1:00.0"
    assert canonical_bdf("10000:01:00.0") == "10000:01:00.0"      # VMD domains have five digits
    assert canonical_bdf("pci0000:00") is None and canonical_bdf("") is None and canonical_bdf(None) is None


def test_link_speeds_widths_and_generations():
    assert parse_link_speed("8.0 GT/s PCIe\n") == 8.0
    assert parse_link_speed("2.5 GT/s") == 2.5
    assert parse_link_speed("Unknown speed") is None and parse_link_speed(None) is None
    assert [pcie_gen(x) for x in (2.5, 5.0, 8.0, 16.0, 32.0, 64.0)] == [1, 2, 3, 4, 5, 6]
    assert pcie_gen(None) is None
    assert link_gbps(4, 8) / link_gbps(4, 16) == pytest.approx(0.5)
    assert link_gbps(1, 16) / link_gbps(4, 16) == pytest.approx(0.25 / 1.969, rel=1e-3)


def test_cpumask_words_most_significant_first():
    assert parse_cpumask("0000,00000000,000000ff,ff000000,00000000,00000000\n") == list(range(88, 104))
    assert parse_cpumask("00000003") == [0, 1]
    assert parse_cpumask("") == [] and parse_cpumask("zz") == []


def test_classification_keeps_only_what_matters_for_placement():
    assert classify(0x10DE, 0x030200) == "gpu" and classify(0x10DE, 0x030000) == "gpu"
    assert classify(0x10DE, 0x040300) is None                 # a GPU's audio function
    assert classify(0x1A03, 0x030000) is None                 # a BMC's VGA
    assert classify(None, 0x030000) == "other"                # display controller of unknown vendor
    assert classify(0x15B3, 0x020700) == "ib" and classify(0x1077, 0x0C0600) == "ib"
    assert classify(0x15B3, 0x020000) == "ib" and classify(0x8086, 0x020000, rdma=True) == "ib"
    assert classify(0x8086, 0x020000) == "nic"
    assert classify(0x144D, 0x010802) == "nvme"
    assert classify(0x8086, 0x060400) is None and classify(0x8086, None) is None


# -- the project's own trees -----------------------------------------------------------------------

def test_two_socket_tree_nodes_and_devices():
    t = read_topology(str(TOPO / "2s4g"))
    assert t["numa_node_count"] == 2
    assert [(n["node"], n["cpus"], n["distances"]) for n in t["nodes"]] == [(0, "0-7", [10, 21]), (1, "8-15", [21, 10])]
    assert t["nodes"][0]["memory_mb"] == pytest.approx(64000.0)
    d = by_bdf(t)
    gpus = [x for x in t["pci"] if x["kind"] == "gpu"]
    assert [(g["bdf"], g["numa_node"], g["local_cpulist"]) for g in gpus] == [
        ("0000:18:00.0", 0, "0-7"), ("0000:3a:00.0", 0, "0-7"), ("0000:9a:00.0", 1, "8-15"), ("0000:ba:00.0", 1, "8-15")]
    assert t["gpu_count"] == 4
    assert d["0000:3c:00.0"]["kind"] == "ib" and d["0000:3c:00.0"]["names"] == ["ib0", "mlx5_0"]
    assert d["0000:bc:00.0"]["numa_node"] == 1 and d["0000:bc:00.0"]["vendor"] == "0x15b3"
    assert d["0000:02:00.0"]["kind"] == "nic" and d["0000:02:00.0"]["names"] == ["eth0"]
    assert d["0000:03:00.0"]["kind"] == "nvme"
    assert "0000:00:14.3" not in d and "0000:16:01.0" not in d     # USB controller, PCIe port
    g0 = d["0000:18:00.0"]
    assert g0["link"]["cur_gen"] == 4 and g0["link"]["cur_width"] == 16 and g0["link"]["max_gen"] == 4
    assert g0["upstream_link"] == {"bdf": "0000:16:01.0", "max_speed": 16.0, "max_gen": 4, "max_width": 16}
    assert t["notes"] == []


def test_degraded_tree_links_as_trained():
    d = by_bdf(read_topology(str(TOPO / "2s4g-degraded")))
    assert (d["0000:18:00.0"]["link"]["cur_width"], d["0000:18:00.0"]["link"]["max_width"]) == (8, 16)
    assert (d["0000:9a:00.0"]["link"]["cur_gen"], d["0000:9a:00.0"]["link"]["max_gen"]) == (1, 4)
    assert d["0000:ba:00.0"]["link"]["max_gen"] == 5 and d["0000:ba:00.0"]["upstream_link"]["max_gen"] == 4
    assert not [x for x in d.values() if x["kind"] == "ib" and x["numa_node"] == 0]


def test_h200_vm_tree_matches_the_captured_node_and_reports_unknown_locality():
    """The H200 VM's GPU reads numa_node -1: unknown (None), never guessed; its other facts match
    the real nvidia-smi -q and numactl -H captured on that node."""
    smi = (H200 / "host" / "nvidia-smi-q.txt").read_text()
    numactl = (H200 / "host" / "numactl-H.txt").read_text()
    bus_id = re.search(r"Bus Id\s+:\s+(\S+)", smi).group(1)
    gen_max = int(re.search(r"PCIe Generation\s+Max\s+:\s+(\d+)", smi).group(1))
    width_max = int(re.search(r"Link Width\s+Max\s+:\s+(\d+)x", smi).group(1))
    t = read_topology(str(TOPO / "h200-vm"))
    (gpu,) = [x for x in t["pci"] if x["kind"] == "gpu"]
    assert gpu["bdf"] == canonical_bdf(bus_id) == "0000:00:06.0"
    assert gpu["numa_node"] is None and gpu["numa_node_reported"] == -1
    assert (gpu["link"]["max_gen"], gpu["link"]["max_width"]) == (gen_max, width_max) == (5, 16)
    assert t["numa_node_count"] == 1 == int(re.search(r"available: (\d+) nodes", numactl).group(1))
    assert t["nodes"][0]["cpus"] == "0-15"
    assert t["notes"] == []          # -1 on a one-node host is harmless: nothing to warn about


def test_probe_capture_replays_to_the_same_evidence():
    """Through the real probe: capture under a root, store, reload from the dict, parse."""
    root = str(TOPO / "2s4g-degraded")
    cap = Capture("topology")
    TopologyProbe().capture(WatchSpec(pid=1, window_s=0.05, root=root), Recorder(cap, threading.Event()),
                            time.monotonic() + 0.05)
    assert {"sysfs.json", "links-end.json"} <= set(cap.artifacts)
    assert cap.provenance and all(p["kind"] == "file" for p in cap.provenance)
    replayed = TopologyProbe.parse(Capture.from_dict(json.loads(json.dumps(cap.to_dict()))))
    assert replayed == TopologyProbe.parse(cap)
    def links(t):
        return {d["bdf"]: {k: v for k, v in d["link"].items() if k != "samples"} for d in t["pci"]}
    assert links(replayed) == links(read_topology(root))
    assert all(d["link"]["samples"]["speed"][1] is not None for d in replayed["pci"] if d["link"]["cur_speed"])


def test_probe_says_why_it_cannot_run_without_sysfs(tmp_path):
    av = TopologyProbe().check(WatchSpec(pid=1, window_s=1, root=str(tmp_path)))
    assert not av.ok and "sysfs" in av.reason


# -- real trees from other machines (hwloc's captures), read in place --------------------------------

def _hwloc_tree(name, tmp_path):
    if not HWLOC.is_dir():
        pytest.skip(f"{HWLOC} is absent: the third-party sysfs captures live beside the project, not in it")
    return extracted_tree(HWLOC / f"{name}.tar.bz2")


def test_hwloc_two_node_xeon_infiniband_on_node_1(tmp_path):
    t = read_topology(_hwloc_tree("32em64t-2n8c+dax+nvme+mic+dimms", tmp_path))
    assert [(n["cpus"], n["distances"]) for n in t["nodes"]] == [("0-7", [10, 21]), ("8-15", [21, 10])]
    ib = [x for x in t["pci"] if x["kind"] == "ib"]
    assert len(ib) == 1 and ib[0]["vendor"] == "0x15b3" and ib[0]["numa_node"] == 1
    assert ib[0]["local_cpulist"] == "8-15" and "mlx4_0" in ib[0]["names"]
    nics = [x for x in t["pci"] if x["kind"] == "nic"]
    assert nics and all(x["numa_node"] == 0 and x["vendor"] == "0x8086" for x in nics)
    assert "eth0" in nics[0]["names"]
    nvme = [x for x in t["pci"] if x["kind"] == "nvme"]
    assert len(nvme) == 1 and nvme[0]["numa_node"] is None and nvme[0]["numa_node_reported"] == -1
    assert all(x["link"]["cur_speed"] is None for x in t["pci"])        # no link attributes captured


def test_hwloc_four_node_host_without_pci_locality(tmp_path):
    t = read_topology(_hwloc_tree("40intel64-2g2n4c+pcilocality", tmp_path))
    assert t["numa_node_count"] == 4 and sum(n["cpu_count"] for n in t["nodes"]) == 40
    assert t["nodes"][1]["cpus"] == "1,5,9,13,17,21,25,29,33,37"
    d = by_bdf(t)
    nics = [x for x in t["pci"] if x["kind"] == "nic"]
    assert len(nics) == 4 and all(x["numa_node"] is None and x["numa_node_reported"] == -1 for x in nics)
    slow = d["0000:03:00.1"]["link"]
    assert (slow["cur_speed"], slow["cur_width"], slow["cur_gen"]) == (2.5, 1, 1)
    assert slow["max_speed"] is None and slow["max_width"] is None      # missing attributes tolerated
    assert d["0000:43:00.0"]["kind"] == "ib" and d["0000:43:00.0"]["numa_node"] == 2
    assert any("numa_node -1" in n and "not guessed" in n for n in t["notes"])


def test_hwloc_power9_gpu_memory_nodes_have_no_cpus(tmp_path):
    t = read_topology(_hwloc_tree("nvidiagpunumanodes", tmp_path))
    ids = [n["node"] for n in t["nodes"]]
    assert ids == [0, 8, 250, 251, 252, 253, 254, 255]
    assert all(n["cpus"] == "" and n["memory_mb"] for n in t["nodes"] if n["node"] >= 250)
    assert any("250-255" in n and "no CPUs" in n for n in t["notes"])
    displays = [x for x in t["pci"] if x["kind"] == "other"]
    assert len(displays) == 6 and all(x["vendor"] is None and x["numa_node"] is None for x in displays)
    assert by_bdf(t)["0035:05:00.0"]["local_cpulist"] == "88-103"      # from the local_cpus mask


@pytest.mark.parametrize("name,nodes", [("64amd64-4s2n4ca2co", 8), ("16amd64-8n2c", 8)])
def test_hwloc_amd_many_node_hosts(tmp_path, name, nodes):
    t = read_topology(_hwloc_tree(name, tmp_path))
    assert t["numa_node_count"] == nodes
    for i, n in enumerate(t["nodes"]):
        assert len(n["distances"]) == nodes and n["distances"][i] == 10 and n["cpu_count"] > 0


# -- this host -----------------------------------------------------------------------------------

def test_live_host_topology_reads_without_guessing():
    t = read_topology("/")
    assert t["numa_node_count"] >= 1 and t["nodes"][0]["cpus"]
    for dev in t["pci"]:
        raw = Path(f"/sys/bus/pci/devices/{dev['bdf']}/numa_node")
        if raw.exists() and raw.read_text().strip() == "-1":
            assert dev["numa_node"] is None
        for attr, key in (("current_link_speed", "cur_speed"), ("max_link_width", "max_width")):
            if not Path(f"/sys/bus/pci/devices/{dev['bdf']}/{attr}").exists():
                assert dev["link"][key] is None
