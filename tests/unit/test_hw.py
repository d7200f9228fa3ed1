"""The hardware-facts layer (probes/parsers/hw.py): each fact defined once, pure, and right."""
import ast

import pytest

from trainprobe.probes.parsers import hw
from tests.helpers import REPO


def test_pcie_lane_bandwidth_follows_rate_and_line_code():
    # Gen5 x16 carries 63.0 GB/s per direction after 128b/130b coding; Gen1 x1 0.25 (8b/10b).
    assert hw.link_gbps(5, 16) == pytest.approx(63.015, abs=1e-3)
    assert hw.link_gbps(1, 1) == pytest.approx(0.25)
    assert hw.link_gbps(4, 16) == pytest.approx(31.51, abs=0.01)
    assert hw.link_gbps(6, 16) == pytest.approx(121.0, abs=0.01)       # FLIT mode, 242/256
    assert hw.link_gbps(None, 16) is None and hw.link_gbps(5, 0) is None and hw.link_gbps(9, 16) is None
    assert hw.link_gbps(True, 16) is None


def test_generation_from_sysfs_link_speed():
    assert [hw.link_gen(f"{r} GT/s PCIe") for r in ("2.5", "5.0", "8.0", "16.0", "32.0", "64.0")] == [1, 2, 3, 4, 5, 6]
    assert hw.link_gen("8 GT/s") == 3 and hw.link_gen("Unknown speed") is None and hw.link_gen(None) is None


def test_link_width_zero_is_a_down_link_or_unknown():
    assert hw.parse_link_width("16\n") == 16 and hw.parse_link_width("x8") == 8
    assert hw.parse_link_width("0") is None
    assert hw.parse_link_width("0", zero_is_unknown=False) == 0
    assert hw.parse_link_width("garbage") is None and hw.parse_link_width(None) is None


def test_nvml_and_sysfs_bus_ids_meet():
    assert hw.canonical_bdf("00000000:B1:00.0") == hw.canonical_bdf("0000:b1:00.0") == "0000:b1:00.0"
    assert hw.canonical_bdf("00010000:01:00.0") == "10000:01:00.0"


def test_nvml_affinity_words_and_sysfs_masks_give_the_same_cpus():
    words = [0xFFFF | (0xFFFF << 32)]                 # CPUs 0-15 and 32-47
    assert hw.cpulist_from_nvml_words(words) == "0-15,32-47"
    assert hw.cpus_from_nvml_words(words) == hw.parse_cpumask("0000ffff,0000ffff")
    assert hw.cpulist_from_nvml_words([0]) is None and hw.cpulist_from_nvml_words(None) is None
    assert hw.parse_cpus("0-3,8\x00\n") == [0, 1, 2, 3, 8] and hw.parse_cpus("bogus") == []


def test_clock_event_keys_and_labels_come_from_one_table():
    mask = 0x4 | 0x40
    assert hw.clock_event_keys(mask) == ["sw_power_cap", "hw_thermal_slowdown"]
    assert hw.clock_event_labels(mask) == ["SW power cap", "HW thermal slowdown"]
    assert hw.clock_event_keys(None) == [] and len({b for b, _, _ in hw.CLOCK_EVENTS}) == len(hw.CLOCK_EVENTS)


def test_hw_is_pure():
    tree = ast.parse((REPO / "probes" / "parsers" / "hw.py").read_text())
    mods = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    mods |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not mods & {"os", "subprocess", "ctypes", "psutil"}
    assert not any(isinstance(n, ast.Call) and getattr(n.func, "id", None) == "open" for n in ast.walk(tree))


@pytest.mark.parametrize("name", ["LANE_GBPS", "PCIE_LANE", "GEN_BY_GTS", "_GTS_TO_GEN", "CLOCK_EVENT_REASONS",
                                  "CLOCK_EVENTS", "pci_bdf_from_nvml", "words_to_cpus"])
def test_no_module_keeps_its_own_copy_of_a_hardware_fact(name):
    for path in [*REPO.joinpath("probes").rglob("*.py"), *REPO.joinpath("agent").rglob("*.py")]:
        if path.name == "hw.py":
            continue
        tree = ast.parse(path.read_text())
        defined = {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
        defined |= {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
        assert name not in defined, f"{path.relative_to(REPO)} defines {name}: use probes.parsers.hw"
