"""What py-spy's non-blocking reads miss on a training loop, against blocking reads in the same run.

trainprobe samples with `py-spy record --nonblocking` (a blocking read ptrace-stops every thread of
the target each sample). A non-blocking read races the interpreter: it fails (py-spy counts an
error and drops the sample) or stops early (a truncated stack) where frames change fastest. This
starts one job of benchmarks/public_ledger.py as it runs there (unmodified, no fix), then alternates
REPS pairs of py-spy windows on it, blocking and non-blocking (the order alternates), and reads the
training thread's samples with trainprobe's own classifier (probes/parsers/pystacks.py): the loop's
loading share (data_load + data_wait) from complete stacks, with truncated stacks in loading code
counted as loading (as the parser now does), and with py-spy's dropped samples added as loading
(an upper reading), beside the blocking reading. With --cost it also times the job's steps (its
progress file) during each window and during a window with no py-spy: what each mode costs it.

    .venv/bin/python benchmarks/pyspy_nonblocking.py --job mnist-rnn-cpu --reps 6 --out DIR [--cost]

Writes DIR/pyspy-nonblocking-JOB.json (every window) and prints the means.
"""
from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import public_ledger as P  # noqa: E402
from trainprobe.probes.parsers import pystacks  # noqa: E402
from trainprobe.probes.pyspy import read_unread  # noqa: E402

_FRAME = re.compile(r"^(.*) \(([^()]*):(\d+)\)$")


def read_raw(path: Path) -> dict[str, float]:
    """py-spy's raw (folded) output with --threads -> the main thread's sample counts by reading."""
    out = {"samples": 0, "loading": 0, "truncated": 0, "truncated_loading": 0}
    for line in path.read_text().splitlines():
        stack, _, count = line.rstrip().rpartition(" ")
        parts = stack.split(";")
        if not parts or "MainThread" not in parts[0]:
            continue
        frames = []
        for p in parts[1:]:
            m = _FRAME.match(p)
            # raw output names files relative to their sys.path entry: a leading "/" lets the
            # classifier's path markers ("/torch/", "/PIL/") match as they do on full paths
            frames.append(pystacks.Frame(m.group(1), "/" + m.group(2), int(m.group(3))) if m else pystacks.Frame(p, "", 0))
        st, n = tuple(frames), int(count)
        out["samples"] += n
        cat = pystacks.classify_training(st, {})
        if pystacks.truncated(st):
            out["truncated"] += n
            if cat not in ("data_load", "data_wait") and pystacks.loading_code(st):
                out["truncated_loading"] += n
                continue
        if cat in ("data_load", "data_wait"):
            out["loading"] += n
    return out


def window(pid: int, blocking: bool, seconds: float, rate: int, out: Path) -> dict[str, Any]:
    argv = ["py-spy", "record", "-p", str(pid), "-d", str(int(seconds)), "-r", str(rate), "--format", "raw",
            "-o", str(out), "--threads", "--idle"] + ([] if blocking else ["--nonblocking"])
    r = subprocess.run(argv, capture_output=True, text=True)
    unread = read_unread(r.stdout + r.stderr)
    row: dict[str, Any] = dict(read_raw(out), errors=unread["errors"] if unread else 0)
    n = max(row["samples"], 1)
    row["share"] = row["loading"] / n
    row["share_with_truncated"] = (row["loading"] + row["truncated_loading"]) / n
    row["share_errors_as_loading"] = (row["loading"] + row["truncated_loading"] + row["errors"]) / (n + row["errors"])
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--job", required=True, help="a job of benchmarks/public_ledger.py")
    ap.add_argument("--reps", type=int, default=6)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--rate", type=int, default=30)
    ap.add_argument("--cost", action="store_true", help="also time the job's steps in each window and in one without py-spy")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    job = next((j for j in P.all_jobs() if j.name == a.job), None)
    if job is None:
        ap.error(f"no such job: {a.job}")
    a.out.mkdir(parents=True, exist_ok=True)
    P.prepare(job)
    proc = P.PublicProc(job, thread=job.thread, tag="before")
    rows: list[dict[str, Any]] = []
    try:
        proc.warm(job.warmup, 300)
        pid = proc.proc.pid
        for i in range(a.reps):
            modes = ("nonblocking", "blocking") if i % 2 == 0 else ("blocking", "nonblocking")
            if a.cost:
                modes = modes + ("none",) if i % 2 == 0 else ("none",) + modes
            for mode in modes:
                t = time.time()
                if mode == "none":
                    row: dict[str, Any] = {"steps_per_s": proc.rate(a.seconds)}
                elif a.cost:
                    sp = subprocess.Popen([sys.executable, __file__, "--_window", str(pid), mode, str(a.seconds),
                                           str(a.rate), str(a.out / f"{mode}.txt")], stdout=subprocess.PIPE, text=True)
                    time.sleep(0.5)
                    rate = proc.rate(a.seconds - 1.0)
                    row = {**json.loads(sp.communicate()[0]), "steps_per_s": rate}
                else:
                    row = window(pid, mode == "blocking", a.seconds, a.rate, a.out / f"{mode}.txt")
                rows.append({"rep": i, "mode": mode, "start_unix": round(t, 2), **row})
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    finally:
        proc.proc.kill()
    summary: dict[str, Any] = {"job": a.job, "rate_hz": a.rate, "seconds": a.seconds, "reps": a.reps}
    for mode in ("nonblocking", "blocking"):
        rs = [r for r in rows if r["mode"] == mode]
        summary[mode] = {k: round(statistics.mean(r[k] for r in rs), 3) for k in
                         ("samples", "errors", "truncated", "truncated_loading", "share", "share_with_truncated",
                          "share_errors_as_loading")}
    if a.cost:
        none = {r["rep"]: r["steps_per_s"] for r in rows if r["mode"] == "none"}
        for mode in ("nonblocking", "blocking"):
            logs = [math.log(r["steps_per_s"] / none[r["rep"]]) for r in rows if r["mode"] == mode]
            summary[mode]["steps_vs_none"] = round(math.exp(statistics.mean(logs)), 3)
            summary[mode]["steps_vs_none_sd_log"] = round(statistics.stdev(logs), 3) if len(logs) > 1 else None
    (a.out / f"pyspy-nonblocking-{a.job}.json").write_text(json.dumps({"summary": summary, "windows": rows}, indent=1))
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--_window":
        pid, mode, sec, rate, out = sys.argv[2:7]
        print(json.dumps(window(int(pid), mode == "blocking", float(sec), int(rate), Path(out))))
        sys.exit(0)
    sys.exit(main())
