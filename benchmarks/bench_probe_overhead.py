"""What each probe costs the job it watches, and what it costs the host and the agent.

Two targets, each reporting its own progress every 0.25 s:
  - syscall-heavy: a Python loop of 1-byte read(/dev/zero) + write(/dev/null) (millions of syscalls/s),
  - DataLoader: the bundled CPU training job with 2 workers doing per-sample Python work.
For every probe configuration (none, process, pyspy, gil, sched, syscalls, all of them) the probe
runs in a fresh agent process attached to the target for a few seconds; the target's rate while
attached is compared with its rate in the "none" run of the same round. Rounds interleave the
configurations in a shuffled order, so slow drift of the machine hits all of them alike. A last
row measures the host-wide tax of the syscall tracepoints on a bystander: the syscall loop runs
unwatched while the syscall probe watches the DataLoader job.

Printed per configuration: the median slowdown ratio (rate without / rate with; 1.00 = free), the
agent's CPU-seconds and peak RSS, and for the bcc probes the compile (clang) and bcc import time.

    sudo .venv/bin/python benchmarks/bench_probe_overhead.py [--rounds 3] [--seconds 3] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

SYSCALL_LOOP = r"""
import os, time
fi = os.open("/dev/zero", os.O_RDONLY); fo = os.open("/dev/null", os.O_WRONLY)
n, last = 0, time.time()
print("PROGRESS t=%.3f steps=0" % last, flush=True)
while True:
    for _ in range(5000):
        os.write(fo, os.read(fi, 1))
    n += 5000
    now = time.time()
    if now - last >= 0.25:
        print("PROGRESS t=%.3f steps=%d" % (now, n), flush=True)
        last = now
"""

CONFIGS = ("none", "process", "pyspy", "gil", "sched", "syscalls", "all")


class Target:
    """A running target and its PROGRESS lines: (unix time, cumulative steps)."""

    def __init__(self, argv: list[str]):
        self.proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env=dict(os.environ, PYTHONUNBUFFERED="1", PYTHONWARNINGS="ignore"))
        self.points: list[tuple[float, int]] = []
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("PROGRESS"):
                kv = dict(x.split("=", 1) for x in line.split()[1:])
                self.points.append((float(kv["t"]), int(kv["steps"])))

    def wait_ready(self, n: int = 4, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        while len(self.points) < n:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("target did not start")
            time.sleep(0.1)

    def rate(self, t0: float, t1: float) -> float | None:
        """Steps per second between two unix times, interpolated between progress lines."""
        def steps_at(t: float) -> float | None:
            pts = self.points
            for (ta, sa), (tb, sb) in zip(pts, pts[1:]):
                if ta <= t <= tb:
                    return sa + (sb - sa) * (t - ta) / (tb - ta) if tb > ta else sa
            return None
        a, b = steps_at(t0), steps_at(t1)
        if a is None or b is None or t1 <= t0:
            return None
        return (b - a) / (t1 - t0)

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


def run_agent(config: str, pid: int, seconds: float) -> dict:
    """One probe configuration in a fresh agent process; returns its own measurements."""
    out = subprocess.run([sys.executable, __file__, "--agent", config, "--pid", str(pid), "--seconds", str(seconds)],
                         cwd=REPO, capture_output=True, text=True, timeout=seconds + 120)
    if out.returncode != 0:
        raise RuntimeError(f"agent {config} failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def agent_main(config: str, pid: int, seconds: float) -> int:
    """Inside the agent process: run the probe(s), print what they cost this process."""
    from trainprobe.probes.base import Capture, Recorder, WatchSpec
    from trainprobe.probes.registry import probe_class
    bcc_import_s = None
    if config in ("sched", "syscalls", "all"):
        from trainprobe.probes.support import bcc_support
        t_b = time.monotonic()
        bcc_support.import_bcc()
        bcc_import_s = time.monotonic() - t_b
    spec = WatchSpec(pid=pid, window_s=seconds)
    t0 = time.time()
    interval = [t0, t0 + seconds]
    compile_s: dict[str, float] = {}
    statuses: dict[str, str] = {}
    if config == "none":
        time.sleep(seconds)
        interval = [t0, time.time()]
    elif config == "all":
        from trainprobe.agent.session import run_session, select_probes
        res = run_session(spec, select_probes(), progress=lambda m: None)
        caps = {c.probe: c for c in res.captures}
        starts = [c.meta.get("attach_unix") for c in caps.values() if c.meta.get("attach_unix")]
        ends = [c.meta["attach_unix"] + c.meta["window_s"] for c in caps.values() if c.meta.get("attach_unix")]
        interval = [max(starts), min(ends)] if starts else [t0, time.time()]
        compile_s = {k: c.meta["overhead"]["compile_seconds"] for k, c in caps.items()
                     if c.meta.get("overhead", {}).get("compile_seconds") is not None}
        statuses = {k: c.status for k, c in caps.items()}
    else:
        import threading as th
        cls = probe_class(config)
        probe = cls()
        av = probe.check(spec)
        if not av.ok:
            print(json.dumps({"config": config, "skipped": av.reason}))
            return 0
        cap = Capture(config, started_unix=t0)
        probe.capture(spec, Recorder(cap, th.Event()), time.monotonic() + seconds)
        if cap.meta.get("attach_unix"):
            interval = [cap.meta["attach_unix"], cap.meta["attach_unix"] + cap.meta["window_s"]]
        else:
            interval = [t0, time.time()]
        oh = cap.meta.get("overhead") or {}
        if oh.get("compile_seconds") is not None:
            compile_s = {config: oh["compile_seconds"]}
        statuses = {config: cap.status}
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    print(json.dumps({
        "config": config, "interval": interval,
        "agent_cpu_seconds": round(s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime, 3),
        "agent_max_rss_mb": round(max(s.ru_maxrss, c.ru_maxrss) / 1024.0, 1),
        "bcc_import_seconds": None if bcc_import_s is None else round(bcc_import_s, 3),
        "compile_seconds": compile_s, "statuses": statuses,
    }))
    return 0


def bench(target_argv: list[str], configs: list[str], rounds: int, seconds: float, label: str,
          watched_argv: list[str] | None = None) -> dict[str, dict]:
    """Interleaved rounds; ratios of the target's rate in 'none' over its rate under each config.

    With watched_argv, the probes watch that second process while the target is a bystander."""
    target = Target(target_argv)
    watched = Target(watched_argv) if watched_argv else None
    results: dict[str, dict] = {c: {"ratios": [], "cpu": [], "rss": [], "compile": [], "bcc_import": []} for c in configs}
    try:
        target.wait_ready()
        if watched:
            watched.wait_ready()
        pid = (watched or target).proc.pid
        for rnd in range(rounds):
            order = list(configs)
            random.shuffle(order)
            runs = {}
            bases = []
            # "none" opens and closes each round: their mean is the baseline, their ratio the noise.
            for i, cfg in enumerate(["none"] + [c for c in order if c != "none"] + ["none"]):
                r = run_agent(cfg, pid, seconds)
                if r.get("skipped"):
                    results[cfg]["skipped"] = r["skipped"]
                    continue
                time.sleep(0.6)                  # let the last progress line after the interval arrive
                rate = target.rate(*r["interval"])
                if cfg == "none":
                    bases.append(rate)
                    if i == 0:
                        runs[cfg] = (rate, r)
                    continue
                runs[cfg] = (rate, r)
            base = statistics.mean(bases) if bases and all(bases) else None
            if len(bases) == 2 and all(bases):
                results["none"].setdefault("noise", []).append(abs(1.0 - bases[0] / bases[1]))
            for cfg, (rate, r) in runs.items():
                if cfg == "none":
                    rate = base
                if rate and base:
                    results[cfg]["ratios"].append(base / rate)
                results[cfg]["cpu"].append(r["agent_cpu_seconds"])
                results[cfg]["rss"].append(r["agent_max_rss_mb"])
                if r.get("compile_seconds"):
                    results[cfg]["compile"].append(sum(r["compile_seconds"].values()))
                if r.get("bcc_import_seconds") is not None:
                    results[cfg]["bcc_import"].append(r["bcc_import_seconds"])
            print(f"  {label}: round {rnd + 1}/{rounds} done", file=sys.stderr, flush=True)
    finally:
        target.stop()
        if watched:
            watched.stop()
    return results


def med(xs: list[float]) -> float | None:
    return round(statistics.median(xs), 3) if xs else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=3.0, help="probe window per run")
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--json", default=None, help="also write the raw results here")
    ap.add_argument("--agent", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--pid", type=int, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.agent:
        return agent_main(a.agent, a.pid, a.seconds)
    configs = [c for c in a.configs.split(",") if c]
    if "none" not in configs:
        configs.insert(0, "none")
    loader = [sys.executable, "-m", "trainprobe.agent.workloads.train_cpu", "--seconds", "0", "--num-workers", "2",
              "--sample-work", "2200", "--report-every", "0.25"]
    syscall = [sys.executable, "-c", SYSCALL_LOOP]
    out = {
        "syscall_heavy": bench(syscall, configs, a.rounds, a.seconds, "syscall-heavy"),
        "dataloader": bench(loader, configs, a.rounds, a.seconds, "dataloader"),
    }
    if "syscalls" in configs:
        out["bystander"] = bench(syscall, ["none", "syscalls"], a.rounds, a.seconds, "bystander", watched_argv=loader)
    print(f"\nprobe overhead: median over {a.rounds} interleaved rounds, {a.seconds:g} s attached per run, "
          f"{os.cpu_count()} CPUs; slowdown = target rate without / with the probe (1.00 = free)\n")
    hdr = (f"{'config':<10} {'syscall-heavy':>14} {'DataLoader':>11} {'agent CPU-s':>12} {'agent RSS MB':>13} "
           f"{'compile s':>10} {'bcc import s':>13}")
    print(hdr)
    print("-" * len(hdr))
    for c in configs:
        s, d = out["syscall_heavy"][c], out["dataloader"][c]
        if s.get("skipped"):
            print(f"{c:<10} skipped: {s['skipped']}")
            continue
        print(f"{c:<10} {med(s['ratios']) or '-':>14} {med(d['ratios']) or '-':>11} {med(s['cpu'] + d['cpu']) or '-':>12} "
              f"{med(s['rss'] + d['rss']) or '-':>13} {med(s['compile'] + d['compile']) or '-':>10} "
              f"{med(s['bcc_import'] + d['bcc_import']) or '-':>13}")
    noise = out["syscall_heavy"]["none"].get("noise", []) + out["dataloader"]["none"].get("noise", [])
    if noise:
        print(f"\nnoise floor: the two unprobed runs of a round differ by {100 * statistics.median(noise):.1f}% "
              f"(median), {100 * max(noise):.1f}% at most: ratios within that are not a measurable cost")
    if "bystander" in out:
        b = out["bystander"]["syscalls"]
        print(f"\nbystander: an unwatched syscall-heavy process slows by {med(b['ratios'])}x while the syscall "
              "probe watches the DataLoader job (the raw_syscalls tracepoints tax every process)")
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
