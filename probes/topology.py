"""Topology probe: NUMA nodes, and where the GPUs, NICs, InfiniBand adapters and NVMe drives sit.

Reads, under a root (default "/"):
  sys/devices/system/node/{online,node*/cpulist,node*/distance,node*/meminfo}
  sys/bus/pci/devices/*/{vendor,class} of every PCI function, and for the ones that matter
  (NVIDIA GPUs, network and InfiniBand adapters, NVMe, accelerators) their device id, numa_node,
  local_cpulist (or the local_cpus mask), {current,max}_link_{speed,width}, and the maximum link
  of the port above them (so a GPU in a slower slot is told apart from a link that trained low)
  sys/class/{net,infiniband}/* links, to name the adapters.
The link state of those devices is read again at the end of the window: an idle GPU may drop
its link speed to save power, so a link is judged by the best state seen. Cost: one pass over a
few hundred small sysfs files at each end of the window; nothing is attached.

A `numa_node` of -1 means the firmware reports no locality (common in virtual machines): it is
reported as unknown (None), never guessed.
"""
from __future__ import annotations

import json
import os
import re
import time
from typing import Any

from trainprobe.probes.parsers import procfs
from trainprobe.probes.parsers.hw import (PCI_VENDOR_MELLANOX, PCI_VENDOR_NVIDIA, canonical_bdf, clean, link_gbps, parse_cpumask, parse_cpus, parse_link_speed,  # noqa: F401
                       parse_link_width, pcie_gen)
from trainprobe.probes.base import Availability, Capture, Probe, Recorder, WatchSpec
from trainprobe.probes.schema import TopologyEvidence
from trainprobe.probes.errors import parser

NODE_DIR = "sys/devices/system/node"
PCI_DIR = "sys/bus/pci/devices"
CLASS_LINKS = ("sys/class/net", "sys/class/infiniband")
ID_ATTRS = ("vendor", "class")
DEVICE_ATTRS = ("device", "numa_node", "local_cpulist", "local_cpus")
LINK_ATTRS = ("current_link_speed", "current_link_width", "max_link_speed", "max_link_width")
UPSTREAM_ATTRS = ("max_link_speed", "max_link_width")

VENDOR_NVIDIA, VENDOR_MELLANOX = PCI_VENDOR_NVIDIA, PCI_VENDOR_MELLANOX


# -- pure helpers --------------------------------------------------------------------------------


def parse_hex(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return int(clean(text) or "", 16)
    except ValueError:
        return None


def parse_int(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return int(clean(text) or "")
    except ValueError:
        return None


def classify(vendor: int | None, pci_class: int | None, rdma: bool = False) -> str | None:
    """The kind of a PCI function that matters for placement, or None for the rest.

    gpu: NVIDIA display (0x0300) or 3D (0x0302) controller. ib: InfiniBand controllers (0x0207,
    0x0c06) and network adapters that carry an RDMA device (InfiniBand or RoCE) or come from
    Mellanox. nic: other network controllers. nvme: 0x0108. other: processing accelerators
    (0x12), co-processors (0x0b40), NVIDIA bridges (NVSwitch) and display controllers of unknown
    vendor.
    """
    if pci_class is None:
        return None
    base, sub = pci_class >> 16, (pci_class >> 8) & 0xFF
    if base == 0x03 and sub in (0x00, 0x02):
        if vendor == VENDOR_NVIDIA:
            return "gpu"
        return "other" if vendor is None else None
    if (base, sub) in ((0x02, 0x07), (0x0C, 0x06)):
        return "ib"
    if base == 0x02:
        return "ib" if (rdma or vendor == VENDOR_MELLANOX) else "nic"
    if (base, sub) == (0x01, 0x08):
        return "nvme"
    if base == 0x12 or (base, sub) == (0x0B, 0x40) or (vendor == VENDOR_NVIDIA and base == 0x06):
        return "other"
    return None


def _bdf_in(link: str) -> str | None:
    """The last PCI address in a sysfs path: '../../devices/pci0000:80/0000:80:02.2/0000:82:00.0/net/ib0'."""
    found = None
    for part in link.split("/"):
        b = canonical_bdf(part)
        if b:
            found = b
    return found


# -- readers: a snapshot of the raw files under a root -------------------------------------------

def _listdir(root: str, rel: str) -> list[str]:
    try:
        return sorted(os.listdir(procfs.path(root, rel)))
    except OSError:
        return []


def _resolve_in_root(root: str, rel: str) -> str | None:
    """The real path of `rel` below `root`, relative to it; None if it leaves the root."""
    real_root = os.path.realpath(root)
    p = os.path.realpath(procfs.path(root, rel))
    if p == real_root or not p.startswith(real_root.rstrip("/") + "/"):
        return None
    return os.path.relpath(p, real_root)


def _read_into(files: dict[str, str | None], root: str, rel: str) -> str | None:
    text = procfs.try_read_text(root, rel)
    files[rel] = text
    return text


def snapshot(root: str = "/") -> dict[str, Any]:
    """Read the raw sysfs files the topology is built from. Missing files are recorded as None."""
    files: dict[str, str | None] = {}
    links: dict[str, str | None] = {}
    for rel in (f"{NODE_DIR}/online", f"{NODE_DIR}/possible", "sys/devices/system/cpu/online"):
        _read_into(files, root, rel)
    for name in _listdir(root, NODE_DIR):
        if re.fullmatch(r"node\d+", name):
            for attr in ("cpulist", "cpumap", "distance", "meminfo"):
                _read_into(files, root, f"{NODE_DIR}/{name}/{attr}")
    rdma_bdfs: set[str] = set()
    for cls_dir in CLASS_LINKS:
        for name in _listdir(root, cls_dir):
            rel = f"{cls_dir}/{name}"
            try:
                links[rel] = os.readlink(procfs.path(root, rel))
            except OSError:
                links[rel] = None
            if cls_dir.endswith("infiniband") and links[rel]:
                b = _bdf_in(links[rel] or "")
                if b:
                    rdma_bdfs.add(b)
    devices = _listdir(root, PCI_DIR)
    for bdf in devices:
        base = f"{PCI_DIR}/{bdf}"
        vendor = parse_hex(_read_into(files, root, f"{base}/vendor"))
        pci_class = parse_hex(_read_into(files, root, f"{base}/class"))
        if classify(vendor, pci_class, canonical_bdf(bdf) in rdma_bdfs) is None:
            continue
        for attr in DEVICE_ATTRS + LINK_ATTRS:
            _read_into(files, root, f"{base}/{attr}")
        real = _resolve_in_root(root, base)
        links[base] = real
        if real:
            parent = os.path.dirname(real)
            if canonical_bdf(os.path.basename(parent)):
                for attr in UPSTREAM_ATTRS:
                    _read_into(files, root, f"{parent}/{attr}")
    return {"files": files, "links": links, "pci_devices": devices}


def link_snapshot(root: str, snap: dict[str, Any]) -> dict[str, str | None]:
    """Re-read the current link state of the devices kept in `snap` (at the end of the window)."""
    out: dict[str, str | None] = {}
    for key in snap["files"]:
        if key.startswith(PCI_DIR + "/") and key.rsplit("/", 1)[-1] in ("current_link_speed", "current_link_width"):
            out[key] = procfs.try_read_text(root, key)
    return out


# -- the pure parser -----------------------------------------------------------------------------

def _meminfo_mb(text: str | None) -> float | None:
    if not text:
        return None
    m = re.search(r"MemTotal:\s+(\d+)\s*kB", text)
    return round(int(m.group(1)) / 1024.0, 1) if m else None


@parser("sysfs parse_snapshot")
def parse_snapshot(snap: dict[str, Any], end_links: dict[str, str | None] | None = None) -> dict[str, Any]:
    """Pure: raw sysfs files -> the `topology` evidence."""
    files: dict[str, str | None] = snap["files"]
    links: dict[str, str | None] = snap.get("links", {})
    end_links = end_links or {}
    notes: list[str] = []

    online = parse_cpus(files.get(f"{NODE_DIR}/online"))
    if not online:
        online = sorted(int(k.split("/")[4][4:]) for k in files
                        if k.startswith(NODE_DIR + "/node") and k.endswith("/cpulist"))
    nodes = []
    for n in online:
        base = f"{NODE_DIR}/node{n}"
        cpulist = files.get(f"{base}/cpulist")
        cpus = parse_cpus(cpulist) if clean(cpulist) else parse_cpumask(files.get(f"{base}/cpumap"))
        dist = [int(x) for x in (clean(files.get(f"{base}/distance")) or "").split() if x.lstrip("-").isdigit()]
        nodes.append({"node": n, "cpus": procfs.format_cpulist(cpus), "cpu_count": len(cpus),
                      "memory_mb": _meminfo_mb(files.get(f"{base}/meminfo")), "distances": dist})
    if not nodes:
        cpus = parse_cpus(files.get("sys/devices/system/cpu/online"))
        nodes.append({"node": 0, "cpus": procfs.format_cpulist(cpus), "cpu_count": len(cpus),
                      "memory_mb": None, "distances": [10]})
        notes.append("no NUMA information in sysfs (kernel without CONFIG_NUMA?): one node assumed")
    node_ids = [x["node"] for x in nodes]
    cpuless = [x["node"] for x in nodes if not x["cpu_count"]]
    if cpuless:
        notes.append(f"NUMA node(s) {procfs.format_cpulist(cpuless)} have memory but no CPUs "
                     "(device or accelerator memory): never a --cpunodebind target")

    names: dict[str, list[str]] = {}
    rdma: set[str] = set()
    for rel, target in links.items():
        for cls_dir in CLASS_LINKS:
            if rel.startswith(cls_dir + "/") and target:
                b = _bdf_in(target)
                if b:
                    names.setdefault(b, []).append(rel.rsplit("/", 1)[-1])
                    if cls_dir.endswith("infiniband"):
                        rdma.add(b)

    pci = []
    unknown_locality = []
    for bdf in snap.get("pci_devices", []):
        base = f"{PCI_DIR}/{bdf}"
        vendor = parse_hex(files.get(f"{base}/vendor"))
        pci_class = parse_hex(files.get(f"{base}/class"))
        cbdf = canonical_bdf(bdf) or bdf
        kind = classify(vendor, pci_class, cbdf in rdma)
        if kind is None:
            continue
        raw_node = parse_int(files.get(f"{base}/numa_node"))
        numa_node = raw_node if (raw_node is not None and raw_node >= 0) else None
        if numa_node is None and len(node_ids) > 1 and kind != "other":
            unknown_locality.append(cbdf)
        local = files.get(f"{base}/local_cpulist")
        if clean(local):
            local_cpulist = procfs.format_cpulist(parse_cpus(local)) or None
        else:
            mask = parse_cpumask(files.get(f"{base}/local_cpus"))
            local_cpulist = procfs.format_cpulist(mask) if mask else None
        link = _link(files, end_links, base)
        real = links.get(base)
        upstream = None
        if real:
            parent = os.path.dirname(real)
            if canonical_bdf(os.path.basename(parent)):
                up_speed = parse_link_speed(files.get(f"{parent}/max_link_speed"))
                up_width = parse_link_width(files.get(f"{parent}/max_link_width"))
                if up_speed is not None or up_width is not None:
                    upstream = {"bdf": canonical_bdf(os.path.basename(parent)), "max_speed": up_speed,
                                "max_gen": pcie_gen(up_speed), "max_width": up_width}
        pci.append({
            "bdf": cbdf, "kind": kind,
            "vendor": f"0x{vendor:04x}" if vendor is not None else None,
            "device": clean(files.get(f"{base}/device")) or None,
            "class": f"0x{pci_class:06x}" if pci_class is not None else None,
            "numa_node": numa_node,
            "numa_node_reported": raw_node,
            "local_cpulist": local_cpulist,
            "link": link, "upstream_link": upstream,
            "names": sorted(names.get(cbdf, [])),
        })
    if unknown_locality:
        notes.append(f"{len(unknown_locality)} device(s) report numa_node -1 on a {len(node_ids)}-node host "
                     "(the firmware gives no locality): their node is unknown, not guessed")
    gpus = [d for d in pci if d["kind"] == "gpu"]
    return {
        "numa_node_count": len(nodes),
        "nodes": nodes,
        "cpus_online": procfs.format_cpulist(parse_cpus(files.get("sys/devices/system/cpu/online"))) or None,
        "pci": pci,
        "gpu_count": len(gpus),
        "notes": notes,
    }


def _link(files: dict[str, str | None], end: dict[str, str | None], base: str) -> dict[str, Any]:
    speeds = [parse_link_speed(files.get(f"{base}/current_link_speed")),
              parse_link_speed(end.get(f"{base}/current_link_speed"))]
    widths = [parse_link_width(files.get(f"{base}/current_link_width")),
              parse_link_width(end.get(f"{base}/current_link_width"))]
    seen_speeds = [s for s in speeds if s is not None]
    seen_widths = [w for w in widths if w is not None]
    cur_speed = max(seen_speeds) if seen_speeds else None
    cur_width = max(seen_widths) if seen_widths else None
    max_speed = parse_link_speed(files.get(f"{base}/max_link_speed"))
    max_width = parse_link_width(files.get(f"{base}/max_link_width"))
    return {
        "cur_speed": cur_speed, "cur_width": cur_width, "max_speed": max_speed, "max_width": max_width,
        "cur_gen": pcie_gen(cur_speed), "max_gen": pcie_gen(max_speed),
        "samples": {"speed": speeds, "width": widths},
    }


def read_topology(root: str = "/") -> dict[str, Any]:
    """Read and parse in one go (tests, and callers outside a session)."""
    return parse_snapshot(snapshot(root))


class TopologyProbe(Probe):
    name = "topology"
    description = "NUMA nodes; NUMA locality and PCIe links of GPUs, NICs, InfiniBand adapters, NVMe (from sysfs)"
    needs = ("/sys readable",)
    cost = "negligible: a few hundred small sysfs reads at each end of the window"
    timeout_s = 10.0
    evidence_schema = TopologyEvidence
    cost_cpu_s_fixed = 0.01       # measured per 10 s window, capture and parse (docs/cost.md)

    def check(self, spec: WatchSpec) -> Availability:
        if not os.path.isdir(procfs.path(spec.root, "sys/devices/system")):
            return Availability.no(f"no sysfs at {procfs.path(spec.root, 'sys')}: mount /sys to see the topology")
        return Availability.yes()

    def capture(self, spec: WatchSpec, rec: Recorder, deadline_monotonic: float) -> None:
        t0 = time.time()
        snap = snapshot(spec.root)
        rec.note("file", f"{spec.root.rstrip('/')}/{NODE_DIR}/node*/{{cpulist,distance,meminfo}}, "
                 f"{spec.root.rstrip('/')}/{PCI_DIR}/*/{{vendor,class,numa_node,local_cpulist,*_link_*}}",
                 0, t0, time.time() - t0)
        rec.add("sysfs.json", json.dumps(snap))
        rec.wait_window(deadline_monotonic)
        t1 = time.time()
        rec.add("links-end.json", json.dumps(link_snapshot(spec.root, snap)))
        rec.note("file", f"{spec.root.rstrip('/')}/{PCI_DIR}/*/current_link_{{speed,width}}", 0, t1, time.time() - t1)

    @staticmethod
    def parse(capture: Capture) -> TopologyEvidence:
        snap = json.loads(capture.artifacts["sysfs.json"])
        end = json.loads(capture.artifacts["links-end.json"]) if "links-end.json" in capture.artifacts else {}
        return parse_snapshot(snap, end)
