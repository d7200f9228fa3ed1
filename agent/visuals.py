"""What the HTML report draws beside the Report document: the GPU and training-thread timeline
and the flame graphs. Built from Evidence and Captures (live or from a bundle) into plain data,
so reports/html.py reads documents only.
"""
from __future__ import annotations

from typing import Any

from trainprobe.agent import profiles
from trainprobe.agent.evidence import Evidence
from trainprobe.probes.base import Capture
from trainprobe.probes.parsers.pystacks import TRAIN_CATEGORIES

GPU_KEYS = ("gpus", "target_gpus", "sample_period_s", "busy_fraction", "idle_fraction", "idle_intervals",
            "utilization")


def build(ev: Evidence, captures: list[Capture]) -> dict[str, Any]:
    win = ev.context.get("window") or {}
    out: dict[str, Any] = {"window": {"start_unix": win.get("start_unix"), "seconds": win.get("seconds")}}
    spy = ev.get("pyspy")
    tt = (spy or {}).get("training_thread")
    if spy and tt and spy.get("timeline"):
        out["timeline"] = {"training": spy["timeline"], "breakdown": tt.get("breakdown") or {},
                           "categories": list(TRAIN_CATEGORIES)}
    else:
        out["timeline"] = {"training": [], "missing": ev.why_missing("pyspy") if not spy else
                           "py-spy did not see the training thread"}
    gpu = ev.get("gpu")
    if gpu:
        out["gpu"] = {k: gpu.get(k) for k in GPU_KEYS}
    else:
        out["gpu"] = None
        out["gpu_missing"] = ev.why_missing("gpu")
    out["flamegraphs"], missing = flamegraphs(ev, captures)
    _mark_waits(ev, captures, out["flamegraphs"])
    if missing:
        out["flamegraphs_missing"] = missing
    return out


def _seconds(prof: dict[str, int]) -> float:
    return sum(prof.values()) / 1e6


def flamegraphs(ev: Evidence, captures: list[Capture]) -> tuple[list[dict[str, Any]], str | None]:
    cap = profiles.pyspy_capture(captures)
    if cap is None:
        return [], ev.why_missing("pyspy") if not ev.has("pyspy") else "the py-spy capture holds no stacks"
    try:
        st = profiles.stacks_of(cap)
    except profiles.ProfileError as exc:
        return [], str(exc)
    rate = cap.meta.get("rate_hz")
    how = f"py-spy, {'non-blocking' if cap.meta.get('nonblocking', True) else 'blocking'}, --idle" + \
          (f", {rate} Hz" if rate else "")
    graphs: list[dict[str, Any]] = []
    if st.training is None:
        graphs.append({"title": "Training thread", "missing": "py-spy did not see the training thread"})
    else:
        prof = profiles.training_profile(st)
        graphs.append({
            "title": f"Training thread ({profiles.thread_title(st.training)})",
            "graph_title": "Training thread",
            "subtitle": f"{_seconds(prof):.2f} s of wall-clock time ({how}). Width: share of the thread's time.",
            "profile": prof, "unit": profiles.UNIT,
        })
    if st.workers:
        prof = profiles.workers_profile(st)
        pids = sorted({t.pid for t in st.workers})
        graphs.append({
            "title": f"DataLoader workers ({len(pids)} process{'es' if len(pids) != 1 else ''})",
            "graph_title": "DataLoader workers",
            "subtitle": f"{_seconds(prof):.2f} s of worker time over {len(pids)} worker(s), merged ({how}). "
                        "Width: share of all workers' time; idle is time waiting for the next index.",
            "profile": prof, "unit": profiles.UNIT,
        })
    else:
        graphs.append({"title": "DataLoader workers",
                       "missing": "no DataLoader worker was seen: with num_workers=0 batches load in the training thread"})
    return graphs, None


def _mark_waits(ev: Evidence, captures: list[Capture], graphs: list[dict[str, Any]]) -> None:
    """Each graph's waiting stacks, and the training thread's on-CPU / run-queue / off-CPU split
    (agent/flame_split.py), for the flame graphs to draw apart from compute."""
    from trainprobe.agent import flame_split
    cap = profiles.pyspy_capture(captures)
    for i, g in enumerate(graphs):
        if g.get("profile"):
            g["waiting"] = flame_split.waiting_part(g["profile"])
            if i == 0 and cap is not None:
                st = profiles.stacks_of(cap)
                tid = st.training.os_tid if st.training else None
                g["threads"] = [t for t in flame_split.thread_split(ev.get("process"), st.traces, {st.main_pid})
                                if t["tid"] == tid]
