"""numa.remote: a rank, its DataLoader workers or its memory sit on a NUMA node other than its GPU's.

Which GPU a process uses and which node a GPU sits on come from agent/combiners/gpu_locality.py
(NVML's process list, else CUDA_VISIBLE_DEVICES and LOCAL_RANK in PCI bus order; sysfs numa_node,
else NVML's locality). Where a GPU's node is unknown the rule says so instead of guessing. The
commands it proposes are built in _numa_fixes.py.

The speedup model (stated in every finding's speedup_bound), per rank:
    h  share of the rank's step spent on host work: its main thread's on-CPU share of the window
       (py-spy's non-waiting share when py-spy watched that rank),
    r  remote share: the larger of the rank's CPU time on other nodes and its data pages
       (anonymous and shared memory) on other nodes,
    w, rw  share of the step the loop waits for its DataLoader workers (py-spy), and the workers'
       CPU time off the GPU's node,
    k  the SLIT distance ratio, remote over local, taken as the most a remote access can cost.
    speedup <= 1 / (1 - (h * r + w * rw) * (1 - 1/k))
It assumes all of that host time is memory traffic that runs k times slower off-node and sits on
the step's critical path: an upper bound. PyTorch's NUMA-binding documentation reports 1-10% as
typical, so the confidence is low, or medium when a binding plainly excludes the GPU's node.
"""
from __future__ import annotations

from typing import Any

from trainprobe.agent.combiners.gpu_locality import (cpu_nodes, cpulist, distance, gpu_table, node_cpus, rank_gpu,
                                                     visible_devices)
from trainprobe.agent.evidence import Evidence
from trainprobe.agent.findings import Fact, Finding, Fix, pct
from trainprobe.agent.rules import rule
from trainprobe.agent.rules._numa_fixes import WRAPPER, numactl_line, py_list, torchrun_command, wrapper_script

REMOTE_SHARE = 0.25          # a rank or its workers spend at least this share off the GPU's node
MIN_CPU_S = 0.1              # less CPU time than this over the window says nothing about placement
MIN_DATA_BYTES = 1 << 20     # fewer data bytes than this say nothing about memory placement
MEMBIND_FILL = 0.8           # above this share of a node's memory, propose --preferred over --membind
DEFAULT_K = 2.0              # remote/local cost when the firmware gives no distance table


# -- shares ---------------------------------------------------------------------------------------

def _off_share(by_node: dict[str, float], node: int, minimum: float) -> float | None:
    total = sum(by_node.values())
    if total < minimum:
        return None
    return sum(v for n, v in by_node.items() if int(n) != node) / total


def _sum_maps(maps: list[dict[str, float]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for m in maps:
        for k, v in m.items():
            out[k] = out.get(k, 0.0) + v
    return out


def _worst_k(ev: Evidence, g: int, remote_nodes: set[int]) -> tuple[float, str]:
    local = distance(ev, g, g)
    ratios = []
    for n in remote_nodes:
        d = distance(ev, g, n)
        if local and d:
            ratios.append((d / local, f"SLIT {d}/{local} between nodes {g} and {n}"))
    if not ratios:
        return DEFAULT_K, f"{DEFAULT_K:g} assumed (no distance table)"
    return max(ratios)


def _host_share(ev: Evidence, proc: dict[str, Any]) -> tuple[float | None, float, str]:
    """(h, w, where they came from) for one rank."""
    tt = (ev.get("pyspy") or {}).get("training_thread") or {}
    if tt.get("pid") == proc["pid"] and tt.get("breakdown"):
        bd = tt["breakdown"]
        w = float(bd.get("data_wait", 0.0))
        h = max(0.0, 1.0 - w - float(bd.get("host_sync", 0.0)))
        return h, w, "py-spy: training thread's share not waiting on the GPU or on workers"
    busy = proc.get("main_thread_busy")
    if busy is None:
        return None, 0.0, "unknown"
    return min(float(busy), 1.0), 0.0, "main thread's on-CPU share of the window (placement)"


def _cpu_by_node(p: dict[str, Any], cmap: dict[int, int]) -> dict[str, float]:
    """CPU seconds by node, recomputed with the topology's node map, the authority over the
    placement probe's own."""
    out: dict[str, float] = {}
    for c, s in (p.get("cpu_seconds_by_cpu") or {}).items():
        if int(c) in cmap:
            out[str(cmap[int(c)])] = out.get(str(cmap[int(c)]), 0.0) + s
    return out


def _locate(ev: Evidence, unit: dict[str, Any], proc: dict[str, Any], procs: dict[int, dict[str, Any]],
            rows: list[dict[str, Any]]) -> tuple[str, dict[str, Any], str] | None:
    """(label, GPU row, how the GPU was found) of a rank whose GPU's node is known; else a note."""
    label = (f"rank LOCAL_RANK={proc['local_rank']} (PID {proc['pid']})" if proc.get("local_rank") is not None
             else f"the training process (PID {proc['pid']})")
    row, how = rank_gpu(ev, unit, procs, rows)
    if row is None:
        ev.note(f"{label}: GPU not known ({how}); its placement was not judged")
        return None
    if row["node"] is None:
        ev.note(f"{label} uses GPU {row['index']} ({row['bdf']}), whose NUMA node is unknown "
                f"(sysfs numa_node {row.get('sysfs_numa_node_reported')}, no NVML locality): placement not judged")
        return None
    return label, row, how


def _shares(ev: Evidence, proc: dict[str, Any], workers: list[dict[str, Any]], g: int) -> dict[str, Any]:
    """Where a rank and its workers ran and allocated, against its GPU's node g."""
    cmap = cpu_nodes(ev)
    cpu_by, mem_by = _cpu_by_node(proc, cmap), _data_bytes(proc)
    w_cpu_by = _sum_maps([_cpu_by_node(w, cmap) for w in workers])
    w_mem_by = _sum_maps([_data_bytes(w) for w in workers])
    allowed = proc.get("nodes_allowed") or []
    allowed = sorted({cmap[c] for c in cpulist(proc.get("cpus_allowed")) if c in cmap}) or allowed
    mems = cpulist(proc.get("mems_allowed"))
    return {"cpu_by": cpu_by, "mem_by": mem_by, "w_cpu_by": w_cpu_by, "w_mem_by": w_mem_by,
            "cpu_off": _off_share(cpu_by, g, MIN_CPU_S), "mem_off": _off_share(mem_by, g, MIN_DATA_BYTES),
            "w_cpu_off": _off_share(w_cpu_by, g, MIN_CPU_S), "w_mem_off": _off_share(w_mem_by, g, MIN_DATA_BYTES),
            "allowed": allowed, "cpus_exclude": bool(allowed) and g not in allowed,
            "mems_exclude": bool(mems) and g not in mems}


def _judge(ev: Evidence, unit: dict[str, Any], procs: dict[int, dict[str, Any]],
           rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """One rank's placement against its GPU's node, with the speedup model's terms."""
    proc = procs.get(unit["pid"])
    found = _locate(ev, unit, proc, procs, rows) if proc is not None else None
    if found is None:
        return None
    label, row, how = found
    g = row["node"]
    workers = [procs[m] for m in unit["members"] if m in procs and m != proc["pid"]]
    sh = _shares(ev, proc, workers, g)
    r = max(x for x in (sh["cpu_off"], sh["mem_off"], 0.0) if x is not None)
    rw = max(x for x in (sh["w_cpu_off"], sh["w_mem_off"], 0.0) if x is not None)
    used_remote = {int(n) for m in (sh["cpu_by"], sh["mem_by"], sh["w_cpu_by"], sh["w_mem_by"])
                   for n, v in m.items() if v > 0 and int(n) != g}
    used_remote |= {n for n in sh["allowed"] if n != g} if sh["cpus_exclude"] else set()
    ncpus = node_cpus(ev)
    k, k_src = _worst_k(ev, g, used_remote or {n for n in ncpus if n != g and ncpus[n]})
    h, w, h_src = _host_share(ev, proc)
    s = ((h if h is not None else 1.0) * r + w * rw) * (1.0 - 1.0 / k)
    return {"pid": proc["pid"], "label": label, "local_rank": proc.get("local_rank"), "argv": proc["argv"],
            "gpu_index": row["index"], "gpu_bdf": row["bdf"], "gpu_node": g,
            "gpu_node_source": row["node_source"], "gpu_how": how,
            "cpu_remote_share": _r(sh["cpu_off"]), "memory_remote_share": _r(sh["mem_off"]),
            "workers": [m["pid"] for m in workers],
            "workers_cpu_remote_share": _r(sh["w_cpu_off"]), "workers_memory_remote_share": _r(sh["w_mem_off"]),
            "cpus_allowed": proc.get("cpus_allowed"), "mems_allowed": proc.get("mems_allowed"),
            "nodes_allowed": sh["allowed"], "cpus_exclude_gpu_node": sh["cpus_exclude"],
            "mems_exclude_gpu_node": sh["mems_exclude"], "cpu_seconds_by_node": sh["cpu_by"],
            "data_bytes_by_node": sh["mem_by"],
            "remote": (r >= REMOTE_SHARE or rw >= REMOTE_SHARE or sh["cpus_exclude"] or sh["mems_exclude"]),
            "r": round(r, 3), "rw": round(rw, 3),
            "h": None if h is None else round(h, 3), "h_source": h_src, "w": round(w, 3),
            "k": round(k, 2), "k_source": k_src, "speedup": round(1.0 / (1.0 - min(s, 0.9)), 3),
            "data_bytes_total": sum(sh["mem_by"].values()) + sum(sh["w_mem_by"].values())}


def _mem_flag(ev: Evidence, judged: list[dict[str, Any]]) -> tuple[str, list[int]]:
    """--membind unless the ranks placed on a node would fill most of its memory (then the nodes)."""
    node_mem = {n["node"]: n.get("memory_mb") for n in (ev.get("topology") or {}).get("nodes", [])}
    want: dict[int, float] = {}
    for j in judged:
        want[j["gpu_node"]] = want.get(j["gpu_node"], 0.0) + j["data_bytes_total"]
    tight = [n for n, b in want.items() if node_mem.get(n) and b > MEMBIND_FILL * node_mem[n] * 2 ** 20]
    return ("--preferred" if tight else "--membind"), tight


def _rank_facts_and_fixes(remote_units: list[dict[str, Any]], mem_flag: str) -> tuple[list[Fact], list[Fix]]:
    """Per remote rank: where its GPU is, where it ran and allocated, and its numactl line."""
    facts: list[Fact] = []
    fixes: list[Fix] = []
    for j in sorted(remote_units, key=lambda x: -x["speedup"]):
        who = j["label"]
        facts.append(Fact("topology", f"{who} uses GPU {j['gpu_index']} ({j['gpu_bdf']}) on NUMA node "
                                      f"{j['gpu_node']} ({j['gpu_node_source']}; GPU from {j['gpu_how']})",
                          j["gpu_node"]))
        if j["cpu_remote_share"] is not None:
            by = _fmt_map(j["cpu_seconds_by_node"])
            facts.append(Fact("placement", f"{who}: share of its CPU time on other nodes (seconds by node {by})",
                              j["cpu_remote_share"]))
        if j["memory_remote_share"] is not None:
            by = _fmt_map(j["data_bytes_by_node"], 2 ** 20)
            facts.append(Fact("placement", f"{who}: share of its data pages on other nodes (MB by node {by})",
                              j["memory_remote_share"]))
        if j["cpus_exclude_gpu_node"] or j["mems_exclude_gpu_node"]:
            facts.append(Fact("placement", f"{who}: bound away from node {j['gpu_node']} (Cpus_allowed_list "
                                           f"{j['cpus_allowed']}, Mems_allowed_list {j['mems_allowed']})",
                              j["nodes_allowed"]))
        if j["workers"] and j["workers_cpu_remote_share"] is not None:
            facts.append(Fact("placement", f"{j['label']}: share of its {len(j['workers'])} worker(s)' CPU time on "
                                           "other nodes", j["workers_cpu_remote_share"]))
        who = j["label"] + (" and its DataLoader workers" if j["workers"] else "")
        fixes.append(Fix(f"Run {who} on node {j['gpu_node']}, where its GPU {j['gpu_index']} is",
                         command=numactl_line(j["gpu_node"], j["argv"], mem_flag)))
    return facts, fixes


def _job_fixes(ev: Evidence, judged: list[dict[str, Any]], remote_units: list[dict[str, Any]],
               rows: list[dict[str, Any]], mem_flag: str) -> list[Fix]:
    """Binding every torchrun rank by LOCAL_RANK, and pinning workers that drifted off their node."""
    pl = ev.get("placement") or {}
    procs = {p["pid"]: p for p in pl.get("processes", [])}
    ncpus = node_cpus(ev)
    fixes: list[Fix] = []
    ranks = [j for j in judged if j["local_rank"] is not None]
    if ranks:
        rank_nodes = _rank_nodes(ev, judged, procs, rows, pl)
        launcher = pl.get("launcher") or {}
        example = next((j for j in remote_units if j["local_rank"] is not None), ranks[0])
        fixes.append(Fix("Bind every torchrun rank by LOCAL_RANK: save this as " + WRAPPER + " (chmod +x) and "
                         "start the job through it",
                         change=wrapper_script(rank_nodes, mem_flag),
                         command=torchrun_command(launcher.get("argv") if launcher.get("torchrun") else None,
                                                  example["argv"])))
        fixes.append(Fix("Or, where torchrun has --numa-binding (recent PyTorch), let it bind each rank to its "
                         "GPU's node", change="torchrun --numa-binding=node ..."))
    drift = [j for j in remote_units if (j["workers_cpu_remote_share"] or 0.0) >= REMOTE_SHARE]
    if drift:
        node_sets = {j["gpu_node"]: ncpus[j["gpu_node"]] for j in judged}
        table = _rank_nodes(ev, judged, procs, rows, pl) if ranks else {}
        if len(set(table.values())) > 1:
            mapping = ", ".join(f"{lr}: {py_list(ncpus[n])}" for lr, n in sorted(table.items()) if ncpus.get(n))
            expr = f"{{{mapping}}}[int(os.environ['LOCAL_RANK'])]"
        else:
            expr = py_list(node_sets[drift[0]["gpu_node"]])
        fixes.append(Fix("Pin DataLoader workers to their GPU's node (they inherit a numactl binding, but these "
                         "drifted); use a module-level function if the DataLoader uses spawn",
                         change=f"DataLoader(..., worker_init_fn=lambda _: os.sched_setaffinity(0, {expr}))"))
    return fixes


def _bound(worst: dict[str, Any], mem_flag: str, tight: list[int]) -> str:
    bound = (f"{worst['label']}: h={worst['h'] if worst['h'] is not None else 1.0:.2f} ({worst['h_source']}), "
             f"r={worst['r']:.2f} (max of CPU time and data pages off node {worst['gpu_node']}), "
             f"w*rw={worst['w']:.2f}*{worst['rw']:.2f}, k={worst['k']:.2f} ({worst['k_source']}); "
             "speedup <= 1/(1-(h*r+w*rw)*(1-1/k)); assumes that host time is all memory traffic on the step's "
             "critical path, k times slower off-node: an upper bound (PyTorch's NUMA-binding docs report 1-10% "
             "as typical)")
    if mem_flag == "--preferred":
        bound += f"; --preferred, not --membind: node(s) {tight} would be over {pct(MEMBIND_FILL)} full"
    return bound


def _title(judged: list[dict[str, Any]], remote_units: list[dict[str, Any]], worst: dict[str, Any]) -> str:
    if len(remote_units) == 1 and len(judged) == 1:
        j = remote_units[0]
        return (f"{j['label'][0].upper() + j['label'][1:]} runs or allocates off NUMA node {j['gpu_node']}, "
                f"where its GPU is ({pct(max(j['r'], j['rw']))} remote)")
    return (f"{len(remote_units)} of {len(judged)} ranks run or allocate off their GPU's NUMA node "
            f"(worst: {worst['label']}, {pct(max(worst['r'], worst['rw']))} remote)")


@rule("numa.remote", requires=("topology", "placement"), uses=("gpu", "pyspy", "process"),
      description="a rank, its workers or its memory sit on a NUMA node other than its GPU's")
def numa_remote(ev: Evidence) -> Finding | None:
    if len([n for n, c in node_cpus(ev).items() if c]) < 2:
        return None                       # one node with CPUs: nothing can be remote
    rows, gpu_notes = gpu_table(ev)
    for n in gpu_notes:
        ev.note(n)
    if not rows:
        return None
    pl = ev.get("placement") or {}
    procs = {p["pid"]: p for p in pl.get("processes", [])}
    judged = [j for j in (_judge(ev, unit, procs, rows) for unit in pl.get("ranks", [])) if j is not None]
    remote_units = [j for j in judged if j["remote"]]
    if not remote_units:
        return None
    mem_flag, tight = _mem_flag(ev, judged)
    facts, fixes = _rank_facts_and_fixes(remote_units, mem_flag)
    fixes += _job_fixes(ev, judged, remote_units, rows, mem_flag)
    worst = max(remote_units, key=lambda x: x["speedup"])
    definite = any((j["cpus_exclude_gpu_node"] and j["r"] >= 0.9) for j in remote_units)
    conf = "medium" if definite and worst["h"] is not None else "low"
    return Finding("numa.remote", _title(judged, remote_units, worst), worst["speedup"], _bound(worst, mem_flag, tight),
                   conf, facts, fixes, risk="low", details={"ranks": judged, "mem_flag": mem_flag})


def _rank_nodes(ev: Evidence, judged: list[dict[str, Any]], procs: dict[int, dict[str, Any]],
                rows: list[dict[str, Any]], pl: dict[str, Any]) -> dict[int, int]:
    """LOCAL_RANK -> the node of its GPU, for every local rank the launcher starts: the ranks seen,
    and, when only one rank is the target, the others by the same CUDA_VISIBLE_DEVICES rule."""
    out = {j["local_rank"]: j["gpu_node"] for j in judged if j["local_rank"] is not None}
    seen = [procs[j["pid"]] for j in judged if j["local_rank"] is not None]
    if not seen or (pl.get("launcher") or {}).get("is_target"):
        return out
    template = seen[0]
    vis = visible_devices(template.get("cuda_visible_devices"))
    n_local = len(vis) if vis else len(rows)
    for lr in range(n_local):
        if lr in out:
            continue
        fake = dict(template, local_rank=lr, pid=-1)
        row, _ = rank_gpu(ev, {"pid": -1, "members": []}, {-1: fake}, rows)
        if row is not None and row["node"] is not None:
            out[lr] = row["node"]
    return out


def _data_bytes(p: dict[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in ((p.get("memory") or {}).get("data_bytes_by_node") or {}).items()}


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def _fmt_map(m: dict[str, float], div: float = 1.0) -> str:
    return "{" + ", ".join(f"{k}: {v / div:.1f}" for k, v in sorted(m.items(), key=lambda kv: int(kv[0]))) + "}"
