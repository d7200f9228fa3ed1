"""The training thread's GIL wait, from the default probes (py-spy's stacks and /proc's CPU time).

    b   share of py-spy's samples of the training thread that were not in a deliberate wait
        (a queue get, a lock, a sleep: py-spy's idle stacks) nor in a host-device sync,
    c   share of the window the training thread ran on a CPU (/proc/PID/task/TID/stat),
    r   share of the window it was runnable but waiting for a CPU (schedstat run_delay).
A thread that is inside Python or torch code (b) but neither running (c) nor waiting for a CPU (r)
is blocked without having asked to be: in CPython, waiting for the GIL. g = max(0, b - c - r) is
that share. It is a GIL wait only when another Python thread of the process was busy to hold the
GIL (the suspect); torch's own helper threads release the GIL while they copy or wait and are not
suspects. Cost: none beyond the default probes (no extra sampling of the target).

Error: c and r come from kernel counters (clock ticks: +-0.01 s per thread over the window); b
from py-spy's samples (+-1/sqrt(n)). The measured spread is carried as `g_err`.
"""
from __future__ import annotations

import math
from typing import Any

from trainprobe.agent.evidence import Evidence

BUSY_BESIDE = 0.5            # another Python thread of the training process busy at least this share
# Threads torch and multiprocessing run beside the loop; they release the GIL while they copy or wait.
TORCH_HELPERS = ("_pin_memory_loop", "pin_memory", "Queue._feed", "_handle_workers", "_handle_results")


def torch_helper(thread: dict[str, Any]) -> bool:
    frames = [f for top in thread.get("top") or [] for f in top.get("stack", [])]
    return any(h in f for f in frames for h in TORCH_HELPERS) or "pin_memory" in (thread.get("name") or "")


def suspects(ev: Evidence) -> list[dict[str, Any]]:
    """Python threads of the training process, other than the loop and torch's helpers, that were busy."""
    spy = ev.get("pyspy") or {}
    return [t for t in spy.get("other_threads") or [] if (t.get("busy_fraction") or 0) >= BUSY_BESIDE
            and not torch_helper(t)]


def gil_wait(ev: Evidence) -> dict[str, Any] | None:
    """{'g', 'g_err', 'b', 'c', 'r', 'samples', 'suspects'} for the training thread, or None when the
    default probes cannot measure it (no py-spy training thread, or no per-thread CPU time)."""
    spy = ev.get("pyspy") or {}
    tt = spy.get("training_thread")
    proc = ev.get("process") or {}
    if not tt or not proc.get("processes"):
        return None
    pid = tt.get("pid") or spy.get("pid") or proc.get("pid")
    tid = tt.get("tid") or pid
    me = next((p for p in proc["processes"] if p["pid"] == pid), None)
    th = next((t for t in (me or {}).get("threads", []) if t["tid"] == tid), None)
    if th is None or th.get("cpu_fraction") is None:
        return None
    win = float(proc.get("window_s") or 0.0) or 1e-6
    c = float(th["cpu_fraction"])
    r = float(th["run_delay_seconds"]) / win if th.get("run_delay_seconds") is not None else 0.0
    bd = tt.get("breakdown") or {}
    b = float(tt.get("busy_fraction") or 0.0) - float(bd.get("host_sync", 0.0))
    g = max(0.0, min(b - c - r, 0.99))
    n = max(1, int(round(float(tt.get("seconds") or 0.0) * float(spy.get("rate_hz") or 25))))
    g_err = math.sqrt(max(b * (1 - b), 0.01) / n) + 0.02
    return {"g": round(g, 4), "g_err": round(g_err, 4), "b": round(b, 4), "c": round(c, 4), "r": round(r, 4),
            "samples": n, "suspects": suspects(ev)}
