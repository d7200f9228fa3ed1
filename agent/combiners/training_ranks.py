"""The training processes of a job and per-rank facts joined from py-spy, NVML and /proc.

py-spy names the training processes (each rank of a multi-rank job, else the target) and each one's
share waiting for or loading data; NVML's process list gives the GPU a rank uses and that GPU's busy
share; the process probe's per-thread CPU time gives a rank's time off-CPU outside data waits (in
lockstep, waiting in collectives for a slower rank). Read by dataloader.starved and the fleet view.
"""
from __future__ import annotations

from typing import Any

from trainprobe.agent.evidence import Evidence


def trainers(spy: dict[str, Any]) -> list[dict[str, Any]]:
    """The training processes py-spy saw: each rank of a multi-rank job, else the target itself."""
    # A child py-spy caught only briefly (a DataLoader worker re-created each epoch, sampled before it
    # entered its worker loop) is not a rank: a rank's training thread is seen doing training work.
    ranks = [r for r in spy.get("ranks") or [] if r.get("training_thread")
             and sum(v for k, v in r["training_thread"]["breakdown"].items() if k != "other") >= 0.1]
    if ranks and (spy.get("launcher") or len(ranks) > 1):
        return ranks
    if spy.get("training_thread"):
        return [{"pid": spy["training_thread"].get("pid") or spy.get("pid"), "training_thread": spy["training_thread"],
                 "workers": spy.get("workers") or {}}]
    return []


def lockstep(ev: Evidence) -> bool:
    """Whether the job's ranks step together (synchronous data parallelism): a rank that torchrun started
    (LOCAL_RANK), or one py-spy saw in torch.distributed or a data-parallel wrapper (DDP, FSDP, DeepSpeed).
    Training processes the job spawned itself that do neither (pytorch/examples' mnist_hogwild: each
    updates a shared model on its own) step on their own: none waits for another."""
    procs = (ev.get("process") or {}).get("processes")
    if procs is None:
        return True
    ranks = [p for p in procs if p.get("role") == "rank"]
    if not ranks or any("LOCAL_RANK" in (p.get("env") or {}) for p in ranks):
        return True
    views = (ev.get("pyspy") or {}).get("ranks") or []
    return any((v.get("training_thread") or {}).get("distributed_fraction", 0.0) > 0 for v in views)


def data_share(tt: dict[str, Any]) -> float:
    return tt["breakdown"].get("data_wait", 0.0) + tt["breakdown"].get("data_load", 0.0)


def gpu_busy_of(ev: Evidence, pid: int) -> tuple[int, float] | None:
    """(GPU index, NVML busy share over the window) of the GPU a process used, from the gpu evidence."""
    gpu = ev.get("gpu") or {}
    idx = [p["gpu_index"] for p in gpu.get("processes") or [] if p.get("pid") == pid]
    per = gpu.get("per_gpu") or {}
    if len(set(idx)) != 1:
        return None
    g = per.get(idx[0])
    if not g or g.get("busy_fraction") is None:
        return None
    return idx[0], float(g["busy_fraction"])


def collective_wait_share(ev: Evidence, rank: dict[str, Any]) -> float | None:
    """Share of a rank's training thread spent off-CPU outside data waits: with ranks in lockstep,
    time spent waiting in collectives for a slower rank. Needs the process probe's thread CPU."""
    proc = ev.get("process")
    if not proc:
        return None
    me = next((x for x in proc["processes"] if x["pid"] == rank["pid"]), None)
    if me is None:
        return None
    th = next((t for t in me["threads"] if t["tid"] == rank["pid"]), None)
    if th is None or th.get("cpu_fraction") is None:
        return None
    bd = rank["training_thread"]["breakdown"]
    return max(0.0, 1.0 - th["cpu_fraction"] - bd.get("data_wait", 0.0))


# -- per-rank facts for the straggler model (agent/combiners/stragglers.py) -------------------------

def thread_of(ev: Evidence, pid: int) -> dict[str, Any] | None:
    """The process probe's row of a process's main thread (its training thread)."""
    proc = ev.get("process") or {}
    me = next((x for x in proc.get("processes", []) if x["pid"] == pid), None)
    if me is None:
        return None
    return next((t for t in me.get("threads", []) if t["tid"] == pid), None)


def _process_row(ev: Evidence, pid: int) -> dict[str, Any] | None:
    proc = ev.get("process") or {}
    return next((x for x in proc.get("processes", []) if x["pid"] == pid), None)


def _function(label: str) -> str:
    """A py-spy frame label 'name (file.py:12)' -> 'name (file.py)': one function, whatever line."""
    head, sep, tail = label.rpartition(" (")
    if not sep or not tail.endswith(")"):
        return label
    return f"{head} ({tail[:-1].rsplit(':', 1)[0]})"


# Categories whose time the straggler model counts apart (data, syncs, copies): not "its own code".
_NOT_OWN_CODE = ("data_wait", "data_load", "h2d_copy", "host_sync")


def hot_functions(tt: dict[str, Any], limit: int = 40) -> dict[str, float]:
    """Inclusive share of the training thread's samples in each function of its own code (forward,
    backward, optimizer, other: not data, syncs or copies), from its top stacks (the flame graph's
    widths, at function granularity): what a flame-graph diff between ranks compares."""
    shares: dict[str, float] = {}
    for cat, stacks in (tt.get("top_stacks") or {}).items():
        if cat in _NOT_OWN_CODE:
            continue
        for st in stacks:
            for fn in {_function(f) for f in st.get("stack") or []}:
                shares[fn] = shares.get(fn, 0.0) + float(st.get("fraction") or 0.0)
    top = sorted(shares.items(), key=lambda kv: -kv[1])[:limit]
    return {k: round(min(v, 1.0), 4) for k, v in top}


def _gpu_facts(ev: Evidence, pid: int) -> dict[str, Any] | None:
    got = gpu_busy_of(ev, pid)
    if got is None:
        return None
    idx = got[0]
    st = ((ev.get("gpu") or {}).get("per_gpu") or {}).get(idx) or {}
    return {"index": idx, "busy": round(got[1], 4), "sm_clock_mhz": st.get("sm_clock_mhz_mean"),
            "max_sm_clock_mhz": st.get("max_sm_clock_mhz"), "reasons": dict(st.get("clocks_event_reasons") or {}),
            "pcie_replays": st.get("pcie_replays"), "ecc_uncorrected": st.get("ecc_uncorrected"),
            "temperature_c_max": st.get("temperature_c_max"), "power_w_mean": st.get("power_w_mean"),
            "power_limit_w": st.get("power_limit_w")}


HELPER_MIN_CPU = 0.005     # a thread of the rank that ran at least this share of the window does its work


def helper_run_delay(ev: Evidence, pid: int, window_s: float) -> float | None:
    """The longest run-queue wait, as a share of the window, of the rank's working threads other than
    its training thread (the process group's communication threads, autograd's): while the training
    thread sleeps in a collective, a communication thread of its own that waits for a CPU (a quota,
    another process on its CPU) is the rank's own stall, not a wait for another rank."""
    row = _process_row(ev, pid)
    if row is None or window_s <= 0:
        return None
    waits = [min(1.0, float(t["run_delay_seconds"]) / window_s) for t in row.get("threads") or []
             if t.get("tid") != pid and t.get("run_delay_seconds") is not None
             and float(t.get("cpu_fraction") or 0.0) >= HELPER_MIN_CPU]
    return round(max(waits), 4) if waits else 0.0


def rank_facts(ev: Evidence, pid: int, view: dict[str, Any] | None, window_s: float) -> dict[str, Any]:
    """What the straggler model reads about one rank, from its node's Evidence (pure).

    Shares are of the window: cpu (on a CPU), run_delay (runnable, waiting for one), helper_run_delay
    (the longest such wait of its other working threads), data (waiting for or loading batches),
    host_sync, collective (off-CPU outside data waits and its own threads' CPU waits: in lockstep,
    waiting for a slower rank), samples (py-spy samples of its training thread: the sampling error's n)."""
    from trainprobe.probes.parsers import procfs   # noqa: PLC0415 - one CPU-list parser, shared
    tt = (view or {}).get("training_thread") or {}
    bd = tt.get("breakdown")
    th = thread_of(ev, pid)
    cpu = th.get("cpu_fraction") if th else None
    if cpu is None and tt.get("cpu_fraction") is not None:
        cpu = tt["cpu_fraction"]
    rd = None
    if th and th.get("run_delay_seconds") is not None and window_s > 0:
        rd = min(1.0, th["run_delay_seconds"] / window_s)
    elif tt.get("run_delay_fraction") is not None:
        rd = tt["run_delay_fraction"]
    helper = helper_run_delay(ev, pid, window_s)
    coll = None
    if cpu is not None:
        coll = round(max(0.0, 1.0 - cpu - (rd or 0.0) - (bd or {}).get("data_wait", 0.0) - (helper or 0.0)), 4)
    rate = float((ev.get("pyspy") or {}).get("rate_hz") or 0.0)
    row = _process_row(ev, pid) or {}
    cpus = procfs.parse_cpulist(row.get("cpus_allowed")) if row.get("cpus_allowed") else []
    return {
        "pid": pid,
        "data_share": round(data_share(tt), 4) if bd is not None else None,
        "host_sync_share": round(bd.get("host_sync", 0.0), 4) if bd is not None else None,
        "collective_share": coll,
        "cpu_share": None if cpu is None else round(cpu, 4),
        "run_delay_share": None if rd is None else round(rd, 4),
        "helper_run_delay_share": helper,
        "samples": int(round(float(tt.get("seconds") or 0.0) * rate)) if rate else None,
        "cpus_allowed": row.get("cpus_allowed"),
        "cpus_allowed_count": len(cpus) or None,
        "mems_allowed": row.get("mems_allowed"),
        "hot_functions": hot_functions(tt) if tt else {},
        "gpu": _gpu_facts(ev, pid),
    }


def node_cpu_facts(ev: Evidence, window_s: float) -> dict[str, Any]:
    """Facts of a rank's node that are not per thread: its cgroup's CPU quota throttling (throttle
    probe) and the processes outside the job that took its CPUs (contention probe)."""
    out: dict[str, Any] = {}
    thr = ev.get("throttle")
    if thr:
        out["throttle"] = {"share": thr.get("throttled_share_of_window"), "quota_cpus": thr.get("quota_cpus"),
                           "cgroup": thr.get("cgroup_dir"), "cgroup_version": thr.get("cgroup_version"),
                           "throttled_period_share": thr.get("throttled_period_share")}
    con = ev.get("contention")
    if con:
        comp = [c for c in con.get("competitors") or [] if not c.get("sibling_of_target")]
        out["contention"] = {
            "job_cpus": con.get("job_cpus"), "job_cpu_count": con.get("job_cpu_count"),
            "competitors": [{"pid": c["pid"], "command": c.get("cmdline") or c.get("comm"), "user": c.get("user"),
                             "share_of_job_cpus": c.get("share_of_job_cpus"), "cpus_allowed": c.get("cpus_allowed")}
                            for c in comp[:10]],
            # CPU -> share of the window other processes ran on it (run + irq - the job's threads)
            "others_by_cpu": {int(c): round(float(w.get("others_s") or 0.0) / max(window_s, 1e-6), 4)
                              for c, w in (con.get("per_cpu") or {}).items()},
            "competitors_share": round(float(con.get("competitors_cpu_seconds_on_job_cpus") or 0.0)
                                       / max(window_s * max(int(con.get("job_cpu_count") or 1), 1), 1e-6), 4)}
    return out
