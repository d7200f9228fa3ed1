"""The agent's cost on a GPU node, against a real training script (benchmarks/gpu_cost_job.py:
torchvision resnet18 on FakeData through real DataLoader workers, or resnet50 compute-bound), one
command, JSON results under a directory. See docs/cost.md.

    PYTHONPATH=$REPO python3 benchmarks/gpu_cost.py --out $OUT/cost \\
        [--cases data:14,compute:14,data:0] [--pairs 5] [--window 10] [--full-runs 2]

Each case: start the job, wait for its steps/s to settle, then `--pairs` alternating pairs
(untouched window, `trainprobe diagnose` window with default planned sampling), then `--full-runs`
windows at full sampling (`--rate 25`: one py-spy over every process). Prints one summary line per
case; gpu_cost.json has every window. py-spy must be installed (a wheel carried to the node).

`--design paired` resolves an effect of about 1% on a job whose own speed swings several percent
between windows: short windows, interleaved D A D B D A ... (D untouched; A, B the attached arms:
`diagnose` with each `--arms` entry's arguments) until `--time-budget` is spent. Each attached
window's steps/s (from the job's own PROGRESS log, over exactly the window the report gives) is
divided by the mean of the two untouched windows beside it, which cancels the job's linear drift;
the paired statistic is the mean of log(ratio) over the attached windows of an arm, with its 95%
Student-t interval, given as a ratio (exp). Beside the rate, every window records the training
thread's CPU, run-queue wait and context switches per step and the process's page faults per step
(/proc, read at the window's edges), so an effect can be told apart: CPU taken from the loop (run
queue), the loop waiting on something the agent holds (page-table lock behind py-spy's
process_vm_readv, the driver behind NVML: voluntary switches, wall per step without more CPU), or
the job itself. The pace is also split in two paired factors, steps/s = duty x work rate: the loop's
share of wall time on a CPU (what the agent takes from it directly: run-queue wait, blocking on
something it holds; resolved far below 1% because a CPU-bound loop's duty hardly moves by itself)
and its steps per CPU-second of the loop's thread (the job's own pace, the host's steal, and what
slows its CPU work: a shared core, caches), with the node's steal time per window; the work rate is
also given over the loop's user-mode CPU alone (the kernel's part is mostly page faults), the faults
per step as a paired ratio, and the whole effect regressed on the faults' ratio (fault_adjusted).
Every progress point of the job is kept (`progress`: unix time, steps), so each step's length can be
read after the run. `--control-cpu N` runs a bystander (benchmarks/cost_control.py: a fixed loop with
a working set in the core's own caches) pinned to CPU N through every window and gives each ratio over
the bystander's in the same windows (`ratio_over_control`, `work_rate_over_control`), with the
bystander's own ratios beside them: the host's speed of the moment moves both, the agent's
preempting the bystander moves only its rate, not its work rate. One summary file (gpu_paired.json)
and one line per arm; the cost-model check of bench_cost.py on the attached windows; exit 1 when that
check fails.

    pip install --no-index .whl/py_spy-*.whl
    PYTHONPATH=$PWD timeout 470 python3 benchmarks/gpu_cost.py --design paired --cases data:0 \
        --window 6 --time-budget 400 --out $OUT/cost
"""
from __future__ import annotations

import argparse
import atexit
import json
import math
import os
import shlex
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from _cost_bench import (REPO, _T95, diagnose, model_check, model_table, report_model_checks, run_case,
                         summary_line)

JOB = Path(__file__).resolve().parent / "gpu_cost_job.py"
TICK = float(os.sysconf("SC_CLK_TCK"))


class Job:
    def __init__(self, variant: str, workers: int, cmd: str | None = None, batch_size: int | None = None,
                 job_env: dict[str, str] | None = None):
        env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONWARNINGS="ignore", **(job_env or {}))
        argv = ([sys.executable, str(JOB), "--variant", variant, "--workers", str(workers),
                 *(["--batch-size", str(batch_size)] if batch_size else [])] if not cmd
                else shlex.split(cmd.format(variant=variant, workers=workers, python=sys.executable)))
        self.proc = subprocess.Popen(argv,
                                     cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        self.points: list[tuple[float, int]] = []
        self.tail: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for line in self.proc.stdout:
            if line.startswith("PROGRESS"):
                kv = dict(x.split("=", 1) for x in line.split()[1:])
                self.points.append((float(kv["t"]), int(kv["steps"])))
            else:
                self.tail = (self.tail + [line.rstrip()])[-20:]

    @property
    def pid(self) -> int:
        return self.proc.pid

    def rate(self, t0: float, t1: float) -> float:
        pts = [p for p in self.points if t0 <= p[0] <= t1]
        if len(pts) < 2:
            return float("nan")
        (a, na), (b, nb) = pts[0], pts[-1]
        return (nb - na) / (b - a)

    def settle(self, warm_s: float, timeout: float = 180.0) -> None:
        t = time.monotonic()
        while len(self.points) < 2:
            if self.proc.poll() is not None or time.monotonic() - t > timeout:
                raise RuntimeError("job failed to start: " + " | ".join(self.tail[-5:]))
            time.sleep(0.2)
        time.sleep(warm_s)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# -- the paired, interleaved design -------------------------------------------------------------------

def _thread_facts(pid: int) -> dict[str, float] | None:
    """The training thread's CPU and run-queue wait (schedstat, ns), its context switches, and the
    process's page faults: read at a window's edges."""
    try:
        with open(f"/proc/{pid}/task/{pid}/schedstat") as fh:
            run_ns, wait_ns, _ = (int(x) for x in fh.read().split()[:3])
        with open(f"/proc/{pid}/task/{pid}/status") as fh:
            st = dict(ln.split(":", 1) for ln in fh.read().splitlines() if ":" in ln)
        with open(f"/proc/{pid}/stat") as fh:
            f = fh.read().rsplit(")", 1)[1].split()
        with open(f"/proc/{pid}/task/{pid}/stat") as fh:
            tf = fh.read().rsplit(")", 1)[1].split()
    except (OSError, ValueError):
        return None
    steal, total = _cpu_steal()
    # The thread's user and kernel CPU (clock ticks): the kernel part is mostly the page faults of
    # the loop's large allocations, which move with the allocator's state from one window to the next.
    return {"t": time.time(), "run_s": run_ns / 1e9, "wait_s": wait_ns / 1e9,
            "utime_s": int(tf[11]) / TICK, "stime_s": int(tf[12]) / TICK,
            "vcsw": float(st["voluntary_ctxt_switches"]), "ivcsw": float(st["nonvoluntary_ctxt_switches"]),
            "minflt": float(f[7]), "majflt": float(f[9]), "steal": steal, "cpu_total": total}


def _cpu_steal() -> tuple[float, float]:
    """The node's steal and total jiffies (/proc/stat's cpu line): time the hypervisor ran others."""
    try:
        with open("/proc/stat") as fh:
            v = [float(x) for x in fh.readline().split()[1:]]
    except (OSError, ValueError):
        return 0.0, 0.0
    return (v[7] if len(v) > 7 else 0.0), sum(v[:8])


def _split(a: dict[str, float] | None, b: dict[str, float] | None, steps: float) -> dict[str, float] | None:
    """A window's pace in two factors: the loop's share of wall time on a CPU (duty: what the agent
    takes from it directly, as run-queue wait or blocking on something it holds) and its steps per
    CPU-second on the loop's thread (work rate: the job's own pace, and whatever slows its CPU work:
    a shared core, caches, the host's steal). steps/s = duty x work rate."""
    if not a or not b or steps <= 0 or b["t"] <= a["t"] or b["run_s"] <= a["run_s"]:
        return None
    dt = b["t"] - a["t"]
    tot = b["cpu_total"] - a["cpu_total"]
    user = b["utime_s"] - a["utime_s"]
    return {"duty": (b["run_s"] - a["run_s"]) / dt, "work_rate": steps / (b["run_s"] - a["run_s"]),
            # steps per second of the loop's user-mode CPU: its work with the kernel's page-fault
            # handling left out
            "user_work_rate": steps / user if user > 0 else None,
            "faults_per_step": (b["minflt"] - a["minflt"]) / steps,
            "steal_share": (b["steal"] - a["steal"]) / tot if tot > 0 else 0.0}


def _per_step(a: dict[str, float] | None, b: dict[str, float] | None, steps: float) -> dict[str, float] | None:
    if not a or not b or steps <= 0:
        return None
    return {"thread_cpu_ms": round(1e3 * (b["run_s"] - a["run_s"]) / steps, 3),
            "thread_user_ms": round(1e3 * (b["utime_s"] - a["utime_s"]) / steps, 3),
            "thread_kernel_ms": round(1e3 * (b["stime_s"] - a["stime_s"]) / steps, 3),
            "runqueue_wait_ms": round(1e3 * (b["wait_s"] - a["wait_s"]) / steps, 3),
            "voluntary_switches": round((b["vcsw"] - a["vcsw"]) / steps, 2),
            "involuntary_switches": round((b["ivcsw"] - a["ivcsw"]) / steps, 2),
            "minor_faults": round((b["minflt"] - a["minflt"]) / steps, 1),
            "major_faults": round((b["majflt"] - a["majflt"]) / steps, 2)}


def _steps(job: "Job", t0: float, t1: float) -> tuple[float, float]:
    """(steps, seconds) between the first and the last progress point inside [t0, t1]."""
    pts = [p for p in job.points if t0 <= p[0] <= t1]
    if len(pts) < 2:
        return 0.0, 0.0
    return float(pts[-1][1] - pts[0][1]), pts[-1][0] - pts[0][0]


# The bystander loop (--control-cpu): started by main, read at every window's edges beside the job.
CONTROL: "Job | None" = None
CONTROL_SCRIPT = Path(__file__).resolve().parent / "cost_control.py"


# (statistic, the attached window's key): the bystander's own ratios and the job's over them
CONTROL_STATS = (("control_rate", "control_rate_ratio"), ("control_work_rate", "control_work_rate_ratio"),
                 ("ratio_over_control", "ratio_over_control"), ("work_rate_over_control", "work_rate_over_control"))


def _control_facts() -> dict[str, float] | None:
    return _thread_facts(CONTROL.pid) if CONTROL is not None else None


def _control_split(a: dict[str, float] | None, b: dict[str, float] | None) -> dict[str, float] | None:
    """The bystander's pace over [a, b] (steps per wall second) and its work rate (steps per second of
    its own CPU: what the host's speed sets, not whether the agent preempted it)."""
    if CONTROL is None or not a or not b or b["t"] <= a["t"] or b["run_s"] <= a["run_s"]:
        return None
    n = _steps_between(CONTROL, a, b)
    return {"rate": n / (b["t"] - a["t"]), "work_rate": n / (b["run_s"] - a["run_s"])} if n > 0 else None


def _detached(job: "Job", window: float) -> dict[str, Any]:
    a, ca = _thread_facts(job.pid), _control_facts()
    t0 = time.time()
    time.sleep(window)
    t1 = time.time()
    b, cb = _thread_facts(job.pid), _control_facts()
    n, secs = _steps(job, t0, t1)
    between = _steps_between(job, a, b)
    # Per-step facts divide the thread's counters over [a, b] by the steps over the same interval
    # (interpolated between progress points), not by the whole steps between the window's first and
    # last point: at 6-10 steps a window that would move them by a step's worth.
    return {"arm": "detached", "t0": t0, "t1": t1, "steps": n, "steps_per_s": n / secs if secs else float("nan"),
            "per_step": _per_step(a, b, between), "split": _split(a, b, between), "control": _control_split(ca, cb)}


def _steps_between(job: "Job", a: dict[str, float] | None, b: dict[str, float] | None) -> float:
    """Steps between two readings' times, interpolated between the progress points around them. A
    reading taken after the last point waits for the next one (at most 3 s): counted at the last
    point instead, the window would lose up to a step (up to 12% of a 6 s window of 0.7 s steps)."""
    if not a or not b:
        return 0.0
    t_end = time.monotonic() + 3.0
    while (not job.points or job.points[-1][0] < b["t"]) and time.monotonic() < t_end and job.proc.poll() is None:
        time.sleep(0.02)
    return _steps_at(job, b["t"]) - _steps_at(job, a["t"])


def _steps_at(job: "Job", t: float) -> float:
    pts = job.points
    for (ta, na), (tb, nb) in zip(pts, pts[1:]):
        if ta <= t <= tb:
            return na + (nb - na) * (t - ta) / (tb - ta) if tb > ta else float(na)
    return float(pts[-1][1]) if pts and t > pts[-1][0] else 0.0


def _attached(job: "Job", window: float, arm: str, args: list[str]) -> dict[str, Any]:
    a, ca = _thread_facts(job.pid), _control_facts()
    d = diagnose(job.pid, window, args)
    b, cb = _thread_facts(job.pid), _control_facts()
    d["arm"] = arm
    if d.get("ok") and d.get("window_start_unix"):
        w0 = float(d["window_start_unix"])
        w1 = w0 + float(d.get("window_s") or window)
        n, secs = _steps(job, w0, w1)
        d.update(steps=n, steps_per_s=n / secs if secs else float("nan"), w0=w0, w1=w1)
        # The per-step facts span the agent's whole run (start-up and teardown too).
        between = _steps_between(job, a, b)
        d["per_step"] = _per_step(a, b, between)
        d["split"] = _split(a, b, between)
        d["control"] = _control_split(ca, cb)
    return d


def paired_stat(ratios: list[float]) -> dict[str, Any]:
    """The mean of log(ratio) with its 95% Student-t interval, given back as ratios."""
    xs = [math.log(r) for r in ratios if r and r > 0 and math.isfinite(r)]
    if len(xs) < 2:
        return {"n": len(xs)}
    m, sd = statistics.fmean(xs), statistics.stdev(xs)
    h = _T95.get(len(xs) - 1, 2.0 if len(xs) < 40 else 1.96) * sd / math.sqrt(len(xs))
    return {"n": len(xs), "ratio": round(math.exp(m), 4), "ci95": [round(math.exp(m - h), 4), round(math.exp(m + h), 4)],
            "half_width_pct": round(100 * (math.exp(h) - 1), 2), "sd_log": round(sd, 4),
            "pairs_for_1pct": math.ceil((2.0 * sd / math.log(1.01)) ** 2), "below_1": sum(1 for x in xs if x < 0)}


def fault_adjusted(ws: list[dict[str, Any]]) -> dict[str, Any]:
    """The whole effect on steps/s at an unchanged page-fault count: the paired log(ratio) regressed on
    the paired log(faults per step ratio), the intercept with its 95% interval, the slope and r^2.
    The loop's large allocations fault in fresh pages every step (34-43 thousand a step on the
    data-heavy job without workers), as many as the allocator's state of the moment asks; whether its
    pace follows them is what r^2 says (on the H100 and H200 runs on record it did not: 0.02-0.51).
    `faults_per_step` beside it says whether the count is the job's own (attached windows read 3-6%
    fewer faults a step in the 2026-12-06 runs: the premise does not quite hold)."""
    pts = [(math.log(w["faults_per_step_ratio"]), math.log(w["ratio"])) for w in ws
           if w.get("faults_per_step_ratio") and w.get("ratio")]
    n = len(pts)
    if n < 4:
        return {"n": n}
    mx, my = statistics.fmean(p[0] for p in pts), statistics.fmean(p[1] for p in pts)
    sxx = sum((p[0] - mx) ** 2 for p in pts)
    if sxx <= 0:
        return {"n": n}
    slope = sum((p[0] - mx) * (p[1] - my) for p in pts) / sxx
    icpt = my - slope * mx
    res = [p[1] - icpt - slope * p[0] for p in pts]
    s2 = sum(r * r for r in res) / (n - 2)
    se = math.sqrt(s2 * (1.0 / n + mx * mx / sxx))
    h = _T95.get(n - 2, 2.0 if n < 42 else 1.96) * se
    r2 = 1.0 - sum(r * r for r in res) / max(sum((p[1] - my) ** 2 for p in pts), 1e-12)
    return {"n": n, "ratio": round(math.exp(icpt), 4), "ci95": [round(math.exp(icpt - h), 4), round(math.exp(icpt + h), 4)],
            "half_width_pct": round(100 * (math.exp(h) - 1), 2), "sd_log": round(math.sqrt(s2), 4),
            "slope": round(slope, 3), "r2": round(r2, 3)}


def run_paired(job: "Job", name: str, window: float, arms: list[tuple[str, list[str]]], deadline: float,
               log: Any, checkpoint: Any = None) -> dict[str, Any]:
    """D A D B D A ... until `deadline` (monotonic): each attached window against its two neighbours.
    `checkpoint(windows)` after each pair, so a run cut short still leaves its windows."""
    seq: list[dict[str, Any]] = [_detached(job, window)]
    i = 0
    while time.monotonic() + 2.5 * window + 4 < deadline:
        if checkpoint is not None:
            checkpoint(seq)
        arm, args = arms[i % len(arms)]
        i += 1
        seq.append(_attached(job, window, arm, args))
        seq.append(_detached(job, window))
        att, before, after = seq[-2], seq[-3], seq[-1]
        if att.get("ok") and att.get("steps_per_s") and before["steps_per_s"] and after["steps_per_s"]:
            base = statistics.fmean([before["steps_per_s"], after["steps_per_s"]])
            att["ratio"] = round(att["steps_per_s"] / base, 4) if base > 0 else None
            sp = [w.get("split") for w in (att, before, after)]
            if all(sp):
                for k in ("duty", "work_rate", "user_work_rate", "faults_per_step"):
                    if not all(x.get(k) for x in sp):
                        continue
                    ref = statistics.fmean([sp[1][k], sp[2][k]])
                    att[k + "_ratio"] = round(sp[0][k] / ref, 5) if ref > 0 else None
            cs = [w.get("control") for w in (att, before, after)]
            if all(cs):
                # The bystander's own ratios, and the job's over them: the host's speed of the moment
                # moves both; what the agent does to the job alone stays.
                for k in ("rate", "work_rate"):
                    ref = statistics.fmean([cs[1][k], cs[2][k]])
                    att["control_" + k + "_ratio"] = round(cs[0][k] / ref, 5) if ref > 0 else None
                if att.get("control_rate_ratio") and att.get("ratio"):
                    att["ratio_over_control"] = round(att["ratio"] / att["control_rate_ratio"], 5)
                if att.get("control_work_rate_ratio") and att.get("work_rate_ratio"):
                    att["work_rate_over_control"] = round(att["work_rate_ratio"] / att["control_work_rate_ratio"], 5)
            log(f"  {name} {arm} #{i}: ratio {att['ratio']}, {att['steps_per_s']:.3f} vs {base:.3f} steps/s, "
                f"duty {att.get('duty_ratio')}, work rate {att.get('work_rate_ratio')}, "
                f"tree {att.get('tree_cpu_s')} CPU-s, per step {att.get('per_step')}")
        elif not att.get("ok"):
            log(f"  {name} {arm} #{i}: diagnose failed rc={att.get('rc')}: {att.get('stderr', '')[-300:]}")
    out: dict[str, Any] = {"case": name, "window_s": window, "arms": {}, "windows": seq}
    det = [w for w in seq if w["arm"] == "detached"]

    def facts(ws: list[dict[str, Any]]) -> dict[str, Any]:
        keys = ("thread_cpu_ms", "thread_user_ms", "thread_kernel_ms", "runqueue_wait_ms", "voluntary_switches",
                "involuntary_switches", "minor_faults", "major_faults")
        ps = [w["per_step"] for w in ws if w.get("per_step")]
        return {k: round(statistics.median(p[k] for p in ps), 3) for k in keys if all(k in p for p in ps)} if ps else {}

    out["detached"] = {"windows": len(det), "steps_per_s_median": round(statistics.median(
        [w["steps_per_s"] for w in det if math.isfinite(w["steps_per_s"])] or [float("nan")]), 4),
        "per_step_median": facts(det)}
    for arm, args in arms:
        ws = [w for w in seq if w["arm"] == arm and w.get("ratio")]
        out["arms"][arm] = {"args": args, **paired_stat([w["ratio"] for w in ws]),
                            "ratio_median": round(statistics.median(w["ratio"] for w in ws), 4) if ws else None,
                            "tree_cpu_s_median": round(statistics.median(w["tree_cpu_s"] for w in ws), 3) if ws else None,
                            "per_step_median": facts(ws), "model_check": model_check(ws),
                            # the pace split: duty (CPU taken from the loop, or the loop blocked) and
                            # the work rate of its CPU time (the job's own pace, shared cores, caches)
                            "duty": paired_stat([w["duty_ratio"] for w in ws if w.get("duty_ratio")]),
                            "work_rate": paired_stat([w["work_rate_ratio"] for w in ws if w.get("work_rate_ratio")]),
                            "user_work_rate": paired_stat([w["user_work_rate_ratio"] for w in ws
                                                           if w.get("user_work_rate_ratio")]),
                            "faults_per_step": paired_stat([w["faults_per_step_ratio"] for w in ws
                                                            if w.get("faults_per_step_ratio")]),
                            "fault_adjusted": fault_adjusted(ws),
                            **{name: paired_stat([w[key] for w in ws if w.get(key)])
                               for name, key in CONTROL_STATS if CONTROL is not None},
                            "steal_share_median": round(statistics.median(
                                [w["split"]["steal_share"] for w in seq if w.get("split")] or [0.0]), 5)}
    return out


def paired_line(r: dict[str, Any]) -> str:
    lines = [f"{r['case']}: untouched {r['detached']['windows']} windows, {r['detached']['steps_per_s_median']} steps/s, "
             f"per step {r['detached']['per_step_median']}"]
    for arm, a in r["arms"].items():
        lines.append(f"  {arm:<14} attached/detached {a.get('ratio')} (95% CI {a.get('ci95')}, +-{a.get('half_width_pct')}%, "
                     f"{a.get('n')} pairs, {a.get('below_1')} below 1; about {a.get('pairs_for_1pct')} pairs resolve 1%) "
                     f"median {a.get('ratio_median')}, tree {a.get('tree_cpu_s_median')} CPU-s, per step {a.get('per_step_median')}")
        for part in ("duty", "work_rate", "user_work_rate", "faults_per_step", "fault_adjusted",
                     *(name for name, _ in CONTROL_STATS)):
            if part not in a:
                continue
            x = a.get(part) or {}
            lines.append(f"    {part:<10} attached/detached {x.get('ratio')} (95% CI {x.get('ci95')}, "
                         f"+-{x.get('half_width_pct')}%, {x.get('n')} pairs, sd_log {x.get('sd_log')})")
        lines.append(f"    the node's steal time (median window share): {a.get('steal_share_median')}")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "out") + "/cost", help="directory for gpu_cost.json")
    ap.add_argument("--cases", default="data:14,compute:14,data:0",
                    help="VARIANT:WORKERS, comma-separated (variants: data, compute)")
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--window", type=float, default=10.0)
    ap.add_argument("--full-runs", type=int, default=2)
    ap.add_argument("--warmup", type=float, default=12.0, help="seconds after the first progress line")
    ap.add_argument("--time-budget", type=float, default=520.0, help="start no new case after this many seconds")
    ap.add_argument("--agent-args", default="",
                    help="extra `trainprobe diagnose` arguments for the attached windows (e.g. '--skip pyspy')")
    ap.add_argument("--design", choices=("alternating", "paired"), default="alternating",
                    help="paired: short interleaved windows until --time-budget, a paired statistic per arm")
    ap.add_argument("--arms", default="default=",
                    help="paired design: NAME=DIAGNOSE ARGS;NAME=ARGS... (e.g. 'default=;no-pyspy=--skip pyspy;no-gpu=--skip gpu')")
    ap.add_argument("--batch-size", type=int, default=None, help="the job's batch size (gpu_cost_job.py default)")
    ap.add_argument("--job-env", default="",
                    help="KEY=VALUE,... in the job's environment (e.g. OMP_NUM_THREADS=1: its loop with one "
                         "intra-op thread); the case's name says so")
    ap.add_argument("--control-cpu", type=int, default=None,
                    help="paired design: run benchmarks/cost_control.py pinned to this CPU beside the job, and "
                         "give each ratio over the bystander's in the same windows (the host's speed of the moment)")
    ap.add_argument("--job-cmd", default=None,
                    help="another job printing `PROGRESS t= steps=` lines ({python}, {variant}, {workers} filled in): "
                         "to try the harness without a GPU")
    a = ap.parse_args()
    global CONTROL
    if a.control_cpu is not None and a.design == "paired":
        CONTROL = Job("control", 0, f"taskset -c {a.control_cpu} {{python}} {CONTROL_SCRIPT}",
                      job_env={"OMP_NUM_THREADS": "1"})
        atexit.register(CONTROL.stop)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.monotonic()
    results: list[dict[str, Any]] = []
    for case in [c.strip() for c in a.cases.split(",") if c.strip()]:
        if time.monotonic() - t_start > a.time_budget:
            print(f"time budget spent: case {case} not run", file=sys.stderr)
            continue
        variant, workers = case.split(":")
        job_env = dict(x.split("=", 1) for x in a.job_env.split(",") if x.strip())
        job = Job(variant, int(workers), a.job_cmd, a.batch_size, job_env)
        tag = "".join(f" {k}={v}" for k, v in job_env.items())
        try:
            job.settle(a.warmup)
            if a.design == "paired":
                arms = [(n.strip(), shlex.split(v)) for n, v in (x.split("=", 1) for x in a.arms.split(";") if x.strip())]
                r = run_paired(job, f"{variant}-w{workers}{tag}", a.window, arms, t_start + a.time_budget,
                               lambda m: print(m, file=sys.stderr, flush=True),
                               lambda ws: (out / "gpu_paired.json").write_text(json.dumps(
                                   {"machine": "gpu", "args": vars(a), "partial": True, "cases": results,
                                    "windows_so_far": ws}, default=str)))
                # the job's own progress points (unix time, steps): each step's length, for a statistic
                # over steps rather than windows
                r["progress"] = [[round(t, 4), n] for t, n in job.points]
                results.append(r)
                (out / "gpu_paired.json").write_text(json.dumps({"machine": "gpu", "args": vars(a), "cases": results},
                                                               indent=1, default=str))
                continue
            r = run_case(f"{variant}-w{workers}{tag}" + (f" [{a.agent_args}]" if a.agent_args else ""), job.pid, job.rate,
                         a.window, a.pairs, a.full_runs, shlex.split(a.agent_args),
                         lambda m: print(m, file=sys.stderr, flush=True))
        except RuntimeError as exc:
            r = {"case": case, "error": str(exc)}
            print(f"{case}: {exc}", file=sys.stderr)
        finally:
            job.stop()
        results.append(r)
        (out / "gpu_cost.json").write_text(json.dumps({"machine": "gpu", "args": vars(a), "cases": results}, indent=1))
    if a.design == "paired":
        print(f"\ninterleaved {a.window:g} s windows ({time.monotonic() - t_start:.0f} s); results in {out / 'gpu_paired.json'}")
        bad = []
        for r in results:
            if "error" in r:
                print(f"{r['case']}: {r['error']}")
                continue
            print(paired_line(r))
            for arm, x in r["arms"].items():
                if x["model_check"]["windows"]:
                    print(model_table(f"{r['case']} {arm}", x["model_check"]))
                bad += [f"{r['case']} {arm}: {f}" for f in x["model_check"]["failures"]]
        if bad:
            print("\nCOST MODEL CHECK FAILED (plan vs measured tree, > 30%):\n  " + "\n  ".join(bad), file=sys.stderr)
            return 1
        return 0
    print(f"\n{a.pairs} alternating pairs of {a.window:g} s windows per case ({time.monotonic() - t_start:.0f} s); "
          f"results in {out / 'gpu_cost.json'}")
    for r in results:
        print(summary_line(r) if "error" not in r else f"{r['case']}: {r['error']}")
    # The plan's estimate against the measured tree and parts, as bench_cost.py does: exit 1 past 30%.
    return report_model_checks([r for r in results if "error" not in r])


if __name__ == "__main__":
    sys.exit(main())
