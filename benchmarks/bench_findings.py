"""Predicted against measured: apply each finding's fix and time the job before and after.

For cpu.oversubscribed, io.small_reads and gil.contention it starts the bundled CPU job in the
bad shape, diagnoses it (all probes, as `trainprobe diagnose` would), then times the job in the bad
shape and with the fix applied, in interleaved runs, and prints the finding's expected speedup next
to the measured ratio (fixed steps/s over original steps/s, median over the rounds).

  cpu.oversubscribed  16 intra-op threads and a competing busy process  -> the proposed thread count
  io.small_reads      64 tiny files per sample, 1 worker                 -> the same bytes from one packed file
  gil.contention      a thread spinning in pure Python beside the loop  -> no spinner

    sudo .venv/bin/python benchmarks/bench_findings.py [--rounds 3] [--seconds 6] [--only cpu,io,gil]
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

PY = sys.executable


def rate_of(args: list[str], seconds: float, competitor: bool) -> float:
    """steps/s of one run of the job, from its progress lines after the first second."""
    busy = subprocess.Popen([PY, "-c", "while True: pass"]) if competitor else None
    try:
        out = subprocess.run([PY, "-m", "trainprobe.agent.workloads.train_cpu", "--seconds", str(seconds + 1.0),
                              "--report-every", "0.5", *args], cwd=REPO, capture_output=True, text=True,
                             timeout=seconds + 120)
    finally:
        if busy is not None:
            busy.kill()
            busy.wait()
    pts = []
    for line in out.stdout.splitlines():
        if line.startswith("PROGRESS"):
            kv = dict(x.split("=", 1) for x in line.split()[1:])
            pts.append((float(kv["t"]), int(kv["steps"])))
    pts = pts[1:]
    if len(pts) < 2:
        raise RuntimeError("too few progress lines:\n" + out.stdout[-2000:] + out.stderr[-2000:])
    return (pts[-1][1] - pts[0][1]) / (pts[-1][0] - pts[0][0])


def diagnose(args: list[str], competitor: bool, duration: float) -> dict:
    from trainprobe.agent import diagnosis
    w = subprocess.Popen([PY, "-m", "trainprobe.agent.workloads.train_cpu", "--seconds", "600", *args], cwd=REPO,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env=dict(os.environ, PYTHONUNBUFFERED="1"))
    busy = subprocess.Popen([PY, "-c", "while True: pass"]) if competitor else None
    try:
        n = 0
        assert w.stdout is not None
        for line in w.stdout:
            if line.startswith("PROGRESS"):
                n += 1
                if n >= 2:
                    break
        d = diagnosis.run(w.pid, duration_s=duration, progress=lambda m: None)
        return d.report
    finally:
        if busy is not None:
            busy.kill()
            busy.wait()
        w.kill()
        w.wait()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=6.0, help="timed seconds per run")
    ap.add_argument("--duration", type=float, default=3.0, help="diagnosis window")
    ap.add_argument("--only", default="cpu,io,gil")
    a = ap.parse_args()
    only = set(a.only.split(","))
    tmp = Path(tempfile.mkdtemp(prefix="trainprobe-bench-"))
    tiny = tmp / "tiny"
    tiny.mkdir()
    blob = os.urandom(256)
    for i in range(4000):
        (tiny / f"s{i:06d}.bin").write_bytes(blob)
    shard = tmp / "shard.bin"
    with open(shard, "wb") as fh:
        for f in sorted(tiny.iterdir()):
            fh.write(f.read_bytes())
    io_base = ["--sample-work", "0", "--num-workers", "1", "--files-per-sample", "64", "--batch-size", "32"]
    cases = []
    if "cpu" in only:
        cases.append(("cpu.oversubscribed", ["--sample-work", "0", "--threads", "16"], True,
                      lambda f: ["--sample-work", "0", "--threads", str(f["details"]["proposed_intra_op_threads"])],
                      "intra-op threads 16 -> the proposed count"))
    if "io" in only:
        cases.append(("io.small_reads", io_base + ["--small-files", str(tiny)], False,
                      lambda f: io_base + ["--shard", str(shard), "--record-bytes", "256"],
                      "64 tiny files per sample -> one pread from a packed file"))
    if "gil" in only:
        cases.append(("gil.contention", ["--sample-work", "0", "--gil-spinner"], False,
                      lambda f: ["--sample-work", "0"], "spinning thread removed"))
    rows = []
    for fid, bad, competitor, fixed_of, label in cases:
        rep = diagnose(bad, competitor, a.duration)
        f = next((x for x in rep["findings"] if x["id"] == fid), None)
        ranked = [x["id"] for x in rep["findings"]]
        if f is None:
            rows.append((fid, None, None, ranked, "not found"))
            continue
        fixed = fixed_of(f)
        ratios = []
        for _ in range(a.rounds):
            r_bad = rate_of(bad, a.seconds, competitor)
            r_fix = rate_of(fixed, a.seconds, competitor)
            ratios.append(r_fix / r_bad)
        if fid == "cpu.oversubscribed":
            label = label.replace("the proposed count", str(f["details"]["proposed_intra_op_threads"]))
        rows.append((fid, f["expected_speedup"], round(statistics.median(ratios), 2), ranked,
                     f"{label}; ratios {[round(x, 2) for x in ratios]}"))
        print(f"  {fid}: done", file=sys.stderr, flush=True)
    print(f"\npredicted vs measured ({a.rounds} interleaved rounds of {a.seconds:g} s, {os.cpu_count()} CPUs)\n")
    print(f"{'finding':<20} {'predicted':>9} {'measured':>9}  rank  fix applied")
    for fid, pred, meas, ranked, note in rows:
        rank = ranked.index(fid) + 1 if fid in ranked else "-"
        print(f"{fid:<20} {pred if pred is not None else '-':>9} {meas if meas is not None else '-':>9}  "
              f"{rank!s:>4}  {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
