"""Record the captures in tests/data/bcc: run the bundled workload in four shapes, diagnose each
with every probe, and save each probe's raw Capture (gzipped JSON) plus the diagnosis context.

    sudo .venv/bin/python scripts/capture_bcc_fixtures.py [--duration 3] [--out tests/data/bcc]

Needs root, bcc and py-spy (what the live tests need). The fixtures then replay through the real
parsers and rules anywhere, without root.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

SCENARIOS = {
    "oversubscribed": (["--sample-work", "0", "--threads", "16"], True, False),
    "small_files": (["--sample-work", "0", "--num-workers", "1", "--files-per-sample", "64", "--batch-size", "32"],
                    False, True),
    "gil_spinner": (["--sample-work", "0", "--gil-spinner"], False, False),
    "healthy": (["--sample-work", "0", "--threads", "1"], False, False),
}


def start(args: list[str]) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-m", "trainprobe.agent.workloads.train_cpu", "--seconds", "120", *args], cwd=REPO,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env=dict(os.environ, PYTHONUNBUFFERED="1"))
    n = 0
    assert p.stdout is not None
    for line in p.stdout:
        if line.startswith("PROGRESS"):
            n += 1
            if n >= 2:
                return p
    raise RuntimeError("workload exited early")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--duration", type=float, default=3.0)
    ap.add_argument("--out", default=str(REPO / "tests" / "data" / "bcc"))
    ap.add_argument("--only", default=None, help="comma-separated scenarios")
    a = ap.parse_args()
    from trainprobe.agent import diagnosis
    only = set(a.only.split(",")) if a.only else set(SCENARIOS)
    tiny = Path(tempfile.mkdtemp(prefix="trainprobe-tiny-"))
    blob = os.urandom(256)
    for i in range(4000):
        (tiny / f"s{i:06d}.bin").write_bytes(blob)
    for name, (args, competitor, files) in SCENARIOS.items():
        if name not in only:
            continue
        if files:
            args = args + ["--small-files", str(tiny)]
        w = start(args)
        busy = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if competitor else None
        try:
            time.sleep(0.5)
            d = diagnosis.run(w.pid, duration_s=a.duration)
        finally:
            if busy is not None:
                busy.kill()
                busy.wait()
            w.terminate()
            w.wait()
        out = Path(a.out) / name
        out.mkdir(parents=True, exist_ok=True)
        for old in out.glob("*.capture.json.gz"):
            old.unlink()
        for cap in d.captures:
            if cap.status not in ("ok", "timeout"):
                continue
            with gzip.open(out / f"{cap.probe}.capture.json.gz", "wt") as fh:
                json.dump(cap.to_dict(), fh)
        (out / "context.json").write_text(json.dumps(d.context, indent=1))
        (out / "report.json").write_text(json.dumps(d.report, indent=1))
        print(name, [(f["id"], f["expected_speedup"]) for f in d.report["findings"]], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
