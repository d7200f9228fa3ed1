"""cpu.memory_bound: the host code that limits the step stalls on memory.

Which host code limits the step comes from py-spy: the DataLoader workers when the training loop
waits on them (data_wait), the training thread itself when it loads batches in the loop
(data_load, num_workers=0), or the training thread's own compute when the job trains on the CPU.
perf stat says how that code runs: IPC below 1.0 (Brendan Gregg, "CPU Utilization is Wrong":
below 1 likely memory-stalled) together with an LLC miss ratio above 20% (perf's own red band for
cache-miss ratios, stat-shadow.c). The py-spy stacks say where (collate, a transform, __getitem__).

The speedup model, stated in every finding. s is the share of the step in that code (py-spy),
r = IPC / 1.0 the fraction of its time it would keep if its memory stalls went away and it ran at
IPC 1.0 with the same instructions (an optimistic reading of what local binding and less memory
traffic can do):
    workers:   the loop waits s of the step for batches, so production sets the step:
               step' >= max(1 - s, r)            (never better than the loop's own time)
    in-loop:   step' = (1 - s) + s * r
Both stay below the Amdahl ceiling 1 / (1 - s).
"""
from __future__ import annotations

import shlex
from typing import Any

from trainprobe.agent.evidence import Evidence
from trainprobe.agent.findings import Fact, Finding, Fix, pct
from trainprobe.agent.rules import rule

IPC_LOW = 1.0            # below: likely stalled on memory (Gregg); also the IPC the model aims for
LLC_MISS_HIGH = 0.20     # above: perf colours the cache-miss ratio red (stat-shadow.c)
SHARE_MIN = 0.10         # the code must hold at least this share of the step to be worth a finding
TRUST_HIGH = 0.90        # counters on the PMU at least this share of the time: not multiplexed
TRUST_LOW = 0.25         # below: too little counting time to say anything
GPU_BUSY = 0.85          # the GPU this busy: the host is not what limits the step


def _stack_where(stacks: list[dict[str, Any]] | None) -> str | None:
    if not stacks:
        return None
    return " > ".join(stacks[0]["stack"][-3:])


def _kind(breakdown: dict[str, float] | None) -> str | None:
    """The dominant kind of data work: collate, transform or getitem."""
    if not breakdown:
        return None
    work = {k: v for k, v in breakdown.items() if k in ("collate", "transform", "getitem") and v > 0}
    return max(work, key=work.get) if work else None


def _candidates(ev: Evidence, perf: dict[str, Any], spy: dict[str, Any]) -> list[dict[str, Any]]:
    """The host code that may limit the step, with its share and its counters."""
    tt = spy.get("training_thread") or {}
    bd = tt.get("breakdown") or {}
    out: list[dict[str, Any]] = []
    groups = perf.get("groups") or {}
    f_wait, f_load = bd.get("data_wait", 0.0), bd.get("data_load", 0.0)
    workers = spy.get("workers") or {}
    wcounters = _worker_counters(perf, workers)
    if f_wait >= SHARE_MIN and wcounters:
        out.append({"where": "workers", "label": "the DataLoader workers", "share": f_wait,
                    "counters": wcounters, "model": "workers",
                    "stack": _stack_where(workers.get("top_stacks")), "kind": _kind(workers.get("breakdown"))})
    tthread = _training_thread_counters(perf, tt)
    if f_load >= SHARE_MIN and tthread:
        out.append({"where": "in_loop", "label": "the training thread loading batches in the loop (num_workers=0)",
                    "share": f_load, "counters": tthread, "model": "serial",
                    "stack": _stack_where((tt.get("top_stacks") or {}).get("data_load")),
                    "kind": _kind(tt.get("data_load_breakdown"))})
    proc = ev.get("process") or {}
    uses_cuda = bool(proc.get("uses_cuda") or ev.context.get("uses_cuda"))
    compute = bd.get("forward", 0.0) + bd.get("backward", 0.0) + bd.get("optimizer", 0.0)
    if not uses_cuda and compute >= SHARE_MIN and tthread:
        top = tt.get("top_stacks") or {}
        best = max(("forward", "backward", "optimizer"), key=lambda c: bd.get(c, 0.0))
        out.append({"where": "cpu_compute", "label": "the training thread's own compute (the model runs on the CPU)",
                    "share": compute, "counters": tthread, "model": "serial",
                    "stack": _stack_where(top.get(best)), "kind": "compute"})
    return out


SUMMED = ("instructions", "cycles", "llc_loads", "llc_load_misses", "cache_references", "cache_misses",
          "task_clock_s", "major_faults", "context_switches")


def _worker_counters(perf: dict[str, Any], workers: dict[str, Any]) -> dict[str, Any] | None:
    """Counters of the processes py-spy saw running torch's _worker_loop, summed; else perf's
    'workers' session (every descendant of the target)."""
    pids = {w.get("pid") for w in workers.get("per_worker") or []}
    procs = [p for p in perf.get("processes") or [] if p.get("pid") in pids]
    if not procs:
        return (perf.get("groups") or {}).get("workers")
    tot = {k: sum(p.get(k) or 0.0 for p in procs) if any(p.get(k) is not None for p in procs) else None
           for k in SUMMED}
    ins, cyc = tot["instructions"], tot["cycles"]
    loads, misses = tot["llc_loads"], tot["llc_load_misses"]
    source = "LLC-load-misses/LLC-loads"
    if not loads:
        loads, misses, source = tot["cache_references"], tot["cache_misses"], "cache-misses/cache-references"
    ipc_t = [p["ipc_trust"] for p in procs if p.get("ipc_trust") is not None]
    miss_t = [p["llc_miss_trust"] for p in procs if p.get("llc_miss_trust") is not None]
    secs = next((p.get("seconds") for p in procs if p.get("seconds")), None) or perf.get("window_s")
    return {"ipc": round(ins / cyc, 4) if ins and cyc else None, "ipc_trust": min(ipc_t) if ipc_t else None,
            "llc_miss_ratio": round(misses / loads, 4) if loads and misses is not None else None,
            "llc_miss_trust": min(miss_t) if miss_t else None, "llc_source": source if loads else None,
            "llc_mpki": round(misses * 1000.0 / ins, 4) if ins and misses is not None else None,
            "major_faults_per_s": round(tot["major_faults"] / secs, 3) if tot["major_faults"] is not None and secs else None,
            "pids": sorted(p["pid"] for p in procs), "series": []}


def _training_thread_counters(perf: dict[str, Any], tt: dict[str, Any]) -> dict[str, Any] | None:
    """The perf counters of the thread py-spy calls the training thread (by tid), else perf's pick."""
    tid = tt.get("tid")
    for t in perf.get("threads") or []:
        if tid is not None and t.get("tid") == tid:
            return t
    return perf.get("training_thread")


def _memory_bound(c: dict[str, Any]) -> bool:
    ipc, miss = c.get("ipc"), c.get("llc_miss_ratio")
    trust = min(c.get("ipc_trust") or 0.0, c.get("llc_miss_trust") or 0.0)
    return ipc is not None and miss is not None and trust >= TRUST_LOW and ipc < IPC_LOW and miss > LLC_MISS_HIGH


def _steady_share(series: list[dict[str, Any]] | None) -> float | None:
    """Share of the intervals in which the counters also say memory-bound (None: no series)."""
    pts = [p for p in (series or []) if p.get("ipc") is not None and p.get("llc_miss_ratio") is not None]
    if not pts:
        return None
    hits = sum(1 for p in pts if p["ipc"] < IPC_LOW and p["llc_miss_ratio"] > LLC_MISS_HIGH)
    return hits / len(pts)


def speedup(model: str, s: float, r: float) -> float:
    if model == "workers":
        return 1.0 / max(1.0 - s, r, 1e-6)
    return 1.0 / max((1.0 - s) + s * r, 1e-6)


def _numa_fix(ev: Evidence, facts: list[Fact]) -> Fix | None:
    topo = ev.get("topology") or {}
    nodes = topo.get("numa_node_count")
    if nodes == 1:
        facts.append(Fact("topology", "NUMA nodes on this host (local binding cannot help with one)", 1))
        return None
    node = None
    gpu = ev.get("gpu") or {}
    targets = set(gpu.get("target_gpus") or [])
    for g in gpu.get("gpus") or []:
        if (not targets or g.get("index") in targets) and g.get("numa_node") is not None and g["numa_node"] >= 0:
            node = g["numa_node"]
            break
    cmdline = ((ev.get("process") or {}).get("main") or {}).get("cmdline") or ev.context.get("target", {}).get("cmdline")
    argv = ((ev.get("process") or {}).get("main") or {}).get("argv")
    cmd = shlex.join(argv or (cmdline or "python train.py").split())
    if node is not None:
        facts.append(Fact("gpu", "NUMA node of the job's GPU", node))
        return Fix(f"Bind the job and its workers to NUMA node {node}, its GPU's node (workers inherit the binding)",
                   command=f"numactl --cpunodebind={node} --membind={node} {cmd}")
    where = f"{nodes} NUMA nodes" if nodes else "a multi-socket host"
    return Fix(f"On {where}: bind the job and its workers to one node so their memory is local "
               "(pick the GPU's node: `nvidia-smi topo -m`; workers inherit the binding)",
               command=f"numactl --cpunodebind=0 --membind=0 {cmd}")


def _traffic_fix(cand: dict[str, Any], uses_cuda: bool) -> Fix:
    kind = cand.get("kind")
    where = f" in {cand['stack'].split(' > ')[-1]}" if cand.get("stack") else ""
    if kind == "collate":
        return Fix("Copy less in collate" + where,
                   change="return contiguous tensors from __getitem__ (not lists or numpy object arrays) so "
                          "default_collate stacks once, or a collate_fn that writes into one preallocated batch tensor")
    if kind == "compute":
        return Fix("Move fewer bytes per step on the CPU" + where,
                   change="with torch.autocast('cpu', dtype=torch.bfloat16): ...  # half the bytes per activation; "
                          "or a smaller batch whose activations fit the last-level cache")
    if uses_cuda:
        return Fix("Keep samples as uint8 until they reach the GPU" + where,
                   change="decode to a uint8 tensor in __getitem__; on the GPU: "
                          "x = x.cuda(non_blocking=True).float().div_(255)  # normalise there, not per sample on the CPU")
    return Fix("Touch fewer bytes per sample" + where,
               change="decode to uint8 and convert to float once per batch; crop/resize before converting; "
                      "avoid per-sample copies (torch.from_numpy instead of torch.tensor)")


def _facts(best: dict[str, Any], perf: dict[str, Any]) -> tuple[list[Fact], float | None, float | None]:
    """(facts, steady share, the rest of the job's IPC): what the counters say about the code."""
    cnt, s = best["counters"], best["share"]
    trust = min(cnt.get("ipc_trust") or 0.0, cnt.get("llc_miss_trust") or 0.0)
    facts = [
        Fact("pyspy", f"share of the step in {best['label']}", round(s, 3)),
        Fact("perfstat", f"IPC of {best['label']} (instructions/cycles)", cnt["ipc"]),
        Fact("perfstat", f"LLC miss ratio of {best['label']} ({cnt.get('llc_source')})", cnt["llc_miss_ratio"]),
    ]
    if cnt.get("llc_mpki") is not None:
        facts.append(Fact("perfstat", "LLC misses per 1000 instructions", cnt["llc_mpki"]))
    facts.append(Fact("perfstat", "share of the time the counters were on the PMU (1.0: not multiplexed)", round(trust, 3)))
    if best.get("stack"):
        facts.append(Fact("pyspy", "where: hottest stack", best["stack"]))
    steady = _steady_share(cnt.get("series"))
    if steady is not None:
        facts.append(Fact("perfstat", "share of the intervals that were memory-bound", round(steady, 2)))
    # Relative to the rest of the job: the other group's IPC, when it was counted.
    groups = perf.get("groups") or {}
    other = groups.get("main") if best["where"] == "workers" else groups.get("workers")
    contrast = None
    if other and other.get("ipc") is not None:
        contrast = other["ipc"]
        facts.append(Fact("perfstat", "IPC of the rest of the job, for comparison", other["ipc"]))
    sw = cnt.get("major_faults_per_s")
    if sw:
        facts.append(Fact("perfstat", "major page faults per second (memory pressure)", sw))
    return facts, steady, contrast


def _bound(best: dict[str, Any]) -> str:
    cnt, s, r = best["counters"], best["share"], best["r"]
    if best["model"] == "workers":
        bound = (f"s={s:.2f} of the step waits on {best['label']} (py-spy); their IPC {cnt['ipc']:.2f} < {IPC_LOW:g} "
                 f"with {pct(cnt['llc_miss_ratio'])} LLC misses (perf); if their memory stalls went away and IPC "
                 f"reached {IPC_LOW:g}, a batch would take r={r:.2f} of today's time: step >= max(1-s={1 - s:.2f}, "
                 f"r={r:.2f}); Amdahl ceiling 1/(1-s)={1 / max(1 - s, 1e-6):.1f}x")
    else:
        bound = (f"s={s:.2f} of the step in {best['label']} (py-spy); its IPC {cnt['ipc']:.2f} < {IPC_LOW:g} with "
                 f"{pct(cnt['llc_miss_ratio'])} LLC misses (perf); at IPC {IPC_LOW:g} that code would take r={r:.2f} "
                 f"of its time: step = (1-s) + s*r = {(1 - s) + s * r:.2f}; Amdahl ceiling 1/(1-s)="
                 f"{1 / max(1 - s, 1e-6):.1f}x")
    return bound + "; an upper bound: local binding and less traffic remove only part of the stalls"


def _confidence(best: dict[str, Any], trust: float, steady: float | None, contrast: float | None) -> str:
    if trust < 0.5:
        return "low"
    if (trust >= TRUST_HIGH and best["share"] >= 0.3 and (steady is None or steady >= 0.7)
            and contrast is not None and contrast >= 1.3 * best["counters"]["ipc"]):
        return "high"       # steady, not multiplexed, and the rest of the job runs faster code
    return "medium"


def _counters_usable(perf: dict[str, Any]) -> bool:
    """Hardware counters were read (software counters only: perf's reason is in the perfstat evidence)."""
    return bool((perf.get("hardware") or {}).get("available") or any(
        (g or {}).get("ipc") is not None for g in (perf.get("groups") or {}).values()))


# `gpu` (busy share, the GPU's NUMA node) and `topology` (NUMA node count) are read when present;
# they join `uses` when those probes are registered (the conformance test allows only known probes).
@rule("cpu.memory_bound", requires=("perfstat", "pyspy"), uses=("process", "gpu", "topology"),
      description="the host code that limits the step runs at low IPC with many LLC misses (perf + py-spy)")
def cpu_memory_bound(ev: Evidence) -> Finding | None:
    perf = ev.get("perfstat") or {}
    if not _counters_usable(perf):
        return None
    gpu = ev.get("gpu") or {}
    if gpu.get("busy_fraction") is not None and gpu["busy_fraction"] >= GPU_BUSY:
        return None          # the device is the limit, whatever the host's IPC
    cands = [c for c in _candidates(ev, perf, ev.get("pyspy") or {}) if _memory_bound(c["counters"])]
    if not cands:
        return None
    for c in cands:
        c["r"] = min(1.0, c["counters"]["ipc"] / IPC_LOW)
        c["speedup"] = speedup(c["model"], c["share"], c["r"])
    best = max(cands, key=lambda c: c["speedup"])
    cnt, s = best["counters"], best["share"]
    trust = min(cnt.get("ipc_trust") or 0.0, cnt.get("llc_miss_trust") or 0.0)
    facts, steady, contrast = _facts(best, perf)
    uses_cuda = bool((ev.get("process") or {}).get("uses_cuda") or ev.context.get("uses_cuda"))
    fixes = [f for f in (_numa_fix(ev, facts), _traffic_fix(best, uses_cuda)) if f is not None]
    title = (f"{best['label'][0].upper()}{best['label'][1:]} stall on memory: IPC {cnt['ipc']:.2f}, "
             f"{pct(cnt['llc_miss_ratio'])} LLC misses, {pct(s)} of the step")
    return Finding("cpu.memory_bound", title, best["speedup"], _bound(best), _confidence(best, trust, steady, contrast),
                   facts, fixes, risk="low",
                   details={"where": best["where"], "share": round(s, 4), "ipc": cnt["ipc"],
                            "llc_miss_ratio": cnt["llc_miss_ratio"], "llc_mpki": cnt.get("llc_mpki"),
                            "trust": round(trust, 4), "r": round(best["r"], 4),
                            "candidates": [{"where": c["where"], "share": round(c["share"], 4),
                                            "speedup": round(c["speedup"], 3)} for c in cands]})
