"""The straggler of a data-parallel job, whatever slows it, and why (pure: per-rank facts in, a verdict out).

Lockstep. Every step of a data-parallel job ends in a collective, so each rank waits there for the
slowest. Over a window of steps of length T, rank r spends w_r of it waiting in collectives and
T - w_r doing its own work (computing, loading data, syncing, waiting for a CPU). The slowest rank
waits least: its wait w_s is the collective's own cost, which every rank pays, and another rank o
waits w_o = w_s + (its own work's shortfall behind the straggler). So:
    the straggler is the rank that waits least;
    its excess is e = w_o - w_s (of the step): how much longer its own work is than the others';
    made as fast as the others, the job's step is T' = (T - w_o) + w_s = T - e, a speedup of
    S = T / (T - e) = 1 / (1 - e).
S = 1 / (1 - e) is an upper estimate: it keeps the straggler's own wait w_s as the collective's cost,
and once it keeps pace the ranks wait for each other's CPU waits instead. In lockstep, while one rank
waits for a CPU (its training thread runnable, or its communication thread) every other rank waits for
it at the next collective, so the waits of the ranks fall one after another: the step is the work of a
rank plus every rank's CPU waits (measured on a balanced 2-rank gloo job: CPU 0.31-0.37 of the window,
the two ranks' CPU waits 0.27-0.37 each, together 0.99-1.02 of it, and each rank's collective wait
within 0.03 of the other's CPU wait). So the step after the fix is predicted as
    T'/T = (o_f - q_f) + N rate' c_f + out' c_f + x
with f the next slowest rank (its own work o_f, CPU time c_f, CPU waits q_f: run-queue wait of its
training thread plus its longest-waiting working thread), N the ranks, rate' the CPU waits per CPU
second every rank will have (the larger of the straggler's rate, less the waits a named mechanism
(quota, another process, fewer CPUs) causes, which the fix removes, and f's), and x the part of the
straggler's own wait that the others' CPU waits do not explain (the exchange itself). With no CPU
waits this is T - e again. Waits behind processes outside the job do not fall one after another:
each rank's work is stretched on its own CPUs while the others' is on theirs, so they count once,
out' c_f, at the larger of the two ranks' rates (a rank's wait behind outsiders: the share of the
window others ran on its CPUs, contention probe, at most its CPU waits). Counted N times they put a
2-rank CPU job under four unpinned busy loops at 1.13x where removing its extra work measured 1.46x.
With more than two ranks some waits coincide and the sum overstates the step: the number is then a
lower estimate. The speedup is clamped to [1, 1 / (1 - e)].
With more ranks, w_o is the median wait of the other ranks (the straggler is named against the
typical rank) and the speedup uses the smallest wait among the non-stragglers (the next slowest
rank sets the pace once the straggler is fixed). All shares are of the window.

Measurement error. The shares come from py-spy's samples of each training thread (n of them): a
share p is known to about +-2 sqrt(p (1 - p) / n) if the samples were independent. They are not:
one window's samples of a rank follow its steps, and the ranks' CPU waits take turns. On 16
windows of a balanced 2-rank job on the cluster benchmark (2026-12-03) the asymmetry's root mean
square was 0.09 of the step against a binomial sigma of about 0.05, so the error of the difference
is taken as M = SPREAD 2 sqrt(p_s (1 - p_s) / n_s + p_o (1 - p_o) / n_o), SPREAD = 1.8. A rank is
named when its asymmetry e exceeds M and MIN_EXCESS, and either the step after the fix (above)
gains the job at least MIN_JOB_GAIN, or e exceeds 2 M: an asymmetry that large is named even where
the step model prices it at 1.00x (a rank that waits for a CPU with no known mechanism: the model
assumes every rank would then wait at its rate). The balanced windows that named a rank with
py-spy's error alone were 0.10-0.23 of the step apart (1.0-2.3 binomial errors), priced at
1.00-1.11x; with M, three are within the error and the fourth (0.23, 1.3 M) is priced at 1.00x.

Cause. The excess is split by what the straggler's own work holds more of than the others' (each
a difference of shares of the window): data (waiting for or loading batches), host syncs, waiting
for a CPU (run-queue delay: a cgroup quota that throttles it, other processes on its CPUs, fewer
CPUs than the others), and the rest of its own work (its own host code, seen as the frames of its
training thread that the other ranks do not have; a GPU that runs slower; NUMA placement). Each
cause gets its fix and the job speedup if it alone were removed: 1 / (1 - min(share, e)).
A rank's GPU that runs at lower clocks than the others' (thermal, power cap, HW slowdown) names a
straggler even when the hosts' waits cannot show it (collectives wait on the GPU, not the host).
"""
from __future__ import annotations

import math
import shlex
from typing import Any


# statistics.fmean and median, without importing statistics (fractions, decimal, random: 3 ms of
# every diagnose's start-up for two one-line functions)
def fmean(xs: list[float]) -> float:
    xs = list(xs)
    return sum(xs) / len(xs)


def median(xs: list[float]) -> float:
    v = sorted(xs)
    n = len(v)
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2.0

MIN_EXCESS = 0.03           # below this, an asymmetry is not worth a straggler, however well measured
MIN_JOB_GAIN = 1.05         # ... and the job gains this much from the fix (or e > 2 M)
SPREAD = 1.8                # the asymmetry's spread on balanced windows over py-spy's binomial error
MECHANISMS = ("cpu_quota", "cpu_contended", "fewer_cpus")   # CPU-wait causes a fix takes away
MIN_CAUSE = 0.02            # a cause's share of the step, at least, to be named
DEFAULT_SAMPLES = 100       # n for a share whose sample count is unknown (conservative)
CONTENDED_SHARE = 0.05      # other processes on the rank's CPUs: more than the others' by this much
THROTTLED_SHARE = 0.02      # of the window the rank's cgroup was throttled
GPU_CLOCK_RATIO = 0.92      # a GPU below this share of the others' SM clock runs slower
GPU_REASON_SHARE = 0.2      # a slowdown reason in this share of the readings
GPU_SLOWDOWN_REASONS = {
    "sw_thermal_slowdown": "SW thermal slowdown", "hw_thermal_slowdown": "HW thermal slowdown",
    "hw_slowdown": "HW slowdown", "hw_power_brake_slowdown": "HW power brake slowdown",
    "sw_power_cap": "SW power cap"}


def _n(r: dict[str, Any]) -> int:
    n = r.get("samples")
    return int(n) if isinstance(n, (int, float)) and n and n > 0 else DEFAULT_SAMPLES


def share_error(p: float, n: int) -> float:
    """Two standard errors of a share p measured from n samples."""
    p = min(max(p, 0.0), 1.0)
    return 2.0 * math.sqrt(p * (1.0 - p) / max(n, 1))


def diff_error(a: dict[str, Any], b: dict[str, Any], key: str = "collective_share") -> float:
    """Two binomial standard errors of the difference of two ranks' shares."""
    pa, pb = float(a.get(key) or 0.0), float(b.get(key) or 0.0)
    return 2.0 * math.sqrt(pa * (1 - pa) / _n(a) + pb * (1 - pb) / _n(b))


def asymmetry_error(a: dict[str, Any], b: dict[str, Any]) -> float:
    """M: the error of two ranks' collective-wait asymmetry, the binomial one times SPREAD (module docstring)."""
    return SPREAD * diff_error(a, b)


def lockstep_speedup(excess: float) -> float:
    """T / (T - e): the job's speedup when the straggler's own work shrinks by e (share of T)."""
    return round(1.0 / max(1.0 - max(excess, 0.0), 1e-3), 3)


def _outside_wait(r: dict[str, Any], job_pids: set[int]) -> float:
    """The part of a rank's CPU waits spent behind processes outside the job: the share of the window
    others ran on the rank's CPUs (contention probe), less the job's other ranks where they share a host
    (two Slurm nodes on one machine), at most the rank's own waits."""
    con = (r.get("node_facts") or {}).get("contention") or {}
    by_cpu = {int(c): float(v) for c, v in (con.get("others_by_cpu") or {}).items()}   # str keys after JSON
    if not by_cpu:
        return 0.0
    mine = [by_cpu[c] for c in _cpus(r) if c in by_cpu] or list(by_cpu.values())
    ranks = sum(float(c.get("share_of_job_cpus") or 0.0) for c in con.get("competitors") or []
                if c.get("pid") in job_pids and c.get("pid") != r.get("pid"))
    return min(_cpu_wait(r), max(0.0, sum(mine) / len(mine) - ranks))


def _rates(r: dict[str, Any], job_pids: set[int]) -> tuple[float, float]:
    """A rank's CPU waits per second of CPU time: (behind the job's own threads, behind outside processes)."""
    c = float(r.get("cpu_share") or 0.0)
    if c <= 0:
        return 0.0, 0.0
    q_out = _outside_wait(r, job_pids)
    return (_cpu_wait(r) - q_out) / c, q_out / c


def after_fix_share(s: dict[str, Any], floor: dict[str, Any], others: list[dict[str, Any]], n_ranks: int,
                    mechanism: bool) -> dict[str, float]:
    """T'/T when the straggler s is made as fast as the next slowest rank `floor` (module docstring):
    its terms, for the report's derivation and the JSON."""
    o_f = 1.0 - float(floor["collective_share"])
    q_f, c_f = _cpu_wait(floor), float(floor.get("cpu_share") or 0.0)
    pids = {int(o["pid"]) for o in [s, floor, *others] if o.get("pid") is not None}
    (j_f, x_f), (j_s, x_s) = _rates(floor, pids), _rates(s, pids)
    rate, rate_out = (j_f, x_f) if mechanism else (max(j_s, j_f), max(x_s, x_f))
    x = max(0.0, float(s["collective_share"]) - sum(_cpu_wait(o) for o in others))
    own, waits, outside = max(0.0, o_f - q_f), n_ranks * rate * c_f, rate_out * c_f
    return {"own_work": round(own, 4), "cpu_waits": round(waits, 4), "outside_waits": round(outside, 4),
            "exchange": round(x, 4), "rate": round(rate, 4), "outside_rate": round(rate_out, 4),
            "share": round(own + waits + outside + x, 4)}


def _label(r: dict[str, Any]) -> str:
    rank = r.get("rank") if r.get("rank") is not None else r.get("local_rank")
    where = f"node {r['node']} " if r.get("node") else ""
    return f"{where}rank {rank if rank is not None else '?'} (PID {r['pid']})"


def _short(r: dict[str, Any]) -> str:
    """'n2 rank 1' (the job view's name of a rank), or 'rank PID 123' on one node."""
    rank = r.get("rank") if r.get("rank") is not None else r.get("local_rank")
    if r.get("node"):
        return f"{r['node']} rank {rank if rank is not None else '?'}"
    return f"rank PID {r['pid']}"


def _mean(rows: list[dict[str, Any]], key: str) -> float:
    vals = [float(r[key]) for r in rows if r.get(key) is not None]
    return fmean(vals) if vals else 0.0


def _own(r: dict[str, Any]) -> float:
    return 1.0 - float(r.get("collective_share") or 0.0)


def _own_rest(r: dict[str, Any]) -> float:
    """The rank's own work outside data and syncs (py-spy's shares are wall-clock: they hold the
    run-queue wait spent in their frames): its own code, on a CPU or waiting for one."""
    return max(0.0, _own(r) - float(r.get("data_share") or 0.0) - float(r.get("host_sync_share") or 0.0))


def _cpu_wait(r: dict[str, Any]) -> float:
    """Its training thread's run-queue wait plus the longest of its other working threads'."""
    return float(r.get("run_delay_share") or 0.0) + float(r.get("helper_run_delay_share") or 0.0)


def excess_cpu_wait(s: dict[str, Any], others: list[dict[str, Any]]) -> float:
    """The straggler's run-queue wait beyond what the other ranks' rate of waiting predicts for its
    CPU time. A rank that runs more on an equally loaded host waits proportionally more for a CPU:
    that wait belongs to what made it run more (its data, its code); only the wait beyond the others'
    rate per CPU-second is its own CPU's doing (a quota, another process, fewer CPUs)."""
    q_s = _cpu_wait(s)
    cpu_o = sum(float(o.get("cpu_share") or 0.0) for o in others)
    q_o = sum(_cpu_wait(o) for o in others)
    rate = q_o / cpu_o if cpu_o > 0 else 0.0
    return max(0.0, q_s - rate * float(s.get("cpu_share") or 0.0))


def _cpus(r: dict[str, Any]) -> list[int]:
    from trainprobe.probes.parsers import procfs   # noqa: PLC0415 - the one CPU-list parser
    return procfs.parse_cpulist(r.get("cpus_allowed")) if r.get("cpus_allowed") else []


def _confined(r: dict[str, Any]) -> list[dict[str, Any]]:
    """The outside processes (contention probe) whose affinity lies inside the rank's own CPUs: they
    compete with this rank, and with no other (processes free to run anywhere load every rank alike)."""
    con = (r.get("node_facts") or {}).get("contention") or {}
    mine = set(_cpus(r))
    if not mine:
        return []
    return [c for c in con.get("competitors") or []
            if c.get("cpus_allowed") and set(_cpus({"cpus_allowed": c["cpus_allowed"]})) <= mine]


def _others_on_cpus(r: dict[str, Any]) -> float | None:
    """Share of the rank's own CPUs that outside processes confined to them took over the window
    (contention probe); None without contention evidence."""
    con = (r.get("node_facts") or {}).get("contention")
    if not con or not _cpus(r):
        return None
    n_job = max(int(con.get("job_cpu_count") or 1), 1)
    took = sum(float(c.get("share_of_job_cpus") or 0.0) * n_job for c in _confined(r))
    return round(took / len(_cpus(r)), 4)


def _finding(r: dict[str, Any], fid: str) -> dict[str, Any] | None:
    return next((f for f in r.get("findings") or [] if f.get("id") == fid), None)


def _fix_of(f: dict[str, Any] | None) -> tuple[str | None, str | None]:
    if not f or not f.get("fixes"):
        return None, None
    fx = f["fixes"][0]
    text = fx.get("title") or ""
    if fx.get("change"):
        text += f": {fx['change']}"
    return text or None, fx.get("command")


def _cause_floor(s: dict[str, Any], others: list[dict[str, Any]], p_s: float, p_o: float) -> float:
    """The least difference of two shares worth naming: MIN_CAUSE, or its two-sigma sampling error."""
    n_o = min((_n(o) for o in others), default=DEFAULT_SAMPLES)
    p_s, p_o = min(max(p_s, 0.0), 1.0), min(max(p_o, 0.0), 1.0)
    return max(MIN_CAUSE, 2.0 * math.sqrt(p_s * (1 - p_s) / _n(s) + p_o * (1 - p_o) / n_o))


def frame_diff(s: dict[str, Any], others: list[dict[str, Any]], floor: float = MIN_CAUSE) -> list[dict[str, Any]]:
    """The straggler's hottest functions the other ranks do not have (a flame-graph diff at function
    granularity): its inclusive share minus the others' mean, largest first, deepest-named first on ties."""
    mine = s.get("hot_functions") or {}
    out = []
    for fn, share in mine.items():
        theirs = fmean([float((o.get("hot_functions") or {}).get(fn, 0.0)) for o in others]) if others else 0.0
        d = share - theirs
        if d >= max(floor, _cause_floor(s, others, share, theirs)):
            out.append({"function": fn, "share": round(share, 4), "others_share": round(theirs, 4),
                        "extra_share": round(d, 4)})
    # A caller's inclusive share covers its callee's: on ties keep the innermost (the smaller share
    # of the whole stack it belongs to is not known here, so the narrowest name wins by order).
    out.sort(key=lambda x: (-round(x["extra_share"], 2), x["share"]))
    return out[:3]


def _gpu_slower(s: dict[str, Any], others: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The straggler's GPU against the others': its SM clock ratio and slowdown reasons, or None."""
    g = s.get("gpu") or {}
    if not g:
        return None
    og = [o.get("gpu") or {} for o in others if o.get("gpu")]
    clocks = [float(x["sm_clock_mhz"]) for x in og if x.get("sm_clock_mhz")]
    ratio = None
    if g.get("sm_clock_mhz") and clocks:
        ratio = round(float(g["sm_clock_mhz"]) / fmean(clocks), 3)
    elif g.get("sm_clock_mhz") and g.get("max_sm_clock_mhz"):
        ratio = round(float(g["sm_clock_mhz"]) / float(g["max_sm_clock_mhz"]), 3)
    reasons = {k: v for k, v in (g.get("reasons") or {}).items() if k in GPU_SLOWDOWN_REASONS
               and v >= GPU_REASON_SHARE and all((x.get("reasons") or {}).get(k, 0.0) < GPU_REASON_SHARE for x in og)}
    replays = (g.get("pcie_replays") or 0) - max([x.get("pcie_replays") or 0 for x in og], default=0)
    ecc = g.get("ecc_uncorrected") or 0
    if not ((ratio is not None and ratio < GPU_CLOCK_RATIO) or reasons or replays > 0 or ecc > 0):
        return None
    return {"index": g.get("index"), "ratio": ratio, "sm_clock_mhz": g.get("sm_clock_mhz"),
            "others_sm_clock_mhz": round(fmean(clocks), 1) if clocks else None,
            "max_sm_clock_mhz": g.get("max_sm_clock_mhz"), "reasons": reasons, "pcie_replays": max(replays, 0),
            "ecc_uncorrected": ecc, "busy": g.get("busy"), "temperature_c_max": g.get("temperature_c_max"),
            "power_w_mean": g.get("power_w_mean"), "power_limit_w": g.get("power_limit_w")}


def _gpu_share(gs: dict[str, Any]) -> float:
    """The step share a slower GPU costs: its busy share times the clock it lacks (1 - ratio)."""
    ratio = gs.get("ratio")
    return max(0.0, float(gs.get("busy") or 1.0) * (1.0 - ratio)) if ratio is not None else 0.0


def _cause(cid: str, title: str, share: float, excess: float, fix: str, command: str | None = None,
           evidence: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"cause": cid, "title": title, "share": round(share, 4),
            "job_speedup_if_removed": lockstep_speedup(min(share, excess)),
            "fix": fix, "command": command, "evidence": evidence or {}}


def causes_of(s: dict[str, Any], others: list[dict[str, Any]], excess: float) -> list[dict[str, Any]]:
    """Each cause of the straggler's excess with its share of the step, its fix and its number."""
    who = _label(s)
    out: list[dict[str, Any]] = []
    # The CPU wait that is the straggler's CPU's own doing, carved out of its frames' wall-clock
    # shares in proportion (py-spy saw the rank in those frames while it waited).
    d_wait = excess_cpu_wait(s, others)
    keep = max(0.0, 1.0 - d_wait / _own(s)) if _own(s) > 0 else 1.0
    waits = _cpu_wait_causes(s, others, d_wait, excess, who) if d_wait >= MIN_CAUSE else []
    # A wait no mechanism explains (no quota, no process bound to its CPUs, as many CPUs as the others)
    # is not taken out of its data or sync frames: on a shared host a rank that runs flat out on one
    # CPU waits more than the others' rate per CPU-second predicts, and that wait is its batches' doing.
    keep_named = 1.0 if [c["cause"] for c in waits] == ["cpu_wait"] else keep
    d_data = float(s.get("data_share") or 0.0) * keep_named - _mean(others, "data_share")
    if d_data >= _cause_floor(s, others, float(s.get("data_share") or 0.0), _mean(others, "data_share")):
        fix, cmd = _fix_of(_finding(s, "dataloader.starved"))
        out.append(_cause("data", f"{who} waits for or loads its own batches {d_data:.0%} of the step more than "
                          "the other ranks", d_data, excess,
                          fix or "Feed its loop from DataLoader workers like the other ranks (num_workers > 0, "
                                 "persistent_workers=True), or make its samples as cheap as theirs", cmd,
                          {"data_share": s.get("data_share"), "others_data_share": round(_mean(others, "data_share"), 4)}))
    d_sync = float(s.get("host_sync_share") or 0.0) * keep_named - _mean(others, "host_sync_share")
    if d_sync >= _cause_floor(s, others, float(s.get("host_sync_share") or 0.0), _mean(others, "host_sync_share")):
        fix, cmd = _fix_of(_finding(s, "host.sync"))
        out.append(_cause("host_sync", f"{who} spends {d_sync:.0%} of the step more than the others in "
                          "host-device syncs", d_sync, excess,
                          fix or "Take the syncs (.item(), .cpu(), print(tensor)) out of its loop", cmd,
                          {"host_sync_share": s.get("host_sync_share")}))
    out.extend(waits)
    d_rest = _own_rest(s) * keep - fmean([_own_rest(o) for o in others]) if others else 0.0
    gs = _gpu_slower(s, others)
    if gs is not None:
        share = _gpu_share(gs) or max(d_rest, 0.0)
        why = ", ".join(GPU_SLOWDOWN_REASONS[k] + f" in {v:.0%} of readings" for k, v in gs["reasons"].items())
        clk = (f"runs at {gs['sm_clock_mhz']:.0f} MHz SM clock against {gs['others_sm_clock_mhz']:.0f} MHz on the "
               "other ranks' GPUs" if gs.get("others_sm_clock_mhz") and gs.get("sm_clock_mhz")
               else (f"runs at {gs['sm_clock_mhz']:.0f} of {gs['max_sm_clock_mhz']:.0f} MHz" if gs.get("sm_clock_mhz")
                     and gs.get("max_sm_clock_mhz") else "runs slower"))
        extra = []
        if gs["pcie_replays"]:
            extra.append(f"{gs['pcie_replays']} PCIe replays")
        if gs["ecc_uncorrected"]:
            extra.append(f"{gs['ecc_uncorrected']} uncorrected ECC errors")
        title = f"{who}'s GPU {gs['index']} {clk}" + (f" ({why})" if why else "") + (
            "; " + ", ".join(extra) if extra else "")
        thermal = any("thermal" in k for k in gs["reasons"])
        power = any("power" in k for k in gs["reasons"])
        fix = ("Restore its clocks: " + ("check its cooling (airflow, fan, inlet temperature) " if thermal else "")
               + ("check its power cap and the node's power budget " if power else "")
               + ("check the GPU's health (HW slowdown, replays, ECC) with the vendor's diagnostics "
                  if gs["reasons"].get("hw_slowdown") or extra else "")
               + "or move the rank to a healthy GPU")
        out.append(_cause("gpu_slower", title, share, excess, fix.replace("  ", " "),
                          "nvidia-smi -q -i {} -d PERFORMANCE,CLOCK,TEMPERATURE,POWER".format(int(gs["index"] or 0)),
                          gs))
    elif d_rest >= MIN_CAUSE:
        numa = _finding(s, "numa.remote")
        frames = frame_diff(s, others)
        if numa is not None:
            fix, cmd = _fix_of(numa)
            out.append(_cause("numa", f"{who} runs or allocates on a NUMA node away from its GPU", d_rest, excess,
                              fix or "Bind it to its GPU's NUMA node", cmd, {"finding": numa.get("title")}))
        elif frames:
            top = frames[0]
            names = ", ".join(f"{f['function']} {f['extra_share']:.0%}" for f in frames)
            out.append(_cause("own_compute", f"{who} runs host code the other ranks do not: {names} of its step",
                              min(d_rest, max(f["extra_share"] for f in frames)), excess,
                              f"Take {top['function']} out of the step (run it every N steps, on another thread or "
                              "process, or split it across the ranks), so every rank does the same work per step",
                              None, {"frames": frames}))
        else:
            out.append(_cause("own_compute", f"{who}'s own work is {d_rest:.0%} of the step longer than the others' "
                              "in the same frames (slower CPU, larger batches or inputs?)", d_rest, excess,
                              "Give it the same work and hardware as the other ranks (batch size, sequence length, "
                              "CPU model and frequency)", None, {}))
    own = [c for c in out if c["cause"] in ("data", "host_sync", "own_compute")]
    if [c["cause"] for c in waits] == ["cpu_wait"] and own:
        # No quota, no process bound to its CPUs, as many CPUs as the others: the CPU wait beyond the
        # others' rate is what its extra work brings (its own threads queue behind it on its CPUs), so
        # it goes with that work's cause and its fix, not a cause of its own.
        w = waits[0]
        out.remove(w)
        big = max(own, key=lambda c: c["share"])
        big["share"] = round(min(excess, big["share"] + w["share"]), 4)
        big["job_speedup_if_removed"] = lockstep_speedup(min(big["share"], excess))
        big["title"] += (f", and its threads wait for a CPU {w['share']:.0%} of the step more than the others' rate "
                         "predicts while it does so")
        big["evidence"] = {**big["evidence"], "cpu_wait_share": w["share"]}
    out.sort(key=lambda c: -c["share"])
    return out


def _cpu_wait_causes(s: dict[str, Any], others: list[dict[str, Any]], d_wait: float, excess: float,
                     who: str) -> list[dict[str, Any]]:
    thr = (s.get("node_facts") or {}).get("throttle") or {}
    t_share = float(thr.get("share") or 0.0)
    t_others = fmean([float(((o.get("node_facts") or {}).get("throttle") or {}).get("share") or 0.0)
                      for o in others]) if others else 0.0
    if t_share - t_others >= THROTTLED_SHARE:
        cg = thr.get("cgroup")
        v1 = thr.get("cgroup_version") == 1
        cmd = None
        if cg:
            cmd = (f"echo -1 > {shlex.quote(cg + '/cpu.cfs_quota_us')}" if v1
                   else f"echo max > {shlex.quote(cg + '/cpu.max')}")
        q = thr.get("quota_cpus")
        return [_cause("cpu_quota", f"{who}'s cgroup is throttled by its CPU quota"
                       + (f" of {q:g} CPU" if q else "") + f" {t_share:.0%} of the window",
                       min(d_wait, t_share - t_others), excess,
                       "Raise its CPU quota to what its threads use (Slurm: more --cpus-per-task; a cgroup: "
                       "cpu.max or cpu.cfs_quota_us), or lift it", cmd,
                       {"throttled_share": t_share, "quota_cpus": q, "cgroup": cg})]
    mine = _others_on_cpus(s)
    theirs = [x for x in (_others_on_cpus(o) for o in others) if x is not None]
    if mine is not None and theirs and mine - fmean(theirs) >= CONTENDED_SHARE:
        named = sorted(_confined(s), key=lambda c: -float(c.get("share_of_job_cpus") or 0.0))
        names = ", ".join(f"PID {c['pid']} ({str(c.get('command') or '?')[:60]})" for c in named[:2])
        cpus = s.get("cpus_allowed") or "?"
        fix, cmd = (None, None) if named else _fix_of(_finding(s, "cpu.contended"))
        return [_cause("cpu_contended", f"other processes bound to {who}'s CPU(s) {cpus} take {mine:.0%} of them "
                       f"(on the other ranks' CPUs: {fmean(theirs):.0%})" + (f": {names}" if names else ""),
                       d_wait, excess,
                       fix or (f"Move {names or 'the other processes'} off CPU(s) {cpus}, or pin the rank to CPUs "
                               "nobody else uses"), cmd,
                       {"others_on_its_cpus": mine, "others_on_their_cpus": round(fmean(theirs), 4),
                        "competitors": named[:3]})]
    n_s = s.get("cpus_allowed_count")
    n_o = [o.get("cpus_allowed_count") for o in others if o.get("cpus_allowed_count")]
    if n_s and n_o and n_s < min(n_o):
        return [_cause("fewer_cpus", f"{who} may run on {n_s} CPU(s) ({s.get('cpus_allowed')}), the other ranks "
                       f"on {min(n_o)}", d_wait, excess,
                       f"Give it as many CPUs as the others (its affinity or cgroup cpuset: taskset -pc, "
                       "Slurm --cpus-per-task)", None, {"cpus_allowed": s.get("cpus_allowed")})]
    return [_cause("cpu_wait", f"{who} waits for a CPU {d_wait:.0%} of the step more than the others' rate of "
                   "waiting predicts, with no quota throttling or outside process measured on its CPUs", d_wait, excess,
                   "Find what else runs on its CPUs (the contention probe, --probes contention) or give it more CPUs",
                   None, {"run_delay_share": s.get("run_delay_share")})]


def _gpu_stragglers(known: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for r in known:
        others = [o for o in known if o is not r]
        gs = _gpu_slower(r, others) if others else None
        if gs is not None and _gpu_share(gs) >= MIN_EXCESS:
            out.append((r, gs))
    return [r for r, _ in sorted(out, key=lambda x: -_gpu_share(x[1]))]


def _lockstep(known: list[dict[str, Any]], stragglers: list[tuple[dict[str, Any], float, float]],
              non: list[dict[str, Any]], causes_by: dict[int, list[dict[str, Any]]]) -> dict[str, Any]:
    """The job's speedup if the lead straggler (the one that waits least) were as fast as the next
    slowest rank: the step after the fix (after_fix_share), at most 1 / (1 - gain)."""
    floor_row = min(non, key=lambda r: r["collective_share"])
    floor = floor_row["collective_share"]
    s_row, _e, m_s = min(stragglers, key=lambda x: x[0]["collective_share"])
    gain = floor - s_row["collective_share"]
    upper = lockstep_speedup(gain)
    mechanism = any(c["cause"] in MECHANISMS for c in causes_by[id(s_row)])
    after = after_fix_share(s_row, floor_row, [r for r in known if r is not s_row], len(known), mechanism)
    speedup = round(min(upper, max(1.0, 1.0 / max(after["share"], 1e-3))), 3)
    bound = (f"lockstep: the straggler waits {s_row['collective_share']:.2f} of the step in collectives, the "
             f"next slowest rank {floor:.2f}; made as fast as the others the step is at least T - {gain:.2f} T "
             f"(at most {upper:.2f}x), and the ranks then wait for each other's CPU waits: the next slowest rank's "
             f"own work {after['own_work']:.2f} of today's step, plus {len(known)} ranks' CPU waits at "
             f"{after['rate']:.2f} s per CPU-second ({after['cpu_waits']:.2f}), plus its waits behind processes "
             f"outside the job at {after['outside_rate']:.2f} s per CPU-second, which the ranks wait side by "
             f"side ({after['outside_waits']:.2f}), plus the exchange "
             f"{after['exchange']:.2f}: T' = {after['share']:.2f} T, {speedup:.2f}x")
    return {"s_row": s_row, "gain": round(gain, 4), "error": round(m_s, 4), "after": after, "speedup": speedup,
            "upper": upper, "bound": bound}


def analyse(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """rows: one per rank, with collective_share, samples and the facts of training_ranks.rank_facts
    (plus node, rank, node_facts and findings where known). Returns the straggler verdict:
    {stragglers: [...], job_expected_speedup, job_speedup_bound, no_straggler_reason, per_rank: [one per row]}."""
    known = [r for r in rows if r.get("collective_share") is not None]
    verdict: dict[str, Any] = {"stragglers": [], "job_expected_speedup": None, "job_speedup_bound": None,
                               "no_straggler_reason": None, "per_rank": []}
    per: dict[int, dict[str, Any]] = {}
    for r in rows:
        c = r.get("collective_share")
        per[id(r)] = {"collective_share": c, "own_work_share": round(1.0 - c, 4) if c is not None else None}
        verdict["per_rank"].append(per[id(r)])
    if len(known) < 2:
        verdict["no_straggler_reason"] = (f"{len(known)} rank(s) with a measured collective wait: the lockstep model "
                                          "needs two")
        return verdict
    waits = sorted(known, key=lambda r: r["collective_share"])
    s0 = waits[0]
    rest = waits[1:]
    ref = median(r["collective_share"] for r in rest)
    ref_row = min(rest, key=lambda r: abs(r["collective_share"] - ref))
    stragglers = []
    for r in waits:
        if r is ref_row:
            continue
        e = ref - r["collective_share"]
        m = asymmetry_error(r, ref_row)
        if e > max(m, MIN_EXCESS):
            stragglers.append((r, e, m))
    how = "lockstep"
    causes_by: dict[int, list[dict[str, Any]]] = {}
    quiet = None
    if stragglers:
        key = {id(r) for r, _e, _m in stragglers}
        non = [r for r in known if id(r) not in key]
        causes_by = {id(r): causes_of(r, non, e) for r, e, _m in stragglers}
        lock = _lockstep(known, stragglers, non, causes_by)
        if lock["speedup"] < MIN_JOB_GAIN and lock["gain"] <= 2 * lock["error"]:
            s_row, e_s, m_s = lock["s_row"], lock["gain"], lock["error"]
            quiet = (f"no straggler: {_label(s_row)} waits {e_s:.2f} of the step less in collectives than the next "
                     f"slowest rank (measurement error {m_s:.2f}), but made as fast as the others the job would gain "
                     f"{lock['speedup']:.2f}x, under {MIN_JOB_GAIN:g}x, and the asymmetry is within twice the "
                     f"error: the ranks' CPU waits take "
                     f"turns ({lock['after']['cpu_waits']:.2f} of the step after the fix) or it is noise")
            stragglers = []
    if not stragglers:
        gpu = _gpu_stragglers(known)
        if gpu:
            how = "gpu"
            stragglers = [(r, _gpu_share(_gpu_slower(r, [o for o in known if o is not r]) or {}), 0.0) for r in gpu[:1]]
            non = [r for r in known if r is not gpu[0]]
            causes_by = {id(gpu[0]): causes_of(gpu[0], non, stragglers[0][1])}
    if not stragglers:
        e0 = ref - s0["collective_share"]
        m0 = asymmetry_error(s0, ref_row)
        verdict["no_straggler_reason"] = quiet or (
            f"no straggler: the ranks' collective waits differ by at most {e0:.2f} of the step "
            f"({_label(s0)} {s0['collective_share']:.2f}, the others' median {ref:.2f}), within the measurement "
            f"error {m0:.2f} ({SPREAD:g} x 2 sigma of py-spy's shares) or below {MIN_EXCESS:g}")
        verdict["job_speedup_bound"] = verdict["no_straggler_reason"]
        return verdict
    after = s_row = upper = None
    if how == "lockstep":
        s_row, after, speedup, upper, bound = lock["s_row"], lock["after"], lock["speedup"], lock["upper"], lock["bound"]
    else:
        gain = stragglers[0][1]
        speedup = lockstep_speedup(gain)
        bound = (f"GPU clocks: the straggler's GPU busy share x (1 - its SM clock / the others') = {gain:.2f} of "
                 f"the step, a speedup of 1 / (1 - {gain:.2f})")
    for r, e, m in stragglers:
        causes = causes_by[id(r)]
        for c in causes:
            c["job_speedup_if_removed"] = round(min(c["job_speedup_if_removed"], speedup), 3)
        top = causes[0] if causes else None
        entry = {"node": r.get("node"), "rank": r.get("rank"), "local_rank": r.get("local_rank"), "pid": r["pid"],
                 "collective_share": r["collective_share"], "others_collective_share": round(ref, 4),
                 "excess_share": round(e, 4), "error_share": round(m, 4), "named_by": how,
                 "job_expected_speedup": speedup if (how != "lockstep" or r is s_row) else lockstep_speedup(e),
                 "causes": causes, "cause": top["cause"] if top else "unexplained",
                 "title": (f"{_label(r)} is the straggler: the other ranks wait {e:.0%} of their step for it"
                           + (f"; {top['title']}" if top else "")),
                 "fix": top["fix"] if top else None}
        if after is not None and r is s_row:
            entry["after_fix"] = after
            entry["job_speedup_upper"] = upper
        if not causes:
            entry["note"] = (f"no probe explains {_label(r)}'s extra {e:.0%} of the step: not data, syncs, CPU wait, "
                             "quota, other processes or its GPU. Compare its code path, inputs and hardware with a "
                             "healthy rank (trainprobe flamegraph --diff)")
            entry["fix"] = entry["note"]
        verdict["stragglers"].append(entry)
        per[id(r)].update({"straggler": True, "excess_share": round(e, 4),
                                              "cause": entry["cause"], "fix": entry["fix"]})
    for r in non:
        per[id(r)]["waits_for"] = [_short(x) for x, _e, _m in stragglers]
    verdict["job_expected_speedup"] = speedup
    verdict["job_speedup_bound"] = bound
    return verdict
