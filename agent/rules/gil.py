"""gil.contention: the training thread waits for the GIL held by another thread of its process.

Measured by the `gil` probe: in each py-spy dump, the training thread is counted as waiting for
the GIL when another thread holds it and the training thread is off-CPU, blocked in futex (how
CPython waits for the GIL), with no deliberate wait (queue, lock, sleep) as its innermost frame.
The share g of such samples is time the loop could have run Python and did not. If the holder
stopped holding the GIL that time would return to the loop: the expected speedup is 1 / (1 - g).
It counts the GIL waits alone: a holder that spins also takes a CPU from the loop, which shows as
run-queue delay (cpu.oversubscribed), so the real gain can be larger. The scheduler probe
corroborates it independently: how long the training thread slept, and how often the holder woke
it (a GIL hand-over wakes the waiter from the holder's thread).
"""
from __future__ import annotations

from agent.evidence import Evidence
from agent.findings import Fact, Finding, Fix, pct
from agent.rules import rule

WAIT_SHARE = 0.10            # the training thread waits for the GIL at least this share of samples
MIN_WAIT_SAMPLES = 3


@rule("gil.contention", requires=("gil",), uses=("sched", "pyspy"),
      description="the training thread waits for the GIL held by another of its threads (py-spy dumps)")
def gil_contention(ev: Evidence) -> Finding | None:
    g_ev = ev.get("gil") or {}
    g = g_ev.get("gil_wait_share")
    holder = g_ev.get("holder")
    if g is None or holder is None or g < WAIT_SHARE or (g_ev.get("gil_wait_samples") or 0) < MIN_WAIT_SAMPLES:
        return None
    n = int(g_ev.get("training_samples") or 0)
    name = holder.get("name") or "?"
    tid = holder.get("tid")
    frame = holder.get("frame") or "its Python loop"
    facts = [
        Fact("gil", "share of samples the training thread waited for the GIL (off-CPU in futex, another "
                    "thread holding it)", g),
        Fact("gil", f"thread holding the GIL during those waits: '{name}' (tid {tid}) in {frame}",
             holder.get("share_of_waits")),
        Fact("gil", f"share of all samples '{name}' held the GIL", holder.get("gil_share")),
        Fact("gil", "py-spy dumps taken (non-blocking)", g_ev.get("samples")),
    ]
    corroborated = False
    sched = ev.get("sched") or {}
    tt = sched.get("training_thread") or {}
    win = float(sched.get("window_s") or 0.0)
    if tt and win > 0:
        facts.append(Fact("sched", "share of the window the training thread slept (S state; GIL waits are sleeps)",
                          round(tt.get("sleep_seconds", 0.0) / win, 4)))
    for w in tt.get("woken_by") or []:
        if w.get("tid") == tid and win > 0:
            share = round(w["seconds"] / win, 4)
            facts.append(Fact("sched", f"share of the window the training thread slept until '{name}' woke it "
                                       f"({w['count']} wake-ups)", share))
            corroborated = w["count"] >= 10
    spy = ev.get("pyspy") or {}
    for o in spy.get("other_threads") or []:
        if o.get("tid") == tid:
            facts.append(Fact("pyspy", f"share of '{name}' samples that were busy (not waiting)", o.get("busy_fraction")))
    speedup = 1.0 / (1.0 - min(g, 0.95))
    conf = "high" if (n >= 20 and corroborated) else ("medium" if n >= 10 else "low")
    where = frame.split(" (", 1)[-1].rstrip(")") if "(" in frame else frame
    fixes = [
        Fix(f"Stop thread '{name}' from holding the GIL: it runs pure Python without pausing at {where}",
            change=f"in '{name}': wait between iterations (stop_event.wait(0.1) or time.sleep) or do its work in "
                   "batches, so the training thread gets the GIL back"),
        Fix(f"Or move '{name}' out of the training process",
            change="run it in a multiprocessing.Process (or as C/NumPy code that releases the GIL)"),
    ]
    bound = (f"g={g:.2f} of {n} samples the training thread waited for the GIL; if it never waits: "
             f"1/(1-g)={speedup:.2f}x (GIL waits only: the CPU the holder burns is not counted)")
    title = f"The training thread waits for the GIL {pct(g)} of the time, held by thread '{name}' (tid {tid})"
    return Finding("gil.contention", title, speedup, bound, conf, facts, fixes, risk="low",
                   details={"holder": holder, "gil_wait_share": g, "samples": n, "corroborated_by_sched": corroborated})


BUSY_BESIDE = 0.5            # another Python thread of the training process busy at least this share
# Threads torch and multiprocessing run beside the loop; they release the GIL while they copy or wait.
TORCH_HELPERS = ("_pin_memory_loop", "pin_memory", "Queue._feed", "_handle_workers", "_handle_results")


def _torch_helper(thread: dict) -> bool:
    frames = [f for top in thread.get("top") or [] for f in top.get("stack", [])]
    return any(h in f for f in frames for h in TORCH_HELPERS) or "pin_memory" in (thread.get("name") or "")


@rule("gil.contention", requires=("pyspy",), uses=("gil", "process"),
      description="without the GIL sampler: a busy Python thread beside the loop is worth a --deep look")
def gil_suspect(ev: Evidence) -> Finding | None:
    """The default probes cannot see GIL ownership. When py-spy shows another Python thread of the
    training process running most of the time, say so in the notes and how to measure it."""
    if ev.has("gil"):
        return None
    spy = ev.get("pyspy") or {}
    busy = [t for t in spy.get("other_threads") or [] if (t.get("busy_fraction") or 0) >= BUSY_BESIDE
            and not _torch_helper(t)]
    for t in busy[:2]:
        ev.note(f"Python thread '{t.get('name')}' (tid {t.get('tid')}) was busy {pct(t['busy_fraction'])} of the "
                "window beside the training thread: if it holds the GIL the loop waits for it; "
                "`trainprobe diagnose --deep` measures GIL contention")
    return None
