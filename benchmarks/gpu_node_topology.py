"""On a GPU node: sysfs topology beside NVML's view of each GPU, and the PCIe link idle vs under load.

What it prints (and writes as JSON with --out):
1. the topology probe's reading of this host (NUMA nodes; each GPU's numa_node as sysfs reports it,
   local_cpulist, PCIe link current/max and the port above it);
2. NVML's view of each GPU (bus id in NVML's form, CPU affinity, memory affinity, NUMA node id, PCIe
   generation and width, current and max) and the join of the two by bus id, with every
   disagreement, as the numa.remote and pcie.degraded rules see them;
3. with --load (needs torch with CUDA): each GPU's link generation read from sysfs and NVML while
   idle and then while a matmul loop keeps it busy, so the power-saving speed drop the pcie rule
   allows for is measured, not assumed.

    python benchmarks/gpu_node_topology.py --load --out /tmp/gpu-topology.json
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from trainprobe.agent.combiners.gpu_locality import gpu_table  # noqa: E402
from trainprobe.agent.evidence import Evidence  # noqa: E402
from trainprobe.agent.rules import run_rules  # noqa: E402
from trainprobe.agent.rules.pcie_degraded import link_state  # noqa: E402
from trainprobe.probes.parsers import procfs  # noqa: E402
from trainprobe.probes.errors import Unavailable  # noqa: E402
from trainprobe.probes.support.nvml import Nvml, is_na  # noqa: E402
from trainprobe.probes.topology import parse_link_speed, pcie_gen, read_topology  # noqa: E402


def _mask_to_cpus(words: list[int], bits: int = 64) -> list[int]:
    """NVML affinity masks: element i holds CPUs (or nodes) i*64 .. i*64+63, bit j = item i*64+j."""
    out = []
    for i, w in enumerate(words):
        for j in range(bits):
            if int(w) >> j & 1:
                out.append(i * bits + j)
    return out


def nvml_gpus(n: Nvml) -> list[dict]:
    ncpu = os.cpu_count() or 1
    count = n.call("nvmlDeviceGetCount")
    gpus = []
    for i in range(0 if is_na(count) else count):
        h = n.call("nvmlDeviceGetHandleByIndex", i)
        pci = n.call("nvmlDeviceGetPciInfo", h)
        bus = None if is_na(pci) else pci.busId
        bus = bus.decode() if isinstance(bus, bytes) else bus
        cpu = n.call("nvmlDeviceGetCpuAffinity", h, math.ceil(ncpu / 64))
        mem = n.call("nvmlDeviceGetMemoryAffinity", h, 1, n.const("NVML_AFFINITY_SCOPE_NODE", 0))
        node = n.call("nvmlDeviceGetNumaNodeId", h)
        name, uuid = n.call("nvmlDeviceGetName", h), n.call("nvmlDeviceGetUUID", h)

        def val(x):
            return None if is_na(x) else (x.decode() if isinstance(x, bytes) else x)
        gpus.append({
            "index": i, "name": val(name), "uuid": val(uuid), "bus_id": bus,
            "cpu_affinity": None if is_na(cpu) else procfs.format_cpulist(_mask_to_cpus(list(cpu))),
            "memory_affinity": None if is_na(mem) else procfs.format_cpulist(_mask_to_cpus(list(mem))),
            "numa_node": None if is_na(node) or node is None or int(node) < 0 else int(node),
            "pcie": {"gen": val(n.call("nvmlDeviceGetCurrPcieLinkGeneration", h)),
                     "width": val(n.call("nvmlDeviceGetCurrPcieLinkWidth", h)),
                     "max_gen": val(n.call("nvmlDeviceGetMaxPcieLinkGeneration", h)),
                     "max_width": val(n.call("nvmlDeviceGetMaxPcieLinkWidth", h))},
            "na": {k: str(v) for k, v in (("cpu_affinity", cpu), ("memory_affinity", mem), ("numa_node", node)) if is_na(v)},
        })
    return gpus


def link_now(n: Nvml, bdf: str, index: int) -> dict:
    s = procfs.try_read_text("/", f"sys/bus/pci/devices/{bdf}/current_link_speed")
    h = n.call("nvmlDeviceGetHandleByIndex", index)
    g = n.call("nvmlDeviceGetCurrPcieLinkGeneration", h)
    return {"sysfs_gen": pcie_gen(parse_link_speed(s)), "nvml_gen": None if is_na(g) else g}


def under_load(n: Nvml, rows: list[dict], seconds: float) -> list[dict]:
    import torch  # noqa: PLC0415 - only for --load
    out = []
    for r in rows:
        idle = link_now(n, r["bdf"], r["index"])
        stop = threading.Event()

        def spin(dev: int = r["index"]) -> None:
            a = torch.randn(8192, 8192, device=f"cuda:{dev}")
            host = torch.empty(256 << 20, dtype=torch.uint8).pin_memory()
            while not stop.is_set():
                a = a @ a
                a = a / a.norm()
                host.to(f"cuda:{dev}", non_blocking=True)       # keep the link itself busy too
            torch.cuda.synchronize(dev)

        th = threading.Thread(target=spin, daemon=True)
        th.start()
        time.sleep(seconds)
        busy = link_now(n, r["bdf"], r["index"])
        stop.set()
        th.join(timeout=30)
        out.append({"index": r["index"], "bdf": r["bdf"], "idle": idle, "busy": busy})
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--load", action="store_true", help="read each GPU's link idle and under load (torch+CUDA)")
    ap.add_argument("--load-seconds", type=float, default=3.0)
    ap.add_argument("--out", default=None, help="write everything as JSON here")
    a = ap.parse_args()
    result: dict = {"topology": read_topology("/")}
    topo = result["topology"]
    print(f"1. sysfs: {topo['numa_node_count']} NUMA node(s): "
          + "; ".join(f"node {x['node']} CPUs {x['cpus'] or '-'} {x['memory_mb']} MB" for x in topo["nodes"]))
    for d in topo["pci"]:
        ln = d["link"]
        print(f"   {d['kind']:<5} {d['bdf']} vendor {d['vendor']} numa_node {d['numa_node_reported']} "
              f"local_cpulist {d['local_cpulist']} link Gen{ln['cur_gen']} x{ln['cur_width']} of "
              f"Gen{ln['max_gen']} x{ln['max_width']} port {d['upstream_link']}")
    try:
        with Nvml() as n:
            result["nvml_gpus"] = nvml_gpus(n)
            ev = Evidence(parsed={"topology": topo, "gpu": {"gpus": result["nvml_gpus"]}})
            rows, notes = gpu_table(ev)
            print("2. NVML joined with sysfs by bus id:")
            for r, g in zip(rows, result["nvml_gpus"]):
                st = link_state(r)
                print(f"   GPU {r['index']} {g['name']} NVML bus id {g['bus_id']} -> sysfs {r['bdf']} "
                      f"({'found' if r['sysfs'] else 'NOT under /sys/bus/pci/devices'}); node {r['node']} from "
                      f"{r['node_source']}; NVML CPU affinity {g['cpu_affinity']}, memory affinity "
                      f"{g['memory_affinity']}, NUMA id {g['numa_node']}; link Gen{st['cur_gen']} x{st['cur_width']} "
                      f"of Gen{st['max_gen']} x{st['max_width']}")
            findings, runs = run_rules(ev)
            print("   disagreements: " + ("; ".join(notes) if notes else "none"))
            print("   notes: " + ("; ".join(ev.notes) if ev.notes else "none"))
            print("   rules: " + ", ".join(f"{r.finding_id} {r.status}" for r in runs
                                             if r.finding_id in ("numa.remote", "pcie.degraded")))
            result.update({"rows": [{k: v for k, v in r.items() if k not in ("sysfs", "nvml")} for r in rows],
                           "disagreements": notes, "notes": ev.notes,
                           "findings": [f.to_dict() for f in findings]})
            if a.load:
                result["load"] = under_load(n, rows, a.load_seconds)
                print("3. PCIe generation idle -> under load:")
                for x in result["load"]:
                    print(f"   GPU {x['index']} ({x['bdf']}): sysfs Gen{x['idle']['sysfs_gen']} -> "
                          f"Gen{x['busy']['sysfs_gen']}, NVML Gen{x['idle']['nvml_gen']} -> Gen{x['busy']['nvml_gen']}")
    except Unavailable as exc:
        print(f"2. NVML unavailable: {exc}")
        result["nvml_unavailable"] = str(exc)
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=1, default=str))
        print(f"written: {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
