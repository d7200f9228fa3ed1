"""Time from `trainprobe diagnose --slurm-job JOB --duration 10` to the merged job report, on a real
two-node Slurm (munged, slurmctld, two slurmd on this host; see scripts/slurm_cluster.py) running a
2-node torchrun/gloo job with one starved rank. Needs root and Debian's slurm-wlm and munge.

Interleaved with each run, a plain `diagnose --pid RANK --duration 10` on one rank of the same
job, so the fan-out's own cost (srun, the node agents' start-up, the merge) reads as a difference
measured under the same load.

    .venv/bin/python benchmarks/bench_slurm_fanout.py [--runs 3] [--duration 10] [--json OUT]
"""
from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scripts.slurm_cluster import JOB, SlurmCluster  # noqa: E402

from _common import PY, REPO  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--json", dest="out", default=None)
    a = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="trainprobe-slurm-bench-"))
    c = SlurmCluster(base / "cluster").start()
    try:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        (base / "job.sh").write_text(JOB.format(port=port, py=PY))
        r = subprocess.run(["sbatch", "--parsable", f"--chdir={REPO}", f"--output={base}/job.out", str(base / "job.sh")],
                           env=c.env, capture_output=True, text=True, check=True)
        jid = r.stdout.strip()
        out = base / "job.out"
        while not (out.exists() and "rank=1" in out.read_text() and "rank=0" in out.read_text()):
            time.sleep(1)
        # The ranks (torchrun starts each as `python -u -m MODULE`), not the launchers or the shell.
        rank = subprocess.run(["pgrep", "-f", "--", f"^{PY} -u -m trainprobe.agent.workloads.train_cpu"], capture_output=True,
                              text=True).stdout.split()
        assert rank, "no rank process found"
        fan, single, merged = [], [], None
        for i in range(a.runs):
            t = time.monotonic()
            r = subprocess.run([PY, "-m", "trainprobe.agent", "-q", "diagnose", "--slurm-job", jid, "--duration", str(a.duration),
                                "--json"], cwd=REPO, env=c.env, capture_output=True, text=True)
            fan.append(time.monotonic() - t)
            assert r.returncode == 0, r.stderr
            merged = json.loads(r.stdout)
            t = time.monotonic()
            r1 = subprocess.run([PY, "-m", "trainprobe.agent", "-q", "diagnose", "--pid", rank[0], "--duration", str(a.duration),
                                 "--json"], cwd=REPO, capture_output=True, text=True)
            single.append(time.monotonic() - t)
            assert r1.returncode == 0, r1.stderr
            print(f"run {i + 1}: slurm-job {fan[-1]:.2f} s, single-node {single[-1]:.2f} s "
                  f"(stragglers {[(s['node'], s['rank']) for s in merged['stragglers']]}, "
                  f"job speedup {merged['job_expected_speedup']})", flush=True)
    finally:
        c.stop()
    med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    res = {"nodes": 2, "window_s": a.duration, "runs": a.runs, "slurm_job_wall_s": [round(x, 2) for x in fan],
           "single_node_wall_s": [round(x, 2) for x in single], "slurm_job_median_s": round(med(fan), 2),
           "single_node_median_s": round(med(single), 2), "fan_out_cost_median_s": round(med(fan) - med(single), 2),
           "srun_seconds_last": (merged or {}).get("fan_out", {}).get("seconds")}
    print(json.dumps(res))
    if a.out:
        Path(a.out).write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
