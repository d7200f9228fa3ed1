"""The cost benchmark's core, shared by bench_cost.py (this machine) and gpu_cost.py (a GPU node).

For one running job: alternating windows, untouched then attached (`trainprobe diagnose`, default
planned sampling), so the job's throughput ratio cancels slow drift; for each attached window the
agent tree's CPU from rusage (this process's RUSAGE_CHILDREN delta over the diagnose subprocess,
every descendant included) and its RSS (the sum over the diagnose tree, read from /proc every
0.2 s); then a few windows at full sampling (`--rate 25`: one py-spy over every process at 25 Hz)
to compare the top finding and its expected speedup with the reduced sampling's.
"""
from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from trainprobe.probes.parsers import procfs  # noqa: E402


def agent_env() -> dict[str, str]:
    env = dict(os.environ, NO_COLOR="1", PYTHONPATH=str(REPO))
    env.pop("PYTHONDONTWRITEBYTECODE", None)   # an installed agent runs from cached bytecode
    return env


def _tree_rss_mb(pid: int) -> float:
    total = 0.0
    for p in [pid] + [k for k, _ in procfs.descendants_of(pid)]:
        st = procfs.parse_status(procfs.try_read_text("/", f"proc/{p}/status") or "")
        try:
            total += int(st.get("VmRSS", "0 kB").split()[0]) / 1024.0
        except (ValueError, IndexError):
            pass
    return total


REFERENCE = [sys.executable, "-c", "import trainprobe.agent.cli"]


def reference_cpu_s() -> float:
    """The CPU-s of a fixed task (the interpreter and the CLI's imports, the agent's own start-up),
    run just before each attached window: a VM's speed drifts (the same task measured 0.065 and
    0.111 CPU-s an hour apart on the 2-CPU machine), so each window's cost is also given in units
    of this task run at the same moment."""
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(REFERENCE, cwd=REPO, env=agent_env(), check=False)
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime)


def diagnose(pid: int, window: float, extra: list[str]) -> dict[str, Any]:
    """One `trainprobe diagnose --json` subprocess: its report, its tree's CPU and peak RSS."""
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.time()
    proc = subprocess.Popen([sys.executable, "-m", "trainprobe.agent", "diagnose", "--pid", str(pid), "--duration", str(window),
                             "--json", *extra], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=agent_env())
    peak = [0.0]
    done = threading.Event()

    def watch() -> None:
        while not done.wait(0.2):
            try:
                peak[0] = max(peak[0], _tree_rss_mb(proc.pid))
            except Exception:  # noqa: BLE001 - the tree changes under us
                pass

    th = threading.Thread(target=watch, daemon=True)
    th.start()
    out, err = proc.communicate()
    done.set()
    th.join()
    t1 = time.time()
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    tree = (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime)
    try:
        rep = json.loads(out)
    except ValueError:
        return {"ok": False, "rc": proc.returncode, "stderr": err[-2000:], "t0": t0, "t1": t1}
    ov = rep.get("overhead") or {}
    top = (rep.get("findings") or [{}])[0]
    return {"ok": True, "t0": t0, "t1": t1, "tree_cpu_s": round(tree, 3), "tree_peak_rss_mb": round(peak[0], 1),
            "reported_cpu_s": ov.get("agent_cpu_seconds"), "reported_rss_mb": ov.get("agent_max_rss_mb"),
            "window_s": (rep.get("window") or {}).get("seconds"),
            "window_start_unix": (rep.get("window") or {}).get("start_unix"),
            "top": top.get("id"), "top_speedup": top.get("expected_speedup"),
            "findings": [(f["id"], f.get("expected_speedup")) for f in rep.get("findings") or []][:4],
            "sampling": rep.get("sampling"), "plan": ov.get("plan"), "by_probe": ov.get("by_probe"),
            "gpu_calls": (rep.get("sampling") or {}).get("gpu"),
            "scheduling_class": ov.get("scheduling_class")}


def run_case(name: str, pid: int, rate: Callable[[float, float], float], window: float, pairs: int,
             full_runs: int, extra: list[str], log: Callable[[str], None]) -> dict[str, Any]:
    """Alternating windows on one job; `rate(t0, t1)` is the job's steps/s between two unix times."""
    detached: list[float] = []
    attached: list[dict[str, Any]] = []
    t0 = time.time()
    time.sleep(window)
    detached.append(rate(t0, time.time()))
    for i in range(pairs):
        ref = reference_cpu_s()
        d = diagnose(pid, window, extra)
        d["reference_cpu_s"] = round(ref, 4)
        if d["ok"]:
            # The window proper: the CLI's start-up before the probes attach is excluded.
            d["steps_per_s"] = rate(d["t0"] + 0.5, d["t1"])
        t0 = time.time()
        time.sleep(window)
        detached.append(rate(t0, time.time()))
        if d["ok"]:
            d["ratio"] = round(d["steps_per_s"] / statistics.mean(detached[-2:]), 4)
            log(f"  {name} pair {i + 1}: ratio {d['ratio']:.3f}, tree {d['tree_cpu_s']:.2f} CPU-s "
                f"({d['tree_cpu_s'] / ref:.1f}x the reference task's {ref:.3f}) "
                f"(reported {d['reported_cpu_s']}), RSS {d['tree_peak_rss_mb']:.0f} MB, top {d['top']} {d['top_speedup']}")
        else:
            log(f"  {name} pair {i + 1}: diagnose failed rc={d.get('rc')}: {d.get('stderr', '')[-300:]}")
        attached.append(d)
    full = []
    for _ in range(full_runs):
        f = diagnose(pid, window, [*extra, "--rate", "25"])
        full.append(f)
        if f["ok"]:
            log(f"  {name} full sampling: tree {f['tree_cpu_s']:.2f} CPU-s, RSS {f['tree_peak_rss_mb']:.0f} MB, "
                f"top {f['top']} {f['top_speedup']}")
    return summarize(name, window, attached, full, detached)


def summarize(name: str, window: float, attached: list[dict[str, Any]], full: list[dict[str, Any]],
              detached: list[float]) -> dict[str, Any]:
    ok = [a for a in attached if a["ok"]]
    fok = [f for f in full if f["ok"]]
    med = lambda xs: round(statistics.median(xs), 4) if xs else None  # noqa: E731
    cap = None
    if ok and ok[0].get("plan"):
        cap = ok[0]["plan"].get("job_cpu_capacity")
    tree = [a["tree_cpu_s"] for a in ok]
    top_r = statistics.mode([a["top"] for a in ok]) if ok else None
    top_f = statistics.mode([f["top"] for f in fok]) if fok else None
    sp_r = med([a["top_speedup"] for a in ok if a["top"] == top_r and a["top_speedup"]])
    sp_f = med([f["top_speedup"] for f in fok if f["top"] == top_f and f["top_speedup"]])
    return {
        "case": name, "window_s": window, "pairs": len(attached), "detached_steps_per_s": detached,
        "ratios": [a.get("ratio") for a in ok], "ratio_median": med([a["ratio"] for a in ok]),
        "ratio_mean": round(statistics.fmean(a["ratio"] for a in ok), 4) if ok else None,
        "ratio_ci95": _ci95([a["ratio"] for a in ok]),
        "tree_cpu_s": tree, "tree_cpu_s_median": med(tree), "tree_cpu_s_max": max(tree) if tree else None,
        "reference_cpu_s": [a.get("reference_cpu_s") for a in ok],
        "tree_in_reference_tasks_median": med([a["tree_cpu_s"] / a["reference_cpu_s"] for a in ok
                                               if a.get("reference_cpu_s")]),
        "reported_cpu_s": [a["reported_cpu_s"] for a in ok],
        "tree_cpu_share_of_job_capacity": round(max(tree) / (cap * window), 5) if tree and cap else None,
        "job_cpu_capacity": cap,
        "tree_peak_rss_mb_max": max((a["tree_peak_rss_mb"] for a in ok), default=None),
        "reported_rss_mb_max": max((a["reported_rss_mb"] or 0 for a in ok), default=None),
        "top_reduced": top_r, "top_full": top_f, "speedup_reduced": sp_r, "speedup_full": sp_f,
        "speedup_rel_diff": round(sp_r / sp_f - 1, 4) if sp_r and sp_f else None,
        "full_tree_cpu_s": [f["tree_cpu_s"] for f in fok], "full_tree_peak_rss_mb": [f["tree_peak_rss_mb"] for f in fok],
        "sampling": ok[0]["sampling"] if ok else None, "model_check": model_check(attached),
        "attached": attached, "full": full,
    }


# Two-sided 95% quantiles of Student's t by degrees of freedom (n - 1), for the mean ratio's interval.
_T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26, 10: 2.23, 11: 2.20,
        12: 2.18, 13: 2.16, 14: 2.14, 15: 2.13}


def _ci95(xs: list[float]) -> list[float] | None:
    """The 95% confidence interval of the mean of the pairs' ratios (each pair is one measurement of
    the agent's effect; the job's own drift between windows is their spread)."""
    if len(xs) < 2:
        return None
    m, sd = statistics.fmean(xs), statistics.stdev(xs)
    h = _T95.get(len(xs) - 1, 1.96) * sd / len(xs) ** 0.5
    return [round(m - h, 4), round(m + h, 4)]


# -- the cost model against the measured tree -------------------------------------------------------

# The check itself (the plan's figures against the measured tree, part by part) is shared with tests:
# scripts/cost_check.py.
from scripts.cost_check import MODEL_TOLERANCE, PART_TOLERANCE, model_check  # noqa: E402


def model_table(name: str, check: dict[str, Any]) -> str:
    down = check.get("faster_than_models_median")
    lines = [f"cost model vs measured, {name} ({check['windows']} windows; the plan's speed factor "
             f"{check.get('plan_speed_factor_median')}"
             + (f", planned figures x{down:g} at the start-up's measured speed" if down and down < 1.0 else "")
             + f", the reference task {check.get('reference_cpu_s_median')} CPU-s):",
             f"  {'part':<36} {'planned':>8} {'measured':>9} {'(range)':>15} {'ratio':>6}"]
    order = sorted(check["parts"], key=lambda k: (k == "tree", k.startswith("agent"), -check["parts"][k]["planned_median"]))
    for part in order:
        r = check["parts"][part]
        rng = f"{r['measured_range'][0]:.3f}-{r['measured_range'][1]:.3f}"
        lines.append(f"  {part:<36} {r['planned_median']:>8.3f} {r['measured_median']:>9.3f} {rng:>15} "
                     f"{r['ratio'] if r['ratio'] is not None else '-':>6}"
                     + ("  FAIL" if r["fails"] else f"  off >{100 * MODEL_TOLERANCE:.0f}%" if r.get("off") else ""))
    return "\n".join(lines)


def report_model_checks(results: list[dict[str, Any]]) -> int:
    """Print every case's model table; 0 when the plan's estimate held, else 1 with one line per part."""
    bad = []
    for r in results:
        chk = r.get("model_check")
        if not chk:
            continue
        print(model_table(r["case"], chk))
        bad += [f"{r['case']}: {f}" for f in chk["failures"]]
    if bad:
        print(f"\nCOST MODEL CHECK FAILED: the plan's estimate (agent/cost.py and each probe's model) and the "
              f"measured agent tree differ by more than {100 * MODEL_TOLERANCE:.0f}% (a part: "
              f"{100 * PART_TOLERANCE:.0f}%):", file=sys.stderr)
        for b in bad:
            print(f"  {b}", file=sys.stderr)
        return 1
    return 0


def med_or_none(xs: Any) -> float | None:
    xs = [x for x in xs or [] if x]
    return round(statistics.median(xs), 4) if xs else None


def summary_line(r: dict[str, Any]) -> str:
    share = r.get("tree_cpu_share_of_job_capacity")
    diff = r.get("speedup_rel_diff")
    return (f"{r['case']:<18} ratio med {r['ratio_median']}  mean {r.get('ratio_mean')} (95% CI {r.get('ratio_ci95')})  "
            f"min {min(r['ratios']) if r['ratios'] else None}  "
            f"tree CPU-s med {r['tree_cpu_s_median']} max {r['tree_cpu_s_max']}"
            f" (= {r.get('tree_in_reference_tasks_median')}x the reference task, median {med_or_none(r.get('reference_cpu_s'))})"
            + (f" ({100 * share:.2f}% of {r['job_cpu_capacity']:g} CPUs)" if share is not None else "")
            + f"  RSS max {r['tree_peak_rss_mb_max']} MB  top {r['top_reduced']} {r['speedup_reduced']}"
            f" vs full {r['top_full']} {r['speedup_full']}" + (f" ({100 * diff:+.1f}%)" if diff is not None else "")
            + f"  full-sampling tree CPU-s {r['full_tree_cpu_s']}")
