"""rank.straggler: one rank of a multi-rank job on this node holds the others back in their collectives.

The lockstep model of agent/combiners/stragglers.py across the local ranks of a launcher (torchrun):
the rank that waits least in collectives is the straggler when the asymmetry is outside py-spy's
sampling error, whatever slows it; its causes (data, syncs, CPU wait and what took the CPU, its own
host code, its GPU's clocks) come from the same probes, each with its fix and the job speedup if
removed. `diagnose --slurm-job` runs the same model across nodes (agent/fleet/merge.py).
"""
from __future__ import annotations

from typing import Any

from trainprobe.agent.combiners import stragglers
from trainprobe.agent.combiners.training_ranks import lockstep, node_cpu_facts, rank_facts, trainers
from trainprobe.agent.evidence import Evidence
from trainprobe.agent.findings import FINDING_IDS, Fact, Finding, Fix
from trainprobe.agent.rules import rule

_BEFORE = tuple(i for i in ("dataloader.starved", "host.sync", "cpu.contended", "numa.remote") if i in FINDING_IDS)


def _local_rank(ev: Evidence, pid: int) -> int | None:
    proc = ev.get("process") or {}
    row = next((p for p in proc.get("processes", []) if p["pid"] == pid), None)
    v = ((row or {}).get("env") or {}).get("LOCAL_RANK")
    return int(v) if isinstance(v, str) and v.isdigit() else None


def _earlier(ev: Evidence) -> list[dict[str, Any]]:
    out = []
    for f in ev.context.get("findings") or []:
        out.append({"id": f.id, "title": f.title, "details": dict(f.details or {}),
                    "fixes": [{"title": x.title, "change": x.change, "command": x.command} for x in f.fixes[:2]]})
    return out


def local_rows(ev: Evidence) -> list[dict[str, Any]]:
    """The straggler model's rows for the ranks of this node's launcher (two or more), else []."""
    spy = ev.get("pyspy") or {}
    views = trainers(spy)
    if len(views) < 2 or not lockstep(ev):
        return []
    window_s = float((ev.get("process") or {}).get("window_s") or ev.context.get("window", {}).get("seconds") or 0.0)
    node = node_cpu_facts(ev, window_s)
    earlier = _earlier(ev)
    rows = []
    for v in views:
        facts = rank_facts(ev, v["pid"], v, window_s)
        mine = [f for f in earlier if (f["details"] or {}).get("rank_pid") in (v["pid"], None)]
        rows.append({"node": None, "rank": _local_rank(ev, v["pid"]), "local_rank": _local_rank(ev, v["pid"]),
                     **facts, "node_facts": node, "findings": mine})
    return rows


@rule("rank.straggler", requires=("pyspy", "process"), uses=("contention", "throttle", "gpu"), after=_BEFORE,
      description="one local rank waits least in the collectives: the others wait for it")
def rank_straggler(ev: Evidence) -> Finding | None:
    rows = local_rows(ev)
    if not rows:
        if len(trainers(ev.get("pyspy") or {})) >= 2 and not lockstep(ev):
            ev.note("the training processes step on their own (no torch.distributed or data-parallel frames, no "
                    "launcher's LOCAL_RANK): none waits for another, so no straggler is named")
        return None
    v = stragglers.analyse(rows)
    if not v["stragglers"]:
        ev.note("ranks in lockstep: " + (v["no_straggler_reason"] or "no straggler"))
        return None
    s = v["stragglers"][0]
    facts = [Fact("process", f"rank PID {r['pid']}: share of the window waiting in collectives "
                             "(off-CPU outside data waits)", r["collective_share"]) for r in rows]
    if s["named_by"] == "gpu":
        facts.append(Fact("gpu", f"rank PID {s['pid']}: share of the step its slower GPU costs (its busy share x "
                                 "(1 - its SM clock / the other ranks')), which the hosts' waits do not show", s["excess_share"]))
    else:
        facts.append(Fact("pyspy", f"rank PID {s['pid']}: its own work is longer than the others' by this share of "
                                   f"the step (measurement error +-{s['error_share']:.2f})", s["excess_share"]))
    fixes = []
    for c in s["causes"]:
        facts.append(Fact("pyspy" if c["cause"] in ("data", "host_sync", "own_compute") else
                          ("gpu" if c["cause"] == "gpu_slower" else "process"),
                          f"cause {c['cause']}: {c['title']} (job {c['job_speedup_if_removed']:g}x if removed)",
                          c["share"]))
        fixes.append(Fix(f"{c['cause']}: {c['fix']}", None, c.get("command")))
    if not fixes:
        fixes.append(Fix(s.get("note") or "Compare the straggler with a healthy rank (trainprobe flamegraph --diff)"))
    conf = "high" if s["excess_share"] >= 2 * max(s["error_share"], stragglers.MIN_EXCESS) else "medium"
    if s["cause"] == "unexplained":
        conf = "low"
    return Finding("rank.straggler", s["title"], v["job_expected_speedup"], v["job_speedup_bound"], conf,
                   facts, fixes, risk="medium",
                   details={"rank_pid": s["pid"], "cause": s["cause"], "excess_share": s["excess_share"],
                            "error_share": s["error_share"], "causes": s["causes"], "named_by": s["named_by"],
                            "after_fix": s.get("after_fix"), "job_speedup_upper": s.get("job_speedup_upper")})
