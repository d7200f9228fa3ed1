"""The GPU's idle time on the host's clock, attributed to what the training thread was doing.

Inputs are evidence only: `gpu` (NVML utilization samples of the target's GPUs, [[t_unix, pct]],
each describing the sample period that ends at its timestamp) and `pyspy` (the training thread's
timeline [[t0_unix, t1_unix, category]]).

One clock. NVML stamps its samples in microseconds since the epoch. py-spy stamps its chrometrace
in microseconds since it started, and the pyspy probe adds the wall-clock time at which it launched
py-spy (`anchor_unix`); both probes start together at the session's start. The alignment error is
py-spy's start-up latency, tens of milliseconds, well under NVML's 200 ms sample period. An
imported capture supplies its own anchor (the H200 captures started NVML polling and py-spy
together at `started_unix_us`; tests/test_gpu_idle.py shows the attribution does not move when
that anchor is off by a quarter of a second either way).

Attribution, one NVML sample period at a time. Within a period NVML gives only the busy share u,
not where the idle time fell, so the period's idle seconds (1 - u) x H, H the host seconds seen in
it, are handed to the host categories of that period in this order:
  1. waiting for a batch (data_wait), loading one in the loop (data_load), a blocking
     host-to-device copy (h2d_copy): the host issues no GPU work then, so the GPU's queue runs dry;
  2. the host running the step's Python (forward, backward, optimizer: "launch"; "other"): the
     GPU idles here only when the host issues kernels slower than the GPU runs them;
  3. a host sync (host_sync): the host waits for the GPU, which is busy by definition.
Within a tier, idle time is shared in proportion to the host seconds. The order is the physics of
an asynchronous queue: the GPU can only be busy with work that was launched, and it drains its
queue while the host does something else. The share of the observed time that a cause explains,
x, bounds the step-time gain of removing it: at most 1 / (1 - x) (Amdahl).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

CAUSE_OF = {"data_wait": "data_wait", "data_load": "data_load", "h2d_copy": "h2d_copy",
            "host_sync": "host_sync", "forward": "launch", "backward": "launch", "optimizer": "launch",
            "other": "other"}
CAUSES = ("data_wait", "data_load", "h2d_copy", "launch", "other", "host_sync")
IDLE_TIERS = (("data_wait", "data_load", "h2d_copy"), ("launch", "other"), ("host_sync",))
MIN_OVERLAP_S = 1.0
MIN_SAMPLES = 3


@dataclass
class Attribution:
    ok: bool
    reason: str | None = None
    gpu_indices: list[int] = field(default_factory=list)
    period_s: float | None = None
    overlap: tuple[float, float] | None = None
    samples: int = 0
    host_seconds: dict[str, float] = field(default_factory=dict)
    idle_seconds: dict[str, float] = field(default_factory=dict)
    busy_seconds: float = 0.0
    steps: dict[str, Any] = field(default_factory=dict)

    @property
    def observed_s(self) -> float:
        return sum(self.host_seconds.values())

    @property
    def idle_total_s(self) -> float:
        return sum(self.idle_seconds.values())

    def idle_share(self, *causes: str) -> float:
        """Share of the observed time that the GPU idled while the host was in these causes."""
        obs = self.observed_s
        return sum(self.idle_seconds.get(c, 0.0) for c in causes) / obs if obs > 0 else 0.0

    def host_share(self, *causes: str) -> float:
        obs = self.observed_s
        return sum(self.host_seconds.get(c, 0.0) for c in causes) / obs if obs > 0 else 0.0

    @property
    def busy_fraction(self) -> float:
        obs = self.observed_s
        return self.busy_seconds / obs if obs > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        if not self.ok:
            return {"ok": False, "reason": self.reason}
        obs = self.observed_s
        return {
            "ok": True, "gpu_indices": self.gpu_indices, "sample_period_s": self.period_s,
            "overlap_unix": [round(self.overlap[0], 3), round(self.overlap[1], 3)] if self.overlap else None,
            "samples": self.samples, "observed_seconds": round(obs, 3),
            "gpu_busy_fraction": round(self.busy_fraction, 4),
            "idle_share_by_cause": {c: round(self.idle_share(c), 4) for c in CAUSES},
            "host_share_by_cause": {c: round(self.host_share(c), 4) for c in CAUSES},
            "idle_seconds_by_cause": {c: round(self.idle_seconds.get(c, 0.0), 3) for c in CAUSES},
            "steps": self.steps,
        }


def amdahl(x: float) -> float:
    """Step-time gain if a share x of the step disappears: 1 / (1 - x)."""
    return 1.0 / max(1.0 - x, 0.01)


def sample_spans(util: list[list[float]], period_s: float) -> list[tuple[float, float, float]]:
    """[[t_end, pct], ...] -> (t0, t1, busy share): each sample covers the period ending at it."""
    out = []
    prev = None
    for t1, pct in sorted(util, key=lambda r: r[0]):
        span = period_s if prev is None or t1 - prev > 1.5 * period_s else t1 - prev
        prev = t1
        out.append((t1 - span, t1, max(0.0, min(1.0, float(pct) / 100.0))))
    return out


def _host_seconds(timeline: list[list[Any]], a: float, b: float, j: int) -> tuple[dict[str, float], int]:
    """Seconds per cause the training thread spent in [a, b]; j: first timeline index to look at."""
    while j < len(timeline) and timeline[j][1] <= a:
        j += 1
    out: dict[str, float] = {}
    k = j
    while k < len(timeline) and timeline[k][0] < b:
        t0, t1, cat = timeline[k][0], timeline[k][1], timeline[k][2]
        ov = min(b, t1) - max(a, t0)
        if ov > 0:
            cause = CAUSE_OF.get(cat, "other")
            out[cause] = out.get(cause, 0.0) + ov
        k += 1
    return out, j


def allocate_idle(host: dict[str, float], idle_s: float) -> dict[str, float]:
    """Hand a period's idle seconds to its host causes, tier by tier (see the module docstring)."""
    out = {c: 0.0 for c in host}
    left = idle_s
    for tier in IDLE_TIERS:
        have = sum(host.get(c, 0.0) for c in tier)
        if have <= 0 or left <= 0:
            continue
        take = min(left, have)
        for c in tier:
            if host.get(c, 0.0) > 0:
                out[c] = out.get(c, 0.0) + take * host[c] / have
        left -= take
    return out


def attribute(util: list[list[float]], period_s: float, timeline: list[list[Any]]) -> Attribution:
    """One GPU's samples against the training thread's timeline (both wall clock)."""
    tl = sorted((r for r in timeline if r[1] > r[0]), key=lambda r: r[0])
    spans = sample_spans(util, period_s)
    if not tl or not spans:
        return Attribution(False, "no host timeline" if not tl else "no GPU utilization samples")
    lo, hi = max(tl[0][0], spans[0][0]), min(tl[-1][1], spans[-1][1])
    if hi - lo < MIN_OVERLAP_S:
        return Attribution(False, f"the host timeline ({tl[0][0]:.1f}-{tl[-1][1]:.1f}) and the NVML samples "
                                  f"({spans[0][0]:.1f}-{spans[-1][1]:.1f}) overlap {max(hi - lo, 0.0):.2f} s, "
                                  f"less than {MIN_OVERLAP_S:g} s")
    host_tot: dict[str, float] = {}
    idle_tot: dict[str, float] = {}
    busy = 0.0
    n = 0
    j = 0
    for t0, t1, u in spans:
        a, b = max(t0, lo), min(t1, hi)
        if b <= a:
            continue
        host, j = _host_seconds(tl, a, b, j)
        h = sum(host.values())
        if h <= 0:
            continue
        n += 1
        busy += u * h
        for c, s in host.items():
            host_tot[c] = host_tot.get(c, 0.0) + s
        for c, s in allocate_idle(host, (1.0 - u) * h).items():
            idle_tot[c] = idle_tot.get(c, 0.0) + s
    if n < MIN_SAMPLES:
        return Attribution(False, f"only {n} NVML sample period(s) overlap the host timeline")
    return Attribution(True, None, [], period_s, (lo, hi), n, host_tot, idle_tot, busy)


def correlate(gpu: dict[str, Any] | None, spy: dict[str, Any] | None) -> Attribution:
    """The target's GPUs against the training thread: the mean over the target GPUs."""
    if not gpu:
        return Attribution(False, "no GPU evidence")
    if not spy or not spy.get("timeline"):
        return Attribution(False, "no py-spy timeline of the training thread")
    targets = list(gpu.get("target_gpus") or [])
    # The training thread's own GPU(s) when the job has several ranks: each rank drives its own.
    own_pid = (spy.get("training_thread") or {}).get("pid")
    own = sorted({p["gpu_index"] for p in gpu.get("processes") or [] if p.get("pid") == own_pid})
    if spy.get("ranks") and own and set(own) <= set(targets):
        targets = own
    if not targets:
        notes = [n for n in gpu.get("notes", []) if "PID" in n]
        return Attribution(False, notes[0] if notes else "the target uses no GPU")
    period = gpu.get("sample_period_s")
    if not period:
        return Attribution(False, "the GPU's sample period is unknown (fewer than 3 NVML samples)")
    util = gpu.get("utilization") or {}
    parts = []
    reasons = []
    for i in targets:
        series = util.get(i)
        per = (gpu.get("per_gpu") or {}).get(i) or {}
        a = attribute(series or [], per.get("sample_period_s") or period, spy["timeline"])
        if a.ok:
            parts.append(a)
        else:
            reasons.append(f"GPU {i}: {a.reason}")
    if not parts:
        return Attribution(False, "; ".join(reasons))
    k = float(len(parts))
    out = Attribution(True, None, [i for i in targets], period,
                      (min(p.overlap[0] for p in parts), max(p.overlap[1] for p in parts)),
                      sum(p.samples for p in parts),
                      {c: sum(p.host_seconds.get(c, 0.0) for p in parts) / k for c in CAUSES},
                      {c: sum(p.idle_seconds.get(c, 0.0) for p in parts) / k for c in CAUSES},
                      sum(p.busy_seconds for p in parts) / k)
    out.steps = infer_steps(spy["timeline"], spy.get("rate_hz"), util.get(targets[0]) or [], period)
    return out


def for_evidence(ev: Any) -> Attribution:
    """correlate() on an Evidence, computed once per diagnosis (several rules ask)."""
    gpu, spy = ev.get("gpu"), ev.get("pyspy")
    key = (id(gpu), id(spy))
    cached = ev.context.get("gpu_idle")
    if cached is not None and cached[0] == key:
        return cached[1]
    att = correlate(gpu, spy)
    ev.context["gpu_idle"] = (key, att)
    return att


# -- steps ---------------------------------------------------------------------------------------

STEP_STARTS = (("data_wait", "data_load"), ("h2d_copy",))
MIN_STEPS = 3
SAMPLES_PER_PHASE = 3      # a phase shorter than ~3 py-spy samples is missed in some steps
MAX_STEP_CV = 0.5          # merged (missed) steps make the durations irregular
DEFAULT_RATE_HZ = 25       # trainprobe's py-spy rate when the evidence does not say


def _blocks(tl: list[list[Any]], cats: tuple[str, ...]) -> tuple[list[float], list[float], list[float]]:
    """Starts of the runs of `cats`, and the lengths of those runs and of the runs between them."""
    starts: list[float] = []
    inside_len: list[float] = []
    outside_len: list[float] = []
    cur_in: bool | None = None
    cur_t0 = 0.0
    cur_t1 = 0.0
    for t0, t1, cat in tl:
        inside = cat in cats
        if inside != cur_in:
            if cur_in is not None:
                (inside_len if cur_in else outside_len).append(cur_t1 - cur_t0)
            if inside:
                starts.append(t0)
            cur_in, cur_t0 = inside, t0
        cur_t1 = t1
    if cur_in is not None:
        (inside_len if cur_in else outside_len).append(cur_t1 - cur_t0)
    return starts, inside_len, outside_len


def infer_steps(timeline: list[list[Any]], rate_hz: Any, util: list[list[float]], period_s: float) -> dict[str, Any]:
    """Steps from the host timeline: a step starts when the loop starts fetching its batch (or, with
    no DataLoader, copying it to the GPU). Trusted only when both the fetch and the rest of the step
    last several py-spy samples and the steps come out regular; otherwise phases shorter than the
    sampling are missed and steps merge. The GPU's busy share per step needs steps at least one
    NVML period long."""
    import statistics  # noqa: PLC0415 - only where GPU evidence is read
    tl = sorted(timeline, key=lambda r: r[0])
    if len(tl) < 2:
        return {"inferred": False, "why": "no host timeline"}
    rate = float(rate_hz) if rate_hz else float(DEFAULT_RATE_HZ)
    dt = 1.0 / rate
    for cats in STEP_STARTS:
        starts, in_len, out_len = _blocks(tl, cats)
        if len(starts) >= MIN_STEPS + 1:
            break
    else:
        return {"inferred": False, "why": "the training thread never fetched or copied a batch in a way "
                                          "py-spy could see step by step"}
    durations = [b - a for a, b in zip(starts, starts[1:])]
    base = {"boundary": "+".join(cats), "py_spy_rate_hz": rate}
    shortest = min(statistics.median(in_len), statistics.median(out_len) if out_len else 0.0)
    if shortest < SAMPLES_PER_PHASE * dt:
        return {**base, "inferred": False,
                "why": f"steps are too short for py-spy at {rate:g} Hz to tell apart "
                       f"(a phase of {1000 * shortest:.0f} ms is under {SAMPLES_PER_PHASE} samples)"}
    step_s = statistics.median(durations)
    cv = statistics.pstdev(durations) / statistics.fmean(durations) if len(durations) > 1 else 0.0
    if cv > MAX_STEP_CV:
        return {**base, "inferred": False,
                "why": f"the step boundaries py-spy saw are irregular (CV {cv:.2f}): some steps were missed"}
    out = {**base, "inferred": True, "count": len(durations), "median_seconds": round(step_s, 4),
           "steps_per_s": round(1.0 / step_s, 2) if step_s > 0 else None, "cv": round(cv, 3)}
    if step_s < period_s:
        out["busy_share_per_step"] = None
        out["why_no_per_step_busy"] = (f"a step ({1000 * step_s:.0f} ms) is shorter than NVML's "
                                       f"{1000 * period_s:.0f} ms sample period")
        return out
    spans = sample_spans(util, period_s)
    shares = []
    for a, b in zip(starts, starts[1:]):
        cov = busy = 0.0
        for t0, t1, u in spans:
            ov = min(b, t1) - max(a, t0)
            if ov > 0:
                cov += ov
                busy += ov * u
        if cov >= 0.5 * (b - a):
            shares.append(round(busy / cov, 3))
    out["busy_share_per_step"] = shares[:100]
    if shares:
        out["busy_share_per_step_summary"] = {"mean": round(statistics.fmean(shares), 3), "min": min(shares),
                                              "max": max(shares)}
    return out
