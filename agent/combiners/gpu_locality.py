"""Where each GPU sits and which GPU each rank uses: sysfs, NVML and the placement probe joined.

A GPU's NUMA node comes from its sysfs `numa_node`; when the firmware reports -1, from NVML's node
if its CPU affinity lies within that node; on a host with one CPU node, that node; otherwise it is
unknown. sysfs and NVML are joined by PCI bus id, and every disagreement between them is a line for
the report's notes. Which GPU a process uses: NVML's process list when present; else the process's
CUDA_VISIBLE_DEVICES and LOCAL_RANK (the device a rank uses is visible[LOCAL_RANK], the torch
convention `torch.cuda.set_device(LOCAL_RANK)`), with CUDA ordinals taken in PCI bus order, the
order NVML and nvidia-smi use. Read by numa.remote and pcie.degraded.
"""
from __future__ import annotations

from typing import Any

from trainprobe.agent.evidence import Evidence
from trainprobe.probes.parsers import envvars, procfs
from trainprobe.probes.parsers.hw import canonical_bdf


def cpulist(text: str | None) -> list[int]:
    try:
        return procfs.parse_cpulist((text or "").strip())
    except ValueError:
        return []


def node_cpus(ev: Evidence) -> dict[int, list[int]]:
    topo = ev.get("topology") or {}
    if topo.get("nodes"):
        return {n["node"]: cpulist(n["cpus"]) for n in topo["nodes"]}
    pl = ev.get("placement") or {}
    return {int(n): cpulist(c) for n, c in (pl.get("nodes") or {}).items()}


def cpu_nodes(ev: Evidence) -> dict[int, int]:
    return {c: n for n, cpus in node_cpus(ev).items() for c in cpus}


def distance(ev: Evidence, a: int, b: int) -> int | None:
    nodes = (ev.get("topology") or {}).get("nodes") or []
    ids = [n["node"] for n in nodes]
    if a not in ids or b not in ids:
        return None
    row = nodes[ids.index(a)].get("distances") or []
    j = ids.index(b)
    return row[j] if j < len(row) else None


def _joined(ev: Evidence, notes: list[str]) -> list[dict[str, Any]]:
    """NVML's GPUs joined to sysfs's by bus id (a note for each one only one side sees); without
    NVML, sysfs's GPUs indexed in PCI bus order."""
    topo = ev.get("topology") or {}
    nv = (ev.get("gpu") or {}).get("gpus") or []
    sys_gpus = sorted((d for d in topo.get("pci", []) if d["kind"] == "gpu"), key=lambda d: d["bdf"])
    if not nv:
        return [{"index": i, "bdf": s["bdf"], "name": None, "uuid": None, "sysfs": s, "nvml": None,
                 "index_source": "PCI bus order (no NVML)"} for i, s in enumerate(sys_gpus)]
    by_bdf = {d["bdf"]: d for d in sys_gpus}
    rows: list[dict[str, Any]] = []
    for g in nv:
        bdf = canonical_bdf(g.get("bus_id"))
        s = by_bdf.get(bdf or "")
        rows.append({"index": g.get("index"), "bdf": bdf or g.get("bus_id"), "name": g.get("name"),
                     "uuid": g.get("uuid"), "sysfs": s, "nvml": g, "index_source": "NVML"})
        if topo and s is None:
            notes.append(f"NVML's GPU {g.get('index')} ({g.get('bus_id')}) is not under /sys/bus/pci/devices "
                         "(a container without the host's /sys?): its locality comes from NVML alone")
    seen = {r["bdf"] for r in rows}
    for s in sys_gpus:
        if s["bdf"] not in seen:
            notes.append(f"sysfs lists an NVIDIA GPU at {s['bdf']} that NVML does not report "
                         "(driver not bound, or the GPU has fallen off the bus)")
    return rows


def _place(r: dict[str, Any], ncpus: dict[int, list[int]], notes: list[str]) -> None:
    """Set a GPU row's NUMA node and where it came from; note where sysfs and NVML disagree."""
    s, g = r["sysfs"], r["nvml"]
    cpu_nodes_ = [n for n, c in ncpus.items() if c]
    sys_node = s["numa_node"] if s else None
    nv_node = g.get("numa_node") if g else None
    nv_cpus = set(cpulist(g.get("cpu_affinity"))) if g and g.get("cpu_affinity") else set()
    node, source = None, None
    if sys_node is not None:
        node, source = sys_node, "sysfs numa_node"
        if nv_node is not None and nv_node != sys_node:
            notes.append(f"GPU {r['index']} ({r['bdf']}): sysfs says NUMA node {sys_node}, NVML says {nv_node}")
    elif nv_node is not None and nv_node in ncpus and (not nv_cpus or nv_cpus <= set(ncpus[nv_node])):
        node, source = nv_node, "NVML (sysfs numa_node is -1)" if s else "NVML"
    elif len(cpu_nodes_) == 1:
        node, source = cpu_nodes_[0], "the host's only node with CPUs"
    if s and g and s.get("local_cpulist") and nv_cpus and set(cpulist(s["local_cpulist"])) != nv_cpus:
        notes.append(f"GPU {r['index']} ({r['bdf']}): sysfs local_cpulist {s['local_cpulist']} differs from "
                     f"NVML's CPU affinity {procfs.format_cpulist(sorted(nv_cpus))}")
    mem_aff = g.get("memory_affinity") if g else None
    if mem_aff not in (None, "") and node is not None:
        mem_nodes = set(cpulist(mem_aff)) if isinstance(mem_aff, str) else set(mem_aff)
        if mem_nodes and node not in mem_nodes:
            notes.append(f"GPU {r['index']} ({r['bdf']}): NVML's memory affinity (nodes "
                         f"{procfs.format_cpulist(sorted(mem_nodes))}) does not include node {node}")
    r["node"], r["node_source"] = node, source
    r["sysfs_numa_node_reported"] = s.get("numa_node_reported") if s else None


def gpu_table(ev: Evidence) -> tuple[list[dict[str, Any]], list[str]]:
    """Every GPU with its index, PCI address, NUMA node and where that node came from, joining
    sysfs and NVML by bus id; plus a line for every disagreement between the two."""
    notes: list[str] = []
    rows = _joined(ev, notes)
    ncpus = node_cpus(ev)
    for r in rows:
        _place(r, ncpus, notes)
    return rows, notes


def visible_devices(cvd: str | None) -> list[str] | None:
    return envvars.visible_devices(cvd)


def by_visible_entry(entry: str, rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    if entry.isdigit():
        return next((r for r in rows if r["index"] == int(entry)), None)
    if entry.startswith("GPU-"):
        return next((r for r in rows if r.get("uuid") and str(r["uuid"]).startswith(entry)), None)
    return None


def rank_gpu(ev: Evidence, unit: dict[str, Any], procs: dict[int, dict[str, Any]],
             rows: list[dict[str, Any]]) -> tuple[dict[str, Any] | None, str]:
    """The GPU a rank (or the single training process) uses, and how that was decided."""
    gpu = ev.get("gpu") or {}
    members = unit["members"]
    for pid in [unit["pid"]] + [m for m in members if m != unit["pid"]]:
        for p in gpu.get("processes") or []:
            if p.get("pid") == pid:
                row = next((r for r in rows if r["index"] == p.get("gpu_index")), None)
                if row:
                    return row, f"NVML's process list (PID {pid} on GPU {row['index']})"
    proc = procs[unit["pid"]]
    lr, cvd = proc.get("local_rank"), proc.get("cuda_visible_devices")
    vis = visible_devices(cvd)
    if vis is not None:
        if not vis or vis[0] in ("-1", "none", "NoDevFiles"):
            return None, f"CUDA_VISIBLE_DEVICES={cvd!r}: the process sees no GPU"
        if lr is not None and lr < len(vis):
            ordinal = lr
        elif len(vis) == 1:
            ordinal = 0
        elif lr is None:
            ordinal = 0
        else:
            return None, f"LOCAL_RANK={lr} is beyond CUDA_VISIBLE_DEVICES={cvd}"
        row = by_visible_entry(vis[ordinal], rows)
        if row is None:
            return None, f"CUDA_VISIBLE_DEVICES entry {vis[ordinal]!r} does not name a GPU found here"
        how = f"CUDA_VISIBLE_DEVICES={cvd}" + (f" and LOCAL_RANK={lr}" if lr is not None else "")
        return row, how + f" -> GPU {row['index']} ({row['index_source']})"
    if lr is not None:
        row = next((r for r in rows if r["index"] == lr), None)
        if row is None:
            return None, f"LOCAL_RANK={lr} but only {len(rows)} GPU(s) here"
        return row, f"LOCAL_RANK={lr} -> GPU {lr} (assumes torch.cuda.set_device(LOCAL_RANK); {row['index_source']})"
    main = (ev.get("process") or {})
    uses_cuda = proc.get("uses_cuda") or (main.get("pid") == proc["pid"] and main.get("uses_cuda"))
    if rows and uses_cuda:
        return rows[0], f"CUDA loaded, no CUDA_VISIBLE_DEVICES or LOCAL_RANK: assumes cuda:0 -> GPU {rows[0]['index']}"
    return None, "no sign of which GPU it uses (no NVML process entry, no CUDA_VISIBLE_DEVICES, no LOCAL_RANK)"
