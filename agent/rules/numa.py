"""numa.remote: a rank, its DataLoader workers or its memory sit on a NUMA node other than its GPU's.

Which GPU a process uses: NVML's process list (`gpu` evidence) when present; else the process's
CUDA_VISIBLE_DEVICES and LOCAL_RANK (the device a rank uses is visible[LOCAL_RANK], the torch
convention `torch.cuda.set_device(LOCAL_RANK)`), with CUDA ordinals taken in PCI bus order, the
order NVML and nvidia-smi use (CUDA's own default order agrees on nodes of identical GPUs).
Which node a GPU sits on: its sysfs `numa_node`; when the firmware reports -1, NVML's node if its
CPU affinity lies within that node; on a host with one CPU node, that node. Otherwise it is unknown
and the rule says so instead of guessing.

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

import shlex
from typing import Any

from trainprobe.agent.evidence import Evidence
from trainprobe.agent.findings import Fact, Finding, Fix, pct
from trainprobe.agent.rules import rule
from trainprobe.probes.parsers import procfs
from trainprobe.probes.parsers.hw import canonical_bdf

REMOTE_SHARE = 0.25          # a rank or its workers spend at least this share off the GPU's node
MIN_CPU_S = 0.1              # less CPU time than this over the window says nothing about placement
MIN_DATA_BYTES = 1 << 20     # fewer data bytes than this say nothing about memory placement
MEMBIND_FILL = 0.8           # above this share of a node's memory, propose --preferred over --membind
DEFAULT_K = 2.0              # remote/local cost when the firmware gives no distance table
WRAPPER = "numa_bind.sh"


# -- locality helpers shared with pcie.py --------------------------------------------------------

def _cpus(text: str | None) -> list[int]:
    try:
        return procfs.parse_cpulist((text or "").strip())
    except ValueError:
        return []


def node_cpus(ev: Evidence) -> dict[int, list[int]]:
    topo = ev.get("topology") or {}
    if topo.get("nodes"):
        return {n["node"]: _cpus(n["cpus"]) for n in topo["nodes"]}
    pl = ev.get("placement") or {}
    return {int(n): _cpus(c) for n, c in (pl.get("nodes") or {}).items()}


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


def gpu_table(ev: Evidence) -> tuple[list[dict[str, Any]], list[str]]:
    """Every GPU with its index, PCI address, NUMA node and where that node came from, joining
    sysfs and NVML by bus id; plus a line for every disagreement between the two."""
    topo = ev.get("topology") or {}
    nv = (ev.get("gpu") or {}).get("gpus") or []
    sys_gpus = sorted((d for d in topo.get("pci", []) if d["kind"] == "gpu"), key=lambda d: d["bdf"])
    by_bdf = {d["bdf"]: d for d in sys_gpus}
    ncpus = node_cpus(ev)
    cpu_nodes_ = [n for n, c in ncpus.items() if c]
    notes: list[str] = []
    rows: list[dict[str, Any]] = []
    if nv:
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
    else:
        for i, s in enumerate(sys_gpus):
            rows.append({"index": i, "bdf": s["bdf"], "name": None, "uuid": None, "sysfs": s, "nvml": None,
                         "index_source": "PCI bus order (no NVML)"})
    for r in rows:
        s, g = r["sysfs"], r["nvml"]
        sys_node = s["numa_node"] if s else None
        nv_node = g.get("numa_node") if g else None
        nv_cpus = set(_cpus(g.get("cpu_affinity"))) if g and g.get("cpu_affinity") else set()
        node, source = None, None
        if sys_node is not None:
            node, source = sys_node, "sysfs numa_node"
            if nv_node is not None and nv_node != sys_node:
                notes.append(f"GPU {r['index']} ({r['bdf']}): sysfs says NUMA node {sys_node}, NVML says {nv_node}")
        elif nv_node is not None and nv_node in ncpus and (not nv_cpus or nv_cpus <= set(ncpus[nv_node])):
            node, source = nv_node, "NVML (sysfs numa_node is -1)" if s else "NVML"
        elif len(cpu_nodes_) == 1:
            node, source = cpu_nodes_[0], "the host's only node with CPUs"
        if s and g and s.get("local_cpulist") and nv_cpus and set(_cpus(s["local_cpulist"])) != nv_cpus:
            notes.append(f"GPU {r['index']} ({r['bdf']}): sysfs local_cpulist {s['local_cpulist']} differs from "
                         f"NVML's CPU affinity {procfs.format_cpulist(sorted(nv_cpus))}")
        mem_aff = g.get("memory_affinity") if g else None
        if mem_aff not in (None, "") and node is not None:
            mem_nodes = set(_cpus(mem_aff)) if isinstance(mem_aff, str) else set(mem_aff)
            if mem_nodes and node not in mem_nodes:
                notes.append(f"GPU {r['index']} ({r['bdf']}): NVML's memory affinity (nodes "
                             f"{procfs.format_cpulist(sorted(mem_nodes))}) does not include node {node}")
        r["node"], r["node_source"] = node, source
        r["sysfs_numa_node_reported"] = s.get("numa_node_reported") if s else None
    return rows, notes


def _visible(cvd: str | None) -> list[str] | None:
    if cvd is None:
        return None
    return [x.strip() for x in cvd.split(",") if x.strip()]


def _by_visible(entry: str, rows: list[dict[str, Any]]) -> dict[str, Any] | None:
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
    vis = _visible(cvd)
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
        row = _by_visible(vis[ordinal], rows)
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


def _py_list(cpus: list[int]) -> str:
    """A CPU set as short Python: range(8, 16), or [*range(0, 8), *range(16, 24)]."""
    runs: list[tuple[int, int]] = []
    for c in sorted(set(cpus)):
        if runs and c == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], c)
        else:
            runs.append((c, c))
    if len(runs) == 1:
        return f"range({runs[0][0]}, {runs[0][1] + 1})"
    if len(runs) <= 4:
        return "[" + ", ".join(f"*range({a}, {b + 1})" for a, b in runs) + "]"
    return "{" + ", ".join(str(c) for c in sorted(set(cpus))) + "}"


# -- fixes ----------------------------------------------------------------------------------------

def numactl_line(node: int, argv: list[str], mem_flag: str = "--membind") -> str:
    cmd = shlex.join(argv) if argv else "<your training command>"
    return f"numactl --cpunodebind={node} {mem_flag}={node} {cmd}"


def wrapper_script(rank_nodes: dict[int, int], mem_flag: str) -> str:
    by_node: dict[int, list[int]] = {}
    for lr, n in sorted(rank_nodes.items()):
        by_node.setdefault(n, []).append(lr)
    cases = "\n".join(f"  {'|'.join(str(x) for x in lrs)}) node={n} ;;" for n, lrs in sorted(by_node.items()))
    return ("#!/bin/sh\n"
            f"# {WRAPPER}: run each torchrun rank on the NUMA node of its GPU (from this host's topology)\n"
            'case "$LOCAL_RANK" in\n'
            f"{cases}\n"
            '  *) exec "$@" ;;\n'
            "esac\n"
            f'exec numactl --cpunodebind="$node" {mem_flag}="$node" "$@"\n')


def torchrun_command(launcher_argv: list[str] | None, rank_argv: list[str]) -> str:
    """The launcher's own command with the wrapper put in front of each rank's command."""
    tail = list(rank_argv)
    generic = f"torchrun <your options> --no-python ./{WRAPPER} {shlex.join(tail) if tail else 'python train.py ...'}"
    if not launcher_argv or not tail:
        return generic
    # torchrun runs `python -u SCRIPT ARGS` (or `python -u -m MODULE ARGS`): find SCRIPT ARGS at the
    # end of the launcher's argv; what precedes them is the launcher and its options.
    python = tail[0].rsplit("/", 1)[-1].startswith("python")
    user = tail[1:] if python else list(tail)
    while python and user and user[0] == "-u":
        user = user[1:]
    module = python and bool(user) and user[0] == "-m"
    script_args = user[1:] if module else user
    n = len(script_args)
    if n == 0 or launcher_argv[-n:] != script_args:
        return generic
    prefix = launcher_argv[:-n]
    entry = next((i for i, a in enumerate(prefix) if a.rsplit("/", 1)[-1] == "torchrun"
                  or a in ("torch.distributed.run", "torch.distributed.launch")), None)
    if entry is None:
        return generic
    head, opts = prefix[:entry + 1], prefix[entry + 1:]
    if module:
        opts = [a for a in opts if a not in ("-m", "--module")]
    if not any(a in ("--no-python", "--no_python") for a in opts):
        opts = opts + ["--no-python"]
    return shlex.join(head + opts + [f"./{WRAPPER}"] + tail)


# -- the rule -------------------------------------------------------------------------------------

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


@rule("numa.remote", requires=("topology", "placement"), uses=("gpu", "pyspy", "process"),
      description="a rank, its workers or its memory sit on a NUMA node other than its GPU's")
def numa_remote(ev: Evidence) -> Finding | None:
    topo, pl = ev.get("topology") or {}, ev.get("placement") or {}
    ncpus = node_cpus(ev)
    if len([n for n, c in ncpus.items() if c]) < 2:
        return None                       # one node with CPUs: nothing can be remote
    cmap = cpu_nodes(ev)
    rows, gpu_notes = gpu_table(ev)
    for n in gpu_notes:
        ev.note(n)
    if not rows:
        return None
    procs = {p["pid"]: p for p in pl.get("processes", [])}
    node_mem = {n["node"]: n.get("memory_mb") for n in topo.get("nodes", [])}

    def by_node_cpu(p: dict[str, Any]) -> dict[str, float]:
        # Recompute with the topology's node map, the authority over the placement probe's own.
        out: dict[str, float] = {}
        for c, s in (p.get("cpu_seconds_by_cpu") or {}).items():
            if int(c) in cmap:
                out[str(cmap[int(c)])] = out.get(str(cmap[int(c)]), 0.0) + s
        return out

    judged: list[dict[str, Any]] = []
    for unit in pl.get("ranks", []):
        proc = procs.get(unit["pid"])
        if proc is None:
            continue
        label = (f"rank LOCAL_RANK={proc['local_rank']} (PID {proc['pid']})" if proc.get("local_rank") is not None
                 else f"the training process (PID {proc['pid']})")
        row, how = rank_gpu(ev, unit, procs, rows)
        if row is None:
            ev.note(f"{label}: GPU not known ({how}); its placement was not judged")
            continue
        g = row["node"]
        if g is None:
            ev.note(f"{label} uses GPU {row['index']} ({row['bdf']}), whose NUMA node is unknown "
                    f"(sysfs numa_node {row.get('sysfs_numa_node_reported')}, no NVML locality): placement not judged")
            continue
        members = [procs[m] for m in unit["members"] if m in procs]
        workers = [m for m in members if m["pid"] != proc["pid"]]
        cpu_by = by_node_cpu(proc)
        w_cpu_by = _sum_maps([by_node_cpu(w) for w in workers])
        mem_by = _data_bytes(proc)
        w_mem_by = _sum_maps([_data_bytes(w) for w in workers])
        cpu_off = _off_share(cpu_by, g, MIN_CPU_S)
        mem_off = _off_share(mem_by, g, MIN_DATA_BYTES)
        w_cpu_off = _off_share(w_cpu_by, g, MIN_CPU_S)
        w_mem_off = _off_share(w_mem_by, g, MIN_DATA_BYTES)
        allowed = proc.get("nodes_allowed") or []
        allowed = sorted({cmap[c] for c in _cpus(proc.get("cpus_allowed")) if c in cmap}) or allowed
        mems = _cpus(proc.get("mems_allowed"))
        cpus_exclude = bool(allowed) and g not in allowed
        mems_exclude = bool(mems) and g not in mems
        r = max(x for x in (cpu_off, mem_off, 0.0) if x is not None)
        rw = max(x for x in (w_cpu_off, w_mem_off, 0.0) if x is not None)
        remote = (r >= REMOTE_SHARE or rw >= REMOTE_SHARE or cpus_exclude or mems_exclude)
        used_remote = {int(n) for m in (cpu_by, mem_by, w_cpu_by, w_mem_by)
                       for n, v in m.items() if v > 0 and int(n) != g}
        used_remote |= {n for n in allowed if n != g} if cpus_exclude else set()
        k, k_src = _worst_k(ev, g, used_remote or {n for n in ncpus if n != g and ncpus[n]})
        h, w, h_src = _host_share(ev, proc)
        s = ((h if h is not None else 1.0) * r + w * rw) * (1.0 - 1.0 / k)
        speedup = 1.0 / (1.0 - min(s, 0.9))
        judged.append({"pid": proc["pid"], "label": label, "local_rank": proc.get("local_rank"), "argv": proc["argv"],
                       "gpu_index": row["index"], "gpu_bdf": row["bdf"], "gpu_node": g,
                       "gpu_node_source": row["node_source"], "gpu_how": how,
                       "cpu_remote_share": _r(cpu_off), "memory_remote_share": _r(mem_off),
                       "workers": [m["pid"] for m in workers],
                       "workers_cpu_remote_share": _r(w_cpu_off), "workers_memory_remote_share": _r(w_mem_off),
                       "cpus_allowed": proc.get("cpus_allowed"), "mems_allowed": proc.get("mems_allowed"),
                       "nodes_allowed": allowed, "cpus_exclude_gpu_node": cpus_exclude,
                       "mems_exclude_gpu_node": mems_exclude, "cpu_seconds_by_node": cpu_by,
                       "data_bytes_by_node": mem_by, "remote": remote, "r": round(r, 3), "rw": round(rw, 3),
                       "h": None if h is None else round(h, 3), "h_source": h_src, "w": round(w, 3),
                       "k": round(k, 2), "k_source": k_src, "speedup": round(speedup, 3),
                       "data_bytes_total": sum(mem_by.values()) + sum(w_mem_by.values())})
    remote_units = [j for j in judged if j["remote"]]
    if not remote_units:
        return None

    # --membind unless the ranks placed on a node would fill most of its memory.
    mem_flag = "--membind"
    want: dict[int, float] = {}
    for j in judged:
        want[j["gpu_node"]] = want.get(j["gpu_node"], 0.0) + j["data_bytes_total"]
    tight = [n for n, b in want.items() if node_mem.get(n) and b > MEMBIND_FILL * node_mem[n] * 2 ** 20]
    if tight:
        mem_flag = "--preferred"

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
            mapping = ", ".join(f"{lr}: {_py_list(ncpus[n])}" for lr, n in sorted(table.items()) if ncpus.get(n))
            expr = f"{{{mapping}}}[int(os.environ['LOCAL_RANK'])]"
        else:
            expr = _py_list(node_sets[drift[0]["gpu_node"]])
        fixes.append(Fix("Pin DataLoader workers to their GPU's node (they inherit a numactl binding, but these "
                         "drifted); use a module-level function if the DataLoader uses spawn",
                         change=f"DataLoader(..., worker_init_fn=lambda _: os.sched_setaffinity(0, {expr}))"))

    worst = max(remote_units, key=lambda x: x["speedup"])
    definite = any((j["cpus_exclude_gpu_node"] and j["r"] >= 0.9) for j in remote_units)
    conf = "medium" if definite and worst["h"] is not None else "low"
    bound = (f"{worst['label']}: h={worst['h'] if worst['h'] is not None else 1.0:.2f} ({worst['h_source']}), "
             f"r={worst['r']:.2f} (max of CPU time and data pages off node {worst['gpu_node']}), "
             f"w*rw={worst['w']:.2f}*{worst['rw']:.2f}, k={worst['k']:.2f} ({worst['k_source']}); "
             "speedup <= 1/(1-(h*r+w*rw)*(1-1/k)); assumes that host time is all memory traffic on the step's "
             "critical path, k times slower off-node: an upper bound (PyTorch's NUMA-binding docs report 1-10% "
             "as typical)")
    if mem_flag == "--preferred":
        bound += f"; --preferred, not --membind: node(s) {tight} would be over {pct(MEMBIND_FILL)} full"
    n_units = len(judged)
    if len(remote_units) == 1 and n_units == 1:
        j = remote_units[0]
        title = (f"{j['label'][0].upper() + j['label'][1:]} runs or allocates off NUMA node {j['gpu_node']}, "
                 f"where its GPU is ({pct(max(j['r'], j['rw']))} remote)")
    else:
        title = (f"{len(remote_units)} of {n_units} ranks run or allocate off their GPU's NUMA node "
                 f"(worst: {worst['label']}, {pct(max(worst['r'], worst['rw']))} remote)")
    return Finding("numa.remote", title, worst["speedup"], bound, conf, facts, fixes, risk="low",
                   details={"ranks": judged, "mem_flag": mem_flag})


def _rank_nodes(ev: Evidence, judged: list[dict[str, Any]], procs: dict[int, dict[str, Any]],
                rows: list[dict[str, Any]], pl: dict[str, Any]) -> dict[int, int]:
    """LOCAL_RANK -> the node of its GPU, for every local rank the launcher starts: the ranks seen,
    and, when only one rank is the target, the others by the same CUDA_VISIBLE_DEVICES rule."""
    out = {j["local_rank"]: j["gpu_node"] for j in judged if j["local_rank"] is not None}
    seen = [procs[j["pid"]] for j in judged if j["local_rank"] is not None]
    if not seen or (pl.get("launcher") or {}).get("is_target"):
        return out
    template = seen[0]
    vis = _visible(template.get("cuda_visible_devices"))
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
