"""Preflight fixtures: host trees (captured, plus failing overlays) and GPU reads built from the real
H200 captures in tests/data/h200 (`nvidia-smi -q`, `nvidia-smi topo -m`, the nvml.json device blocks).

The GPU reads are what probes/gpuhealth.read_gpus returns, filled from nvidia-smi's own text by a
small parser, so a failing variant is an edit of the real text (`Current : 16x` -> `8x`) and the
test shows the edit.
"""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

from tests.helpers import DATA, H200

PREFLIGHT = DATA / "preflight"
TREES = PREFLIGHT / "trees"
SMI_Q = (H200 / "host" / "nvidia-smi-q.txt").read_text()
NOT_SUPPORTED = {"na": "not supported on this GPU or driver"}


def tree(scenario: str, dst: Path) -> Path:
    """The captured base tree with a scenario's files laid over it."""
    shutil.copytree(TREES / "base", dst)
    if scenario != "base":
        shutil.copytree(TREES / scenario, dst, dirs_exist_ok=True)
    (dst / "sys/bus/pci/devices").mkdir(parents=True, exist_ok=True)
    return dst


# -- nvidia-smi -q ---------------------------------------------------------------------------------

def parse_smi_q(text: str) -> dict[str, Any]:
    """The indented `Key : Value` text -> nested dicts (one per section)."""
    root: dict[str, Any] = {}
    stack: list[tuple[int, dict[str, Any]]] = [(-1, root)]
    for line in text.splitlines():
        if not line.strip() or line.startswith("="):
            continue
        indent = len(line) - len(line.lstrip(" "))
        key, sep, val = line.strip().partition(" :")  # "GPU 00000000:00:06.0" is a section
        key = key.strip()
        while stack and indent <= stack[-1][0]:
            stack.pop()
        parent = stack[-1][1]
        if sep and val.strip():
            parent[key] = val.strip()
        else:
            child: dict[str, Any] = {}
            parent[key] = child
            stack.append((indent, child))
    return root


def _int(s: str) -> int:
    return int(re.match(r"-?\d+", s.strip()).group(0))


def _ecc_counts(block: dict[str, str]) -> dict[str, int]:
    sram_u = _int(block["SRAM Uncorrectable Parity"]) + _int(block["SRAM Uncorrectable SEC-DED"])
    return {"uncorrected": sram_u + _int(block["DRAM Uncorrectable"]),
            "corrected": _int(block["SRAM Correctable"]) + _int(block["DRAM Correctable"]),
            "dram_uncorrected": _int(block["DRAM Uncorrectable"]), "dram_corrected": _int(block["DRAM Correctable"]),
            "sram_uncorrected": sram_u, "sram_corrected": _int(block["SRAM Correctable"])}


EVENT_BITS = {"Idle": 0x1, "Applications Clocks Setting": 0x2, "SW Power Cap": 0x4, "HW Slowdown": 0x8,
              "Sync Boost": 0x10, "SW Thermal Slowdown": 0x20, "HW Thermal Slowdown": 0x40,
              "HW Power Brake Slowdown": 0x80, "Display Clock Setting": 0x100}
RECOVERY = {"None": 0, "GPU Reset": 1, "Node Reboot": 2, "Drain P2P": 3, "Drain and Reset": 4}


def _flatten(d: dict[str, Any]) -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v))
        else:
            out[k] = v
    return out


def gpu_read_from_smi(text: str = SMI_Q, cpulist: str = "0-15") -> dict[str, Any]:
    """nvidia-smi -q text -> a probes/gpuhealth read."""
    q = parse_smi_q(text)
    gpus = []
    for i, (key, g) in enumerate((k, v) for k, v in q.items() if k.startswith("GPU ")):
        events = _flatten(g["Clocks Event Reasons"])
        mask = sum(bit for name, bit in EVENT_BITS.items() if events.get(name) == "Active")
        link = g["PCI"]["GPU Link Info"]
        rr = g["Remapped Rows"]
        rp = g["Retired Pages"]
        fb = g["FB Memory Usage"]
        procs = g.get("Processes")
        proc_list = []
        if isinstance(procs, dict):
            for pk, pv in procs.items():
                if isinstance(pv, dict) and "Process ID" in pv:
                    used = pv.get("Used GPU Memory", "0 MiB")
                    proc_list.append({"pid": _int(pv["Process ID"]), "type": "compute",
                                      "used_memory_bytes": _int(used) << 20})
        pw = g["GPU Power Readings"]
        words = [0]
        for c in range(int(cpulist.split("-")[0]), int(cpulist.split("-")[-1]) + 1):
            words[0] |= 1 << c
        gpus.append({
            "index": i, "name": g["Product Name"], "uuid": g["GPU UUID"], "bus_id": key.split()[1],
            "vbios": g["VBIOS Version"],
            "persistence_mode": 1 if g["Persistence Mode"] == "Enabled" else 0,
            "compute_mode": 0, "mig_mode": [0, 0] if g["MIG Mode"]["Current"] == "Disabled" else [1, 1],
            "ecc_mode": [int(g["ECC Mode"]["Current"] == "Enabled"), int(g["ECC Mode"]["Pending"] == "Enabled")],
            "ecc": {"volatile": _ecc_counts(g["ECC Errors"]["Volatile"]),
                    "aggregate": _ecc_counts(g["ECC Errors"]["Aggregate"])},
            "remapped_rows": {"correctable": _int(rr["Correctable Error"]), "uncorrectable": _int(rr["Uncorrectable Error"]),
                              "pending": rr["Pending"] == "Yes", "failure": rr["Remapping Failure Occurred"] == "Yes"},
            "retired_pages": ({"single_bit": NOT_SUPPORTED, "double_bit": NOT_SUPPORTED, "pending": NOT_SUPPORTED}
                              if rp["Single Bit ECC"] == "N/A" else
                              {"single_bit": _int(rp["Single Bit ECC"]), "double_bit": _int(rp["Double Bit ECC"]),
                               "pending": rp["Pending Page Blacklist"] == "Yes"}),
            "recovery_action": RECOVERY[g["GPU Recovery Action"]],
            "clocks_event_reasons": mask,
            "sm_clock_mhz": _int(g["Clocks"]["SM"]), "sm_clock_max_mhz": _int(g["Max Clocks"]["SM"]),
            "temperature_c": _int(g["Temperature"]["GPU Current Temp"]),
            # nvidia-smi prints the slowdown threshold relative to T.Limit, not in degrees: unknown here.
            "temperature_slowdown_c": {"na": "not in this capture"},
            "temperature_shutdown_c": {"na": "not in this capture"},
            "power_mw": int(float(pw["Instantaneous Power Draw"].split()[0]) * 1000),
            "power_limit_mw": int(float(pw["Current Power Limit"].split()[0]) * 1000),
            "power_default_limit_mw": int(float(pw["Default Power Limit"].split()[0]) * 1000),
            "pcie": {"gen": _int(link["PCIe Generation"]["Current"]), "width": _int(link["Link Width"]["Current"]),
                     "max_gen": _int(link["PCIe Generation"]["Max"]), "max_width": _int(link["Link Width"]["Max"]),
                     "gpu_max_gen": _int(link["PCIe Generation"]["Device Max"]),
                     "replay_counter": _int(g["PCI"]["Replays Since Reset"])},
            "nvlink": {"supported": False, "reason": "not supported on this GPU or driver"},
            "processes": proc_list,
            "memory": {"total": _int(fb["Total"]) << 20, "used": _int(fb["Used"]) << 20,
                       "free": _int(fb["Free"]) << 20, "reserved": _int(fb["Reserved"]) << 20},
            "cpu_affinity": {"words": words, "cpulist": cpulist},
            "numa_node": NOT_SUPPORTED,
        })
    return {"schema": "trainprobe.gpuhealth/1", "read_unix": 0.0, "error": None, "driver": q["Driver Version"],
            "cuda_driver_version": 13000, "count": int(q["Attached GPUs"]), "gpus": gpus,
            "timing": {"system": 0.001, "ecc": 0.002, "pcie": 0.001}}


def gpu_read_from_nvml_block(mode: str, base: dict[str, Any] | None = None) -> dict[str, Any]:
    """Lay a captured nvml.json "device" block (taken while a workload ran) over the nvidia-smi read."""
    d = json.loads((H200 / mode / "nvml.json").read_text())["device"]
    read = json.loads(json.dumps(base or gpu_read_from_smi()))
    g = read["gpus"][0]
    g.update({"name": d["name"], "bus_id": d["busid"], "clocks_event_reasons": d["clocks_event_reasons"],
              "temperature_c": d["temp_c"], "power_mw": d["power_mw"], "persistence_mode": d["persistence"],
              "ecc_mode": json.loads(d["ecc_mode"])})
    g["pcie"].update({"gen": d["pcie_gen"], "width": d["pcie_width"], "max_gen": d["pcie_max_gen"],
                      "max_width": d["pcie_max_width"]})
    g["memory"]["used"] = d["mem_used"]
    read["driver"] = d["driver"]
    return read


def edit(text: str, section: str, key: str, value: str) -> str:
    """Change `key : ...` to `value` in the first occurrence after the line that starts `section`."""
    lines = text.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.strip().startswith(section))
    for i in range(start, len(lines)):
        k, sep, _v = lines[i].partition(" :")
        if sep and k.strip() == key:
            lines[i] = f"{k} : {value}"
            return "\n".join(lines) + "\n"
    raise KeyError(f"{section} / {key}")


def h200_pci() -> list[dict[str, Any]]:
    """The H200's PCI function as sysfs lists it (facts from nvidia-smi -q; link attributes not captured)."""
    return [{"bdf": "0000:00:06.0", "vendor": "0x10de", "device": "0x2335", "class": "0x030200", "driver": "nvidia",
             "numa_node": "-1", "local_cpulist": "0-15", "current_link_speed": None, "current_link_width": None,
             "max_link_speed": None, "max_link_width": None, "aer_dev_fatal": None, "aer_dev_nonfatal": None}]


def read_record(data: Any) -> dict[str, Any]:
    return {"data": data, "error": None, "timed_out": False, "seconds": 0.001, "timeout_s": 5.0}


def h200_raw(gpu_read: dict[str, Any] | None = None, gpubench: dict[str, Any] | None = None) -> dict[str, Any]:
    """A preflight raw file for the H200 node (16 CPUs, one NUMA node): GPU tier reads, plus the
    active tier's when given."""
    reads = {
        "nvml": read_record(gpu_read or gpu_read_from_smi()),
        "pci": read_record(h200_pci()),
        "cpus": read_record({"online": "0-15", "present": "0-15", "possible": "0-15", "job_cpus": "0-15",
                             "job_cpus_source": "given"}),
        "numa": read_record({"online": "0", "nodes": {"0": {"cpulist": "0-15"}}}),
    }
    if gpubench is not None:
        reads["gpubench"] = read_record(gpubench)
    return {"schema": "trainprobe.preflight.raw/1", "created_unix": 0.0,
            "host": {"hostname": "h200-node", "kernel": "6.8", "root": "/"},
            "context": {"root": "/", "disk_paths": [], "gpus": None, "tiers": ["gpu"]}, "reads": reads}
