"""The training thread's GIL wait in the default run, from who held the GIL (py-spy --gil).

A thread can wait for the GIL only while another thread holds it. The py-spy probe measures that
directly: its GIL sampler records, at each sample, the one thread that held the GIL (read from the
interpreter's state). From it and the training thread's CPU time it splits the training thread's
off-CPU time (probes/pyspy.py: allocate_waits): the frames that block by nature first (DataLoader,
copies, syncs, collectives, I/O, deliberate waits), then a GIL wait of at most the share of the
window other threads held the GIL, then native waits and what nothing explains. So

    g = min(off-CPU time in Python/torch/native code, share of the window others held the GIL)

and g is 0 whenever no other thread was seen holding the GIL: a thread blocked in a read, a queue,
a sleep, or a C call that released the GIL (hashlib, zlib, a matmul) is never a suspect, whatever
its frames say. Without the GIL sampler's evidence (an old capture, a budget too small, a
free-threaded build) there is no estimate at all: CPU time alone is never read as a GIL wait.

    b   share of the training thread's samples in Python, torch or native code (not blocking frames),
    c   share of the window it ran on a CPU, r share it waited for one,
    h   share of the window other threads held the GIL (the suspects: each thread's own share), less
        the DataLoader's own threads' (DATALOADER_THREADS).

Error: h from the sampler's n samples (+-sqrt(h(1-h)/n)), b from the main sampler's; carried as
`g_err`.
"""
from __future__ import annotations

import math
from typing import Any

from trainprobe.agent.evidence import Evidence
from trainprobe.probes.pyspy import allocate_waits

SUSPECT_SHARE = 0.05          # another thread held the GIL at least this share of the sampler's samples
MIN_HELD_SAMPLES = 3          # ... and in at least this many samples
# The DataLoader's own threads: the pin-memory thread receives every batch from the workers
# (recvfds, unpickling) and pins it, the queue feeders hand indices to them. Their GIL time is the
# data path's cost (the step model's pin term bounds the step by it), not a background thread's that
# could be stopped or moved: never a GIL suspect. (Lightning's GAN template, 16 workers: the pin-memory
# thread held the GIL in 4 of 39 samples, in recvfds, and was blamed for a 1.28x GIL wait.)
DATALOADER_THREADS = ("_pin_memory_loop", "pt_data_pin", "QueueFeederThread")


def dataloader_thread(name: str | None) -> bool:
    return any(k in (name or "") for k in DATALOADER_THREADS)


def ownership(ev: Evidence) -> dict[str, Any]:
    """The py-spy probe's GIL ownership evidence ({'measured': False, ...} when absent)."""
    return ((ev.get("pyspy") or {}).get("gil")) or {"measured": False, "reason": "the py-spy probe did not run"}


def free_threaded(ev: Evidence) -> bool:
    return bool(ownership(ev).get("free_threaded"))


def suspects(ev: Evidence) -> list[dict[str, Any]]:
    """Threads of the training process, other than the training thread, seen holding the GIL at least
    SUSPECT_SHARE of the time, the largest share first: {'tid', 'name', 'share', 'samples', 'frame'}."""
    own = ownership(ev)
    if not own.get("measured"):
        return []
    tt = (ev.get("pyspy") or {}).get("training_thread") or {}
    return [t for t in own.get("threads") or [] if t.get("tid") != tt.get("tid")
            and t["share"] >= SUSPECT_SHARE and t["samples"] >= MIN_HELD_SAMPLES and not dataloader_thread(t.get("name"))]


def _cpu(ev: Evidence, tt: dict[str, Any]) -> tuple[float, float] | None:
    """(c, r) of the training thread: the py-spy probe's own reading, else the process probe's."""
    if tt.get("cpu_fraction") is not None:
        return float(tt["cpu_fraction"]), float(tt.get("run_delay_fraction") or 0.0)
    proc = ev.get("process") or {}
    pid, tid = tt.get("pid"), tt.get("tid") or tt.get("pid")
    me = next((p for p in proc.get("processes") or [] if p["pid"] == pid), None)
    th = next((t for t in (me or {}).get("threads", []) if t["tid"] == tid), None)
    if th is None or th.get("cpu_fraction") is None:
        return None
    win = float(proc.get("window_s") or 0.0) or 1e-6
    r = float(th["run_delay_seconds"]) / win if th.get("run_delay_seconds") is not None else 0.0
    return float(th["cpu_fraction"]), r


def gil_wait(ev: Evidence) -> dict[str, Any] | None:
    """{'g', 'g_err', 'b', 'c', 'r', 'h', 'samples', 'gil_samples', 'suspects', 'waits'} for the
    training thread, or None when the GIL's holders were not measured (or its CPU time not read).
    On a free-threaded build g is 0 (there is no GIL)."""
    spy = ev.get("pyspy") or {}
    tt = spy.get("training_thread")
    own = ownership(ev)
    if not tt or not (own.get("measured") or own.get("free_threaded")):
        return None
    cr = _cpu(ev, tt)
    if cr is None:
        return None
    c, r = cr
    # (the DataLoader's own threads' share is the data path's: not a wait a fix of a thread removes)
    dl = sum(float(t.get("share") or 0.0) for t in own.get("threads") or [] if dataloader_thread(t.get("name")))
    h = 0.0 if own.get("free_threaded") else max(0.0, float(own.get("others_share") or 0.0) - dl)
    kinds = tt.get("frame_kinds") or {}
    waits = tt.get("waits")
    if waits is None or tt.get("cpu_fraction") is None or dl > 0:
        # (the probe's own split counts every other thread's share, the DataLoader's threads' too: a
        # wait at most what the suspects held is split again without them; Lightning's GAN template
        # with 16 workers: the pin-memory thread's 4 of 39 samples doubled a 10% wait to 21%)
        waits = allocate_waits(kinds, c, r, h)
    b = float(kinds.get("code", 0.0)) + float(kinds.get("native", 0.0))
    g = 0.0 if own.get("free_threaded") else float(waits.get("gil", 0.0))
    n = max(1, int(round(float(tt.get("seconds") or 0.0) * float(spy.get("rate_hz") or 25))))
    m = max(1, int(own.get("samples") or 0))
    g_err = math.sqrt(max(h * (1 - h), 0.01) / m) + math.sqrt(max(b * (1 - b), 0.01) / n) + 0.01
    return {"g": round(g, 4), "g_err": round(g_err, 4), "b": round(b, 4), "c": round(c, 4), "r": round(r, 4),
            "h": round(h, 4), "samples": n, "gil_samples": m, "suspects": [] if own.get("free_threaded") else
            suspects(ev), "waits": waits}
