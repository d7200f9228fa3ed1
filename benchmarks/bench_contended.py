"""cpu.contended's prediction against a measurement: the job's steps/s beside busy processes on its
CPU, and with them stopped (SIGSTOP), interleaved, several repetitions.

    python benchmarks/bench_contended.py [--competitors 2] [--cpu 0] [--reps 5] [--phase 3] [--duration 4]

The job (the bundled workload, data in memory, one thread) and the competitors (`python -c "while
True: pass"`) are pinned to one CPU. trainprobe diagnoses the job once, then the competitors are
stopped and resumed in turn (`--phase` seconds each, the first 0.5 s after each switch left out).
It prints the finding's expected speedup and interval, the measured speedup (median of the paired
ratios, their range) and pred/meas. It also times the contention probe's /proc scan on this host.
Work on the host outside the benchmark stays in both phases: the prediction assumes every other
process leaves the CPU, so on a busy host pred/meas is above 1 by that work's share.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import PY, Workload, trainprobe  # noqa: E402


def pin_all(pid: int, cpu: int) -> None:
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            os.sched_setaffinity(int(tid), {cpu})
        except (ProcessLookupError, PermissionError):
            pass


def cpu_busy_s(cpu: int) -> float:
    with open("/proc/stat") as fh:
        v = [int(x) for x in next(ln for ln in fh if ln.startswith(f"cpu{cpu} ")).split()[1:9]]
    return (sum(v[:3]) + sum(v[5:8])) / os.sysconf("SC_CLK_TCK")


def proc_cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as fh:
        rest = fh.read().rsplit(")", 1)[1].split()
    return (int(rest[11]) + int(rest[12])) / os.sysconf("SC_CLK_TCK")


def least_busy_cpu(seconds: float = 1.0) -> int:
    cpus = sorted(os.sched_getaffinity(0))
    b0 = {c: cpu_busy_s(c) for c in cpus}
    time.sleep(seconds)
    return min(cpus, key=lambda c: cpu_busy_s(c) - b0[c])


def scan_cost(reps: int = 20) -> tuple[int, float]:
    from trainprobe.probes.contention import scan_processes
    c0 = time.thread_time()
    n = 0
    for _ in range(reps):
        n = len(scan_processes("/")["rows"])
    return n, (time.thread_time() - c0) / reps


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--competitors", type=int, default=2)
    ap.add_argument("--cpu", type=int, default=None, help="default: the least busy CPU over 1 s")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--phase", type=float, default=3.0)
    ap.add_argument("--duration", type=float, default=4.0)
    ap.add_argument("--job-args", default="--sample-work 0", help="arguments of the bundled workload")
    a = ap.parse_args()

    if a.cpu is None:
        a.cpu = least_busy_cpu()
    n, per_scan = scan_cost()
    print(f"contention probe: one /proc scan of {n} processes: {per_scan * 1e3:.2f} ms CPU "
          f"({per_scan / max(n, 1) * 1e6:.1f} us a process)")
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {a.cpu})          # the job and the competitors inherit the CPU
    try:
        job = Workload(*a.job_args.split())
        comps = [subprocess.Popen([PY, "-c", "while True: pass"]) for _ in range(a.competitors)]
    finally:
        os.sched_setaffinity(0, before)
    try:
        job.wait_ready(4)
        pin_all(job.pid, a.cpu)
        time.sleep(1.0)
        d0 = time.time()
        r = trainprobe("diagnose", "--pid", str(job.pid), "--duration", str(a.duration), "--json")
        during = job.rate(d0 + 1.0, time.time())     # the job's steps/s while the diagnosis watched it
        rep = json.loads(r.stdout)
        f = next((x for x in rep["findings"] if x["id"] == "cpu.contended"), None)
        print("findings:", [(x["id"], x["expected_speedup"]) for x in rep["findings"]])
        if f is None:
            print("no cpu.contended finding: nothing to compare")
            return 1
        pred, (lo, hi) = f["expected_speedup"], f["expected_speedup_interval"]
        d = f["details"]
        print(f"predicted {pred:.2f}x (interval {lo:.2f}-{hi:.2f}, {f['confidence']}): r_train="
              f"{d['runq_share_training']:.3f}, others {d['others_cores_on_job_cpus']:.2f} cores on CPU {d['job_cpus']}")
        print(f"  bound: {f['speedup_bound']}")
        by = rep["overhead"]["by_probe"].get("contention", {})
        print(f"  contention probe cost: {by.get('thread_cpu_seconds')} CPU-s capture, "
              f"{by.get('parse_cpu_seconds')} CPU-s parse")
        from trainprobe.agent.rules.cpu_contended import gain_if_leave
        ours = {c.pid for c in comps}
        win = rep["window"]["seconds"]
        n_cpus = len(d["job_cpus"].split(","))
        mine = [c for c in d["competitors"] if c["pid"] in ours]
        sub = gain_if_leave(next(e["value"] for e in f["evidence"] if "ran on a CPU" in e["fact"]),
                            d["runq_share_training"], d["others_share_of_job_cpus"],
                            sum(c["cpu_seconds_on_job_cpus"] for c in mine) / win / n_cpus)
        print(f"  the benchmark's {len(mine)} of {a.competitors} competitors among those named; the model's "
              f"speedup when only they leave: {sub[0]:.2f}-{sub[1]:.2f}x")
        ratios, with_c, without_c, outside, per_cpu_s = [], [], [], [], {False: [], True: []}
        mine = [job.pid] + [c.pid for c in comps]
        for _ in range(a.reps):
            rates = []
            for stopped in (False, True):
                for c in comps:
                    c.send_signal(signal.SIGSTOP if stopped else signal.SIGCONT)
                t0 = time.time()
                time.sleep(0.5)
                m0, b0, p0 = time.monotonic(), cpu_busy_s(a.cpu), sum(proc_cpu_s(p) for p in mine)
                j0, n0 = proc_cpu_s(job.pid), job.points[-1][1]
                time.sleep(a.phase - 0.5)
                j1, n1 = proc_cpu_s(job.pid), job.points[-1][1]
                per_cpu_s[stopped].append((n1 - n0) / max(j1 - j0, 1e-3))
                # What ran on the CPU that was neither the job nor the benchmark's competitors.
                outside.append((cpu_busy_s(a.cpu) - b0 - (sum(proc_cpu_s(p) for p in mine) - p0))
                               / (time.monotonic() - m0))
                rates.append(job.rate(t0 + 0.5, time.time()))
            with_c.append(rates[0])
            without_c.append(rates[1])
            ratios.append(rates[1] / rates[0])
            for c in comps:
                c.send_signal(signal.SIGCONT)
        meas = statistics.median(ratios)
        spc = {k: statistics.median(v) for k, v in per_cpu_s.items()}
        print(f"the job's steps per CPU-second: {spc[False]:.1f} beside the competitors, {spc[True]:.1f} with them "
              f"stopped: a whole CPU would run it at ~{spc[True]:.1f} steps/s, "
              f"{spc[True] / statistics.median(with_c):.2f}x the phases' rate beside the competitors and "
              f"{spc[True] / during:.2f}x the {during:.2f} steps/s of the diagnosed window (what the full "
              f"prediction stands for): pred/meas {pred / (spc[True] / during):.2f}")
        print(f"work outside the benchmark on CPU {a.cpu} during the phases: median {statistics.median(outside):.0%} "
              f"(max {max(outside):.0%}) of the CPU: the full prediction assumes none")
        print(f"steps/s beside the competitors: {', '.join(f'{x:.2f}' for x in with_c)}")
        print(f"steps/s with them stopped:      {', '.join(f'{x:.2f}' for x in without_c)}")
        print(f"measured {meas:.2f}x (paired ratios {min(ratios):.2f}-{max(ratios):.2f}, n={len(ratios)}); "
              f"pred/meas {pred / meas:.2f}; in the interval: {lo <= meas <= hi}")
        print(f"only the benchmark's competitors leave: predicted {sub[0]:.2f}-{sub[1]:.2f}x, pred/meas "
              f"{sub[0] / meas:.2f}-{sub[1] / meas:.2f}; in it: {sub[0] * 0.9 <= meas <= sub[1] * 1.1}")
        return 0
    finally:
        for c in comps:
            c.send_signal(signal.SIGCONT)
            c.kill()
            c.wait()
        job.stop()


if __name__ == "__main__":
    sys.exit(main())
