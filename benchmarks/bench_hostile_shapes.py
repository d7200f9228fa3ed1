"""What a job of a hostile shape costs the agent: wall time, CPU seconds and peak RSS of the real
commands, measured from outside, beside what the report says it cost and found.

    python benchmarks/bench_hostile_shapes.py [--duration 3] [--cases baseline,threads,...] [--no-torch] [--json]

Cases (scripts/hostile_job.py starts each job):
  baseline   the plain loop (the yardstick)
  threads    10,000 idle threads beside the loop
  recursion  the loop 5,000 frames deep (sys.setrecursionlimit raised)
  argv       a command line of 1 MB (256 arguments of 4 KiB, within ARG_MAX)
  forks      100 children forked a second, each living 50 ms
For each: `diagnose --pid PID --duration D --json --save B.tar.gz --html H.html`, then
`flamegraph --input B.tar.gz`, a live `flamegraph --pid PID --threads --subprocesses` and `watch --pid PID`
(a trigger that fires at once, so it diagnoses too), each with a hard timeout; after each, what was left behind (a tracer on the job, a process of the agent's
session, a file in its TMPDIR). The agent's budget is 150 MB peak RSS for its whole tree.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from scripts import hostile_shapes as hostile  # noqa: E402

ARGV_PAD = ["--pad=" + "x" * (4096 - 7) for _ in range(256)]      # 256 x 4 KiB = 1 MiB
CASES = {
    "baseline": [],
    "threads": ["--threads", "10000"],
    "recursion": ["--recurse", "5000"],
    "argv": ARGV_PAD,
    "forks": ["--forks-per-s", "100", "--child-life-s", "0.05"],
}


def _report_facts(out: str) -> dict:
    try:
        rep = json.loads(out)
    except ValueError:
        return {}
    ov = rep.get("overhead") or {}
    tgt = rep.get("target") or {}
    return {
        "report_rss_mb": ov.get("agent_max_rss_mb"), "report_cpu_s": ov.get("agent_cpu_seconds"),
        "threads": tgt.get("threads"), "workers": len(tgt.get("workers") or []),
        "cmdline_chars": len(tgt.get("cmdline") or ""),
        "probes": {p["name"]: p["status"] for p in rep.get("probes", [])},
        "findings": [f["id"] for f in rep.get("findings", [])],
        "json_bytes": len(out),
    }


def run_case(name: str, duration: float, timeout_s: float, use_torch: bool = True) -> list[dict]:
    job = hostile.start_job(*CASES[name], *(["--torch"] if use_torch else []), ready_timeout_s=180)
    rows = []
    d = tempfile.mkdtemp(prefix="bench-hostile-")
    try:
        bundle, html = os.path.join(d, "B.tar.gz"), os.path.join(d, "H.html")
        commands = [
            ("diagnose", ["diagnose", "--pid", str(job.pid), "--duration", str(duration), "--json",
                          "--save", bundle, "--html", html]),
            ("flame-bundle", ["flamegraph", "--input", bundle, "--threads", "-o", os.path.join(d, "F1.svg")]),
            ("flame-live", ["flamegraph", "--pid", str(job.pid), "--duration", str(duration), "--threads",
                            "--subprocesses", "-o", os.path.join(d, "F2.html")]),
            ("watch", ["watch", "--pid", str(job.pid), "--listen", "none", "--interval", "0.5",
                       "--duration", str(duration + 2), "--trigger", "loop-cpu<1", "--for", "0",
                       "--diagnose-seconds", "1", "--bundle-dir", os.path.join(d, "watch-bundles"),
                       "--textfile", os.path.join(d, "metrics.prom")]),
        ]
        for cmd, args in commands:
            steps0 = job.steps()
            r = hostile.run_agent(*args, timeout_s=timeout_s)
            row = {"case": name, "command": cmd, "rc": r.rc, "timed_out": r.timed_out, "wall_s": r.wall_s,
                   "cpu_s": r.cpu_s, "peak_rss_mb": r.peak_rss_mb, "left": hostile.leftovers(job.pid, r),
                   "job_alive": job.proc.poll() is None, "job_steps": job.steps() - steps0,
                   "stderr_tail": r.err.strip().splitlines()[-1][:160] if r.err.strip() else ""}
            if cmd == "diagnose":
                row.update(_report_facts(r.out))
                row["bundle_bytes"] = os.path.getsize(bundle) if os.path.exists(bundle) else None
                row["html_bytes"] = os.path.getsize(html) if os.path.exists(html) else None
            rows.append(row)
    finally:
        job.stop()
        shutil.rmtree(d, ignore_errors=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=3.0)
    ap.add_argument("--timeout", type=float, default=90.0, help="hard limit on each command (s)")
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--no-torch", action="store_true",
                    help="the pure-Python step instead of a torch model (watch then finds no training process)")
    a = ap.parse_args()
    rows = []
    for name in a.cases.split(","):
        rows.extend(run_case(name, a.duration, a.timeout, not a.no_torch))
    if a.json:
        print(json.dumps(rows, indent=1))
        return
    print(f"{'case':<10} {'command':<10} {'rc':>3} {'wall s':>7} {'CPU s':>6} {'RSS MB':>7} {'rep RSS':>7} "
          f"{'rep CPU':>7} {'threads':>7} {'left':>4}  report")
    for r in rows:
        said = ""
        if r["command"] == "diagnose":
            bad = {k: v for k, v in (r.get("probes") or {}).items() if v != "ok"}
            said = (f"findings={','.join(r.get('findings') or []) or '-'} json={r.get('json_bytes')}B "
                    f"bundle={r.get('bundle_bytes')}B html={r.get('html_bytes')}B workers={r.get('workers')}"
                    + (f" not-ok={bad}" if bad else ""))
        elif r["rc"] != 0:
            said = r["stderr_tail"]
        print(f"{r['case']:<10} {r['command']:<10} {r['rc']:>3} {r['wall_s']:>7.2f} {r['cpu_s']:>6.2f} "
              f"{r['peak_rss_mb']:>7.1f} {str(r.get('report_rss_mb', '')):>7} {str(r.get('report_cpu_s', '')):>7} "
              f"{str(r.get('threads', '')):>7} {len(r['left']):>4}  {said}"
              + ("  TIMED OUT" if r["timed_out"] else "") + ("" if r["job_alive"] else "  JOB DIED"))
        for line in r["left"]:
            print(f"{'':<22}left: {line}")


if __name__ == "__main__":
    main()
