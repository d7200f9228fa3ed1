"""pcie.degraded: a GPU's PCIe link trained below its maximum generation or width.

The link is judged by the best state seen over the window, from sysfs (start and end) and NVML
(`gpu` evidence). The maximum is the lower of what the GPU and the port above it support: a Gen5
GPU in a Gen4 slot runs as designed, and gets a note, not a finding. An idle GPU lowers its link
speed to save power, so a speed (not width) shortfall on a GPU that NVML saw idle is a note; when
nobody saw the GPU's load, the finding stays at low confidence.

The speedup model: with c the share of the training thread spent in host-to-device copies
(py-spy) and q the link's payload bandwidth now over its bandwidth at full generation and width,
bandwidth-bound copies would take c * q of today's step on a full link, so restoring it gives at most
    speedup <= 1 / (1 - c * (1 - q)).
Without a measured copy share the expected speedup is 1.0 (unknown, not zero).

Informational notes (report notes, and evidence when the finding fires): a GPU whose node has no
InfiniBand/RDMA adapter while another node has one (GPUDirect RDMA and NCCL traffic then cross the
socket interconnect), and every disagreement between sysfs and NVML about a GPU.
"""
from __future__ import annotations

from typing import Any

from trainprobe.agent.evidence import Evidence
from trainprobe.agent.findings import Fact, Finding, Fix, pct
from trainprobe.agent.rules import rule
from trainprobe.agent.combiners.gpu_locality import distance, gpu_table
from trainprobe.probes.parsers.hw import link_gbps

IDLE_UTIL_PCT = 10.0          # a GPU below this mean utilisation may have lowered its link speed


def _gpu_util(ev: Evidence, index: Any) -> float | None:
    util = (ev.get("gpu") or {}).get("utilization") or {}
    samples = util.get(index)
    vals = [float(s[1]) for s in (samples or []) if len(s) > 1 and s[1] is not None]
    return sum(vals) / len(vals) if vals else None


def _best(*vals: Any) -> Any:
    v = [x for x in vals if isinstance(x, (int, float))]
    return max(v) if v else None


def link_state(row: dict[str, Any]) -> dict[str, Any]:
    s, g = row.get("sysfs") or {}, row.get("nvml") or {}
    sl, nl = s.get("link") or {}, g.get("pcie") or {}
    up = s.get("upstream_link") or {}
    cur_gen = _best(sl.get("cur_gen"), nl.get("gen"))
    cur_width = _best(sl.get("cur_width"), nl.get("width"))
    dev_max_gen = _best(sl.get("max_gen"), nl.get("max_gen"))
    dev_max_width = _best(sl.get("max_width"), nl.get("max_width"))
    max_gen, max_width = dev_max_gen, dev_max_width
    if dev_max_gen and up.get("max_gen"):
        max_gen = min(dev_max_gen, up["max_gen"])
    if dev_max_width and up.get("max_width"):
        max_width = min(dev_max_width, up["max_width"])
    return {"cur_gen": cur_gen, "cur_width": cur_width, "max_gen": max_gen, "max_width": max_width,
            "device_max_gen": dev_max_gen, "device_max_width": dev_max_width,
            "slot_limited": (max_gen, max_width) != (dev_max_gen, dev_max_width),
            "upstream": up.get("bdf")}


def nic_notes(ev: Evidence, rows: list[dict[str, Any]]) -> list[str]:
    pci = (ev.get("topology") or {}).get("pci") or []
    fast = [d for d in pci if d["kind"] == "ib" and d["numa_node"] is not None]
    kind = "InfiniBand/RDMA adapter"
    if not fast:
        fast = [d for d in pci if d["kind"] == "nic" and d["numa_node"] is not None]
        kind = "network adapter"
    if not fast:
        return []
    out = []
    for r in rows:
        if r["node"] is None or any(d["numa_node"] == r["node"] for d in fast):
            continue
        near = min(fast, key=lambda d: (distance(ev, r["node"], d["numa_node"]) or 1 << 30, d["bdf"]))
        name = ", ".join(near["names"]) or near["bdf"]
        out.append(f"GPU {r['index']} ({r['bdf']}) is on node {r['node']}, but no {kind} is: the nearest, "
                   f"{name} ({near['bdf']}), is on node {near['numa_node']}, so GPUDirect RDMA and NCCL traffic "
                   "of this GPU cross the socket interconnect")
    return out


def _judge_link(ev: Evidence, r: dict[str, Any]) -> dict[str, Any] | None:
    """A GPU whose link runs below its maximum, or None (with a note where the shortfall is by design
    or may be the power saving of an idle GPU)."""
    st = link_state(r)
    if None in (st["cur_gen"], st["cur_width"], st["max_gen"], st["max_width"]):
        return None
    width_short = st["cur_width"] < st["max_width"]
    speed_short = st["cur_gen"] < st["max_gen"]
    if not (width_short or speed_short):
        if st["slot_limited"]:
            ev.note(f"GPU {r['index']} ({r['bdf']}) runs at Gen{st['cur_gen']} x{st['cur_width']}, the most the "
                    f"port above it ({st['upstream']}) supports; the GPU itself supports "
                    f"Gen{st['device_max_gen']} x{st['device_max_width']}")
        return None
    util = _gpu_util(ev, r["index"])
    if speed_short and not width_short and util is not None and util < IDLE_UTIL_PCT:
        ev.note(f"GPU {r['index']} ({r['bdf']}) link at Gen{st['cur_gen']} of Gen{st['max_gen']} while "
                f"{util:.0f}% busy: an idle GPU lowers its link speed to save power; re-check under load")
        return None
    q = ((link_gbps(st["cur_gen"], st["cur_width"]) or 0.0) / (link_gbps(st["max_gen"], st["max_width"]) or 1.0))
    conf = "high" if width_short else ("medium" if util is not None else "low")
    return {"row": r, "state": st, "util": util, "q": round(q, 3), "confidence": conf,
            "width_short": width_short, "speed_short": speed_short}


def _gain(ev: Evidence, rows: list[dict[str, Any]], bad: list[dict[str, Any]]) -> tuple[dict[str, Any], float, str]:
    """(the worst link of the job's GPUs, speedup, bound): 1/(1-c(1-q)) where the copy share c was measured."""
    spy = ev.get("pyspy") or {}
    c = ((spy.get("training_thread") or {}).get("breakdown") or {}).get("h2d_copy")
    used = _used_indices(ev, rows)
    judged = [b for b in bad if not used or b["row"]["index"] in used] or bad
    worst = min(judged, key=lambda b: b["q"])
    if c is not None and used and worst["row"]["index"] in used:
        speedup = 1.0 / (1.0 - c * (1.0 - worst["q"]))
        bound = (f"c={c:.2f} (py-spy: training thread in host-to-device copies), q={worst['q']:.2f} (link bandwidth "
                 f"now / at Gen{worst['state']['max_gen']} x{worst['state']['max_width']}); speedup <= 1/(1-c*(1-q)), "
                 "assuming copies are bandwidth-bound and on the step's critical path")
        return worst, speedup, bound
    bound = (f"q={worst['q']:.2f} of the link's bandwidth is left; the job's copy share was not measured "
             "(no py-spy evidence, or the GPU is not the job's), so no gain is claimed")
    return worst, 1.0, bound


def _facts(bad: list[dict[str, Any]], nics: list[str]) -> list[Fact]:
    facts: list[Fact] = []
    for b in bad:
        r, st = b["row"], b["state"]
        src = "sysfs and NVML" if (r.get("sysfs") and r.get("nvml")) else ("sysfs" if r.get("sysfs") else "NVML")
        facts.append(Fact("topology" if r.get("sysfs") else "gpu",
                          f"GPU {r['index']} ({r['bdf']}) link Gen{st['cur_gen']} x{st['cur_width']} of "
                          f"Gen{st['max_gen']} x{st['max_width']} (best seen over the window, {src})",
                          f"{pct(b['q'])} of its bandwidth"))
        if b["util"] is not None:
            facts.append(Fact("gpu", f"GPU {r['index']} mean utilisation over the window (%)", round(b["util"], 1)))
        elif b["speed_short"] and not b["width_short"]:
            facts.append(Fact("topology", f"GPU {r['index']} ({r['bdf']}): its load was not measured; an idle GPU "
                                          "lowers its link speed to save power, so re-check under load", None))
    return facts + [Fact("topology", n, None) for n in nics]


def _fixes(bad: list[dict[str, Any]]) -> list[Fix]:
    bdfs = ",".join(b["row"]["bdf"] for b in bad)
    return [Fix("Confirm under load: the link state the GPU reports now",
                command="nvidia-smi --query-gpu=index,pci.bus_id,pcie.link.gen.current,pcie.link.gen.max,"
                        "pcie.link.width.current,pcie.link.width.max --format=csv"),
            Fix(f"Reseat the GPU(s) at {bdfs} (and riser or cable), check the slot's PCIe settings in the BIOS "
                "(forced link speed, bifurcation); the link retrains at the next boot"),
            Fix("Until then, keep jobs off this node (Slurm shown)",
                command=("scontrol update nodename=$(hostname -s) state=drain "
                         f"reason=\"GPU PCIe link degraded: {bdfs}\""))]


@rule("pcie.degraded", requires=("topology",), uses=("gpu", "pyspy", "placement"),
      description="a GPU's PCIe link runs below its maximum generation or width")
def pcie_degraded(ev: Evidence) -> Finding | None:
    rows, notes = gpu_table(ev)
    nics = nic_notes(ev, rows)
    for n in notes + nics:
        ev.note(n)
    bad = [b for b in (_judge_link(ev, r) for r in rows) if b is not None]
    if not bad:
        return None
    worst, speedup, bound = _gain(ev, rows, bad)
    worst_st = worst["state"]
    title = (f"GPU {worst['row']['index']}'s PCIe link runs at Gen{worst_st['cur_gen']} x{worst_st['cur_width']} of "
             f"Gen{worst_st['max_gen']} x{worst_st['max_width']} ({pct(worst['q'])} of its bandwidth)")
    if len(bad) > 1:
        title = f"{len(bad)} GPU PCIe links run below their maximum; worst: " + title
    conf_order = {"high": 0, "medium": 1, "low": 2}
    conf = min((b["confidence"] for b in bad), key=lambda x: conf_order[x])
    return Finding("pcie.degraded", title, speedup, bound, conf, _facts(bad, nics), _fixes(bad), risk="medium",
                   details={"links": [{"index": b["row"]["index"], "bdf": b["row"]["bdf"], **b["state"],
                                       "bandwidth_share": b["q"], "utilization_pct": b["util"]} for b in bad]})


def _used_indices(ev: Evidence, rows: list[dict[str, Any]]) -> set[Any]:
    """GPUs the job uses, from NVML's process list or the gpu probe's target_gpus."""
    gpu = ev.get("gpu") or {}
    pids = {p["pid"] for p in (ev.get("placement") or {}).get("processes", [])}
    used = {p.get("gpu_index") for p in gpu.get("processes") or [] if not pids or p.get("pid") in pids}
    used |= set(gpu.get("target_gpus") or [])
    return {u for u in used if u is not None}
