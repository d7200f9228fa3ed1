"""pcie.degraded through the real topology reader and rule, on the project's degraded tree."""
import pytest

from trainprobe.agent.evidence import Evidence
from trainprobe.agent.rules import run_rules
from trainprobe.probes.placement import PlacementProbe, capture_from_roots
from trainprobe.probes.topology import read_topology
from tests.helpers import DATA

TOPO = DATA / "topo"
DEGRADED = str(TOPO / "2s4g-degraded")


def run(tree=DEGRADED, **parsed):
    ev = Evidence()
    ev.parsed["topology"] = read_topology(tree)
    for name, value in parsed.items():
        ev.put(name, value)
    findings, runs = run_rules(ev)
    assert {r.finding_id: r.status for r in runs}["pcie.degraded"] in ("fired", "quiet")
    return next((f for f in findings if f.id == "pcie.degraded"), None), ev


def links(f):
    return {x["bdf"]: x for x in f.details["links"]}


def test_downtrained_width_and_speed_found_slot_limit_and_nic_placement_noted():
    f, ev = run()
    assert f is not None
    got = links(f)
    assert set(got) == {"0000:18:00.0", "0000:9a:00.0"}                  # GPU 1 healthy, GPU 3 slot-limited
    assert (got["0000:18:00.0"]["cur_width"], got["0000:18:00.0"]["max_width"]) == (8, 16)
    assert got["0000:18:00.0"]["bandwidth_share"] == pytest.approx(0.5)
    assert (got["0000:9a:00.0"]["cur_gen"], got["0000:9a:00.0"]["max_gen"]) == (1, 4)
    assert got["0000:9a:00.0"]["bandwidth_share"] == pytest.approx(0.25 / 1.969, abs=0.001)
    assert f.confidence == "high"                                          # a width loss is never power saving
    assert f.expected_speedup == 1.0 and "not measured" in f.speedup_bound
    assert "2 GPU PCIe links" in f.title and "Gen1 x16 of Gen4 x16" in f.title
    facts = " | ".join(e.fact for e in f.evidence)
    assert "GPU 2 (0000:9a:00.0): its load was not measured" in facts
    assert any("scontrol update" in (fx.command or "") for fx in f.fixes)
    assert any("pcie.link.width.current" in (fx.command or "") for fx in f.fixes)
    notes = " | ".join(ev.notes)
    assert "GPU 3 (0000:ba:00.0) runs at Gen4 x16, the most the port above it (0000:b8:01.0) supports" in notes
    # IB only on node 1: GPUs 0 and 1 (node 0) are told where their nearest adapter is.
    assert "GPU 0 (0000:18:00.0) is on node 0, but no InfiniBand/RDMA adapter is: the nearest, ib1, mlx5_1 " \
           "(0000:bc:00.0), is on node 1" in notes
    assert "GPU 2 (0000:9a:00.0) is on node 1, but no" not in notes
    assert any("InfiniBand/RDMA adapter" in e.fact for e in f.evidence)   # and in the finding's evidence


def test_idle_gpu_speed_drop_is_a_note_busy_gpu_speed_drop_is_a_finding():
    idle = {"gpus": [], "utilization": {"2": [[1.0, 0], [1.2, 3]]}}
    f, ev = run(gpu=idle)
    assert set(links(f)) == {"0000:18:00.0"}
    assert any("GPU 2 (0000:9a:00.0) link at Gen1 of Gen4 while 2% busy" in n for n in ev.notes)
    busy = {"gpus": [], "utilization": {"2": [[1.0, 95], [1.2, 97]]}, "processes": []}
    f, _ = run(gpu=busy)
    assert links(f)["0000:9a:00.0"]["utilization_pct"] == pytest.approx(96.0)


def test_only_the_speed_drop_of_a_busy_gpu_is_medium_confidence():
    ev = Evidence()
    ev.parsed["topology"] = read_topology(DEGRADED)
    for d in ev.parsed["topology"]["pci"]:
        if d["bdf"] == "0000:18:00.0":
            d["link"]["cur_width"] = 16
    ev.put("gpu", {"gpus": [], "utilization": {"2": [[1.0, 90]]}})     # as JSON has it: the index a string
    findings, _ = run_rules(ev)
    f = next(f for f in findings if f.id == "pcie.degraded")
    assert f.confidence == "medium" and set(links(f)) == {"0000:9a:00.0"}


def test_measured_copy_share_gives_the_bound():
    """py-spy: 40% of the training thread in host-to-device copies, on GPU 0 (x8 of x16)."""
    roots = [DEGRADED, DEGRADED]
    placement = PlacementProbe.parse(capture_from_roots(7000, roots))
    spy = {"training_thread": {"pid": 7000, "breakdown": {"h2d_copy": 0.4, "forward": 0.6}}}
    gpu = {"gpus": [{"index": i, "bus_id": f"00000000:{b}:00.0", "numa_node": n,
                     "pcie": {"gen": 4, "width": 16, "max_gen": 4, "max_width": 16}}
                    for i, (b, n) in enumerate((("18", 0), ("3A", 0), ("9A", 1), ("BA", 1)))],
           "processes": [{"pid": 7000, "gpu_index": 0}]}
    gpu["gpus"][0]["pcie"]["width"] = 8
    f, ev = run(pyspy=spy, gpu=gpu, placement=placement)
    assert f.expected_speedup == pytest.approx(1 / (1 - 0.4 * 0.5), abs=0.01)
    assert "c=0.40" in f.speedup_bound and "q=0.50" in f.speedup_bound
    assert any("sysfs and NVML" in e.fact for e in f.evidence)
    # The single training process on node 0 with its GPU on node 0: not remote.
    assert not [x for x in run_rules(ev)[0] if x.id == "numa.remote"]


def test_nvml_seeing_full_speed_under_load_clears_a_sysfs_idle_reading():
    gpu = {"gpus": [{"index": 2, "bus_id": "00000000:9a:00.0", "pcie": {"gen": 4, "width": 16, "max_gen": 4,
                                                                        "max_width": 16}}]}
    f, _ = run(gpu=gpu)
    assert f is None or "0000:9a:00.0" not in links(f)


def test_healthy_host_is_quiet_and_has_no_nic_note():
    f, ev = run(str(TOPO / "2s4g"))
    assert f is None
    assert not [n for n in ev.notes if "InfiniBand" in n]
