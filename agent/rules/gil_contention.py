"""gil.contention: the training thread waits for the GIL held by another thread of its process.

A finding rests on a direct measure of who held the GIL, never on CPU time or frames alone.

Default run: the py-spy probe's GIL sampler (`py-spy record --gil`) records, at each sample, the one
thread that held the GIL. A thread that held it at least SUSPECT_SHARE of the time is a suspect; the
training thread's GIL wait g is its off-CPU time in Python or torch code, at most the share of the
window other threads held the GIL (agent/combiners/gil_wait.py). A thread blocked in a read, a queue
or a sleep, or in a C call that released the GIL, holds nothing and adds nothing. Without the GIL
the loop would run that time: the expected speedup model is `_gain` (docs/models.md).

With --deep, measured also by the `gil` probe: in each py-spy dump, the training thread is counted as waiting for
the GIL when another thread holds it and the training thread is off-CPU, blocked in futex (how
CPython waits for the GIL), with no deliberate wait (queue, lock, sleep) as its innermost frame.
The share g of such samples is time the loop could have run Python and did not. If the holder
stopped holding the GIL that time would return to the loop: the expected speedup is 1 / (1 - g).
It counts the GIL waits alone: a holder that spins also takes a CPU from the loop, which shows as
run-queue delay (cpu.oversubscribed), so the real gain can be larger. The scheduler probe
corroborates it independently: how long the training thread slept, and how often the holder woke
it (a GIL hand-over wakes the waiter from the holder's thread).

On a free-threaded build (python3.13t) there is no GIL and no finding.
"""
from __future__ import annotations

from typing import Any

from trainprobe.agent.combiners import step_model
from trainprobe.agent.combiners.gil_wait import free_threaded, gil_wait, ownership, suspects
from trainprobe.agent.combiners.step_model import Change
from trainprobe.agent.evidence import Evidence
from trainprobe.agent.findings import Fact, Finding, Fix, pct
from trainprobe.agent.rules import rule

WAIT_SHARE = 0.10            # the training thread waits for the GIL at least this share of samples
MIN_WAIT_SAMPLES = 3


# Threads a framework starts, known by a source file on the stacks in which they held the GIL, and
# the setting that stops them: (files, what the thread is, the fix, its knobs).
KNOWN_HOLDERS = (
    (("lightning/pytorch/callbacks/progress/rich_progress.py",
      "pytorch_lightning/callbacks/progress/rich_progress.py"),
     "Lightning's RichProgressBar refresh thread (the Trainer picks that bar whenever rich is installed; "
     "the thread redraws the bar's table under the GIL, up to refresh_rate times a second)",
     "Trainer(..., enable_progress_bar=False), or Trainer(..., callbacks=[TQDMProgressBar()]) to keep a bar "
     "drawn from the training thread (no thread of its own)",
     {"enable_progress_bar": False}),
    (("rich/live.py",),
     "rich's Live auto-refresh thread (a rich Progress or Live display)",
     "Progress(..., auto_refresh=False) and refresh from the loop every N steps, or a lower refresh_per_second",
     None),
)


def known_holder(files: list[str] | None) -> tuple[str, str, dict | None] | None:
    """(what the thread is, its fix, knobs) for a GIL holder whose stacks show a known package's file."""
    for marks, what, fix, knobs in KNOWN_HOLDERS:
        if any(f == m or f.endswith("/" + m) for f in files or [] for m in marks):
            return what, fix, knobs
    return None


def _holder_fixes(name: str, where: str, knobs: dict | None = None, files: list[str] | None = None) -> list[Fix]:
    known = known_holder(files)
    if known is not None:
        what, fix, own = known
        return [Fix(f"Stop thread '{name}' from holding the GIL: it is {what}", change=fix,
                    knobs=own if own is not None else knobs)]
    return [Fix(f"Stop thread '{name}' from holding the GIL: it runs pure Python without pausing at {where}",
                change=f"in '{name}': wait between iterations (stop_event.wait(0.1) or time.sleep) or do its work in "
                       "batches, so the training thread gets the GIL back", knobs=knobs),
            Fix(f"Or move '{name}' out of the training process",
                change="run it in a multiprocessing.Process (or as C/NumPy code that releases the GIL)")]


def _sched_facts(ev: Evidence, name: str, tid: Any) -> tuple[list[Fact], bool]:
    """The scheduler probe's view: how long the training thread slept, and whether the holder woke it
    often enough to corroborate the hand-overs."""
    facts: list[Fact] = []
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
    return facts, corroborated


@rule("gil.contention", requires=("gil",), uses=("sched", "pyspy"),
      description="the training thread waits for the GIL held by another of its threads (py-spy dumps)")
def gil_contention(ev: Evidence) -> Finding | None:
    if free_threaded(ev):
        return None
    g_ev = ev.get("gil") or {}
    g = g_ev.get("gil_wait_share")
    holder = g_ev.get("holder")
    if g is None or holder is None or g < WAIT_SHARE or (g_ev.get("gil_wait_samples") or 0) < MIN_WAIT_SAMPLES:
        return None
    n = int(g_ev.get("training_samples") or 0)
    name, tid = holder.get("name") or "?", holder.get("tid")
    frame = holder.get("frame") or "its Python loop"
    facts = [
        Fact("gil", "share of samples the training thread waited for the GIL (off-CPU in futex, another "
                    "thread holding it)", g),
        Fact("gil", f"thread holding the GIL during those waits: '{name}' (tid {tid}) in {frame}",
             holder.get("share_of_waits")),
        Fact("gil", f"share of all samples '{name}' held the GIL", holder.get("gil_share")),
        Fact("gil", "py-spy dumps taken (non-blocking)", g_ev.get("samples")),
    ]
    sched_facts, corroborated = _sched_facts(ev, name, tid)
    facts += sched_facts
    for o in (ev.get("pyspy") or {}).get("other_threads") or []:
        if o.get("tid") == tid:
            facts.append(Fact("pyspy", f"share of '{name}' samples that were busy (not waiting)", o.get("busy_fraction")))
    speedup, interval = 1.0 / (1.0 - min(g, 0.95)), None
    cpu_g = gil_wait(ev)
    if cpu_g is not None:
        # The sampler sees the waits it happens to catch; the training thread's lost CPU time counts
        # every one of them (a holder that hands the GIL over in short bursts hides from the dumps).
        g = max(g, cpu_g["g"])
        speedup, interval, _, _ = on_step_model(ev, {**cpu_g, "g": g}, tid)
        facts.append(Fact("process", "share of the window the training thread was in Python or torch code but "
                                     "neither on a CPU nor waiting for one", g))
    conf = "high" if (n >= 20 and corroborated) else ("medium" if n >= 10 else "low")
    where = frame.split(" (", 1)[-1].rstrip(")") if "(" in frame else frame
    bound = (f"g={g:.2f} of {n} samples the training thread waited for the GIL; if it never waits: "
             f"1/(1-g)={speedup:.2f}x (GIL waits only: the CPU the holder burns is not counted)")
    title = f"The training thread waits for the GIL {pct(g)} of the time, held by thread '{name}' (tid {tid})"
    return Finding("gil.contention", title, speedup, bound, conf, facts, _holder_fixes(name, where), risk="low",
                   interval=interval,
                   details={"holder": holder, "gil_wait_share": g, "samples": n, "corroborated_by_sched": corroborated})


GIL_SHARE = 0.10              # the default-run estimate must reach this share to make a finding


# The loop's own CPU time per step also shrinks once the GIL is free (fewer hand-overs, a warm
# cache): by (1-g)^alpha, the step model's gil_alpha (optimistic, middle, pessimistic); the interval
# spans its ends with g's error (docs/models.md).
OTHER_WAIT = 0.10             # off-code samples below this are GIL hand-over noise, not waits that stay


def _alphas() -> tuple[float, float, float]:
    """gil_alpha's (optimistic, middle, pessimistic) exponents; a fitted middle beyond an end moves
    that end (a held-out fold may fit one)."""
    a_hi, a_mid, a_lo = step_model.calibration().gil_alpha
    return max(a_hi, a_mid), a_mid, min(a_lo, a_mid)


def _holder_cores(ev: Evidence, tid: Any) -> float:
    """Cores the GIL's holder used (process probe), freed with it."""
    for p in (ev.get("process") or {}).get("processes") or []:
        for t in p.get("threads") or []:
            if t.get("tid") == tid:
                return float(t.get("cpu_fraction") or 0.0)
    return 0.0


def _team_cores(ev: Evidence, tid: Any) -> float:
    """Cores the training process's other threads used (its intra-op team, helpers): neither the GIL's
    holder, nor the training thread, nor the pin-memory thread."""
    proc = ev.get("process") or {}
    me = next((p for p in proc.get("processes") or [] if p.get("pid") == proc.get("pid")), None) or {}
    threads = me.get("threads") or []
    train = max(threads, key=lambda t: float(t.get("cpu_fraction") or 0.0), default=None)
    spy = ((ev.get("pyspy") or {}).get("training_thread") or {}).get("tid")
    skip = {tid, spy if spy is not None else (train or {}).get("tid")}
    return sum(float(t.get("cpu_fraction") or 0.0) for t in threads
               if t.get("tid") not in skip and not any(k in (t.get("name") or "") for k in step_model.PIN_THREAD))


def change_of(ev: Evidence, m: dict, tid: Any) -> Change:
    """gil.contention's fix in the step model's terms: the loop's step after it (the GIL model's
    three ends) and the cores freed: the holder's, the loop's own CPU time saved and, at the
    interval's optimistic end, what its intra-op team burnt while the loop waited for the GIL or a
    CPU (OpenMP threads spin at a barrier for their master: a share g + r of their CPU)."""
    c = max(float(m.get("c") or 0.0), 0.02)
    g = min(max(float(m["g"]), 0.0), 0.97)
    shrink = c * (1.0 - (1.0 - g) ** _alphas()[1])   # the loop's CPU time saved
    waited = min(g + max(float(m.get("r") or 0.0), 0.0), 1.0)
    return Change(gil_step=_steps(m), gil_freed_cores=_holder_cores(ev, tid) + shrink,
                  gil_freed_extra=_team_cores(ev, tid) * waited)


def on_step_model(ev: Evidence, m: dict, tid: Any) -> tuple[float, tuple[float, float], str | None, dict | None]:
    """(speedup, interval, binding words, details): the step after the fix with every other
    constraint in place (the workers' pace, the GPU's busy time, the CPUs); the GIL model alone where
    the step model has no training thread."""
    mid, iv = _gain(m)
    sm = step_model.from_evidence(ev)
    if sm is None:
        return mid, iv, None, None
    ch = change_of(ev, m, tid)
    step = sm.after(ch)
    lo, hi = step.interval
    sp = max(step.speedup, 1.0)
    details = {**sm.details(step), "change": {"gil_step": [round(x, 4) for x in ch.gil_step or ()],
                                              "gil_freed_cores": round(ch.gil_freed_cores, 4),
                                              "gil_freed_extra": round(ch.gil_freed_extra, 4)}}
    return sp, (min(lo, sp), max(hi, sp)), step_model.BINDING_WORDS.get(step.binding, step.binding), details


def _steps(m: dict) -> tuple[float, float, float]:
    """The step after the fix (shares of today's): shortest, middle, longest; see _gain."""
    mid, (lo, hi) = _gain(m)
    return 1.0 / hi, 1.0 / mid, 1.0 / max(lo, 1e-6)


def _gain(m: dict) -> tuple[float, tuple[float, float]]:
    """Without the holder the loop runs its own CPU time c, shrunk by (1-g)^alpha, plus the waits
    that stay: outside code (1 - b beyond OTHER_WAIT), and the off-CPU time in code that the GIL's
    holders do not explain (native waits, unexplained): gain = 1 / (c (1-g)^alpha + w). The low end
    is also at most 1/(1-g), the GIL waits alone (docs/models.md)."""
    g, e, c, b = m["g"], m["g_err"], max(float(m.get("c") or 0.0), 0.02), float(m.get("b") or 1.0)
    waits = m.get("waits") or {}
    # Off-CPU time in code that no known wait explains: in native frames (a torch op that has
    # finished and waits to take the GIL back looks the same as a native lock) or in none.
    unexplained = float(waits.get("native_other", 0.0)) + float(waits.get("unexplained", 0.0))
    w = max(0.0, (1.0 - b) - OTHER_WAIT) + unexplained

    def gain(gg: float, alpha: float, ww: float = w) -> float:
        return 1.0 / (c * (1.0 - min(max(gg, 0.0), 0.97)) ** alpha + ww)

    a_hi, a_mid, a_lo = _alphas()
    mid = gain(g, a_mid)
    lo = min(gain(g - e, a_lo), 1.0 / (1.0 - max(0.0, min(g - e, 0.97))))
    # g and that unexplained time split one measured total (off-CPU in code, from /proc), g capped
    # by the holders' sampled share: where the holders held the GIL more than their samples show
    # (g + e), that much less of the total is unexplained.
    hi = gain(g + e, a_hi, w - min(e, unexplained))
    mid = max(mid, 1.0)
    return mid, (min(lo, mid), max(hi, mid))


@rule("gil.contention", requires=("pyspy",), uses=("gil", "process"),
      description="another thread of the training process held the GIL (py-spy --gil) while the training "
                  "thread was off-CPU in Python code (default run)")
def gil_from_ownership(ev: Evidence) -> Finding | None:
    if ev.has("gil"):
        return None           # the sampler's rule names the holder and reads the same evidence
    m = gil_wait(ev)
    if m is None or not m["suspects"]:
        return None
    if m["g"] < GIL_SHARE:
        return None
    own = ownership(ev)
    t = m["suspects"][0]
    name, tid = t.get("name") or "?", t.get("tid")
    where = t.get("frame") or "its Python loop"
    speedup, interval, binding, sm_details = on_step_model(ev, m, tid)
    facts = [
        Fact("pyspy", f"share of py-spy --gil samples in which thread '{name}' (tid {tid}) held the GIL "
                      f"(read from the interpreter; {t['samples']} of {own.get('samples')} samples at "
                      f"{own.get('rate_hz'):g} Hz), in {where}", t["share"]),
        Fact("pyspy", "share of the window threads other than the training thread held the GIL", m["h"]),
        Fact("pyspy", "share of the window the training thread waited for the GIL: its off-CPU time in Python "
                      "or torch code, at most what the others held", m["g"]),
        Fact("pyspy", "share of the training thread's samples in Python or torch code (not a blocking wait)", m["b"]),
        Fact("pyspy", "share of the window the training thread ran on a CPU (/proc)", m["c"]),
        Fact("pyspy", "share of the window it waited for a CPU (schedstat)", m["r"]),
    ]
    a_hi, a_mid, a_lo = _alphas()
    bound = (f"g=min(off-CPU in code, held by others)={m['g']:.2f} of the window the training thread waited while "
             f"'{name}' held the GIL ({t['share']:.0%} of py-spy --gil samples); with the GIL free the loop runs "
             f"its own CPU time c={m['c']:.2f}, which also shrinks by (1-g)^{a_mid:g} (fitted to the ledger): "
             f"{speedup:.2f}x (estimate; g +-{m['g_err']:.2f}, exponent {a_lo:g}-{a_hi:g})"
             + (f"; with every other constraint in place the step is then set by {binding}" if binding else ""))
    conf = "medium" if (m["samples"] >= 50 and m["gil_samples"] >= 40) else "low"
    title = (f"The training thread waits for the GIL about {pct(m['g'])} of the time: thread '{name}' "
             f"(tid {tid}) held it {pct(t['share'])} of the window")
    fixes = _holder_fixes(name, where, {"background_thread_holds_gil": False}, t.get("files"))
    return Finding("gil.contention", title, speedup, bound, conf, facts, fixes, risk="low", interval=interval,
                   details={"holder": {"name": name, "tid": tid, "gil_share": t["share"], "frame": t.get("frame")},
                            "gil_wait_share": m["g"], "source": "gil_ownership",
                            "model": {k: m[k] for k in ("b", "c", "r", "h", "g", "g_err", "samples", "gil_samples")},
                            "step_model": sm_details})


@rule("gil.contention", requires=("pyspy",), uses=("gil", "process"),
      description="GIL ownership could not be measured: say so when the training process has other threads")
def gil_unmeasured(ev: Evidence) -> Finding | None:
    """When py-spy's GIL sampler did not run (or this capture predates it), no GIL wait is inferred
    from CPU time or frames: the notes say it was not measured, where another thread of the process
    ran Python at all (py-spy saw it busy in some sample)."""
    if ev.has("gil") or free_threaded(ev):
        return None
    own = ownership(ev)
    spy = ev.get("pyspy") or {}
    if own.get("measured") or not spy.get("training_thread") or not spy.get("other_threads"):
        return None
    if not any(float(t.get("busy_fraction") or 0.0) > 0.0 for t in spy["other_threads"]):
        # Every other thread sat idle (blocked, or with no Python frames) in every sample: none of them
        # could have held the GIL, so there is nothing left unmeasured to note.
        return None
    ev.note(f"GIL ownership was not measured ({own.get('reason') or 'no py-spy --gil samples'}): gil.contention "
            "was not assessed; `trainprobe diagnose --deep` samples the GIL's holder")
    return None
