"""Record the captures in tests/data/pyspy/gil: run tests/jobs/gil_threads.py in four shapes, attach
the real py-spy probe (its main sampler, its GIL sampler, the per-thread CPU time) for a short
window, and save the probe's raw Capture (gzipped JSON) and one `py-spy dump --json` of the job.

    sudo .venv/bin/python scripts/capture_pyspy_gil.py [--duration 3] [--out tests/data/pyspy/gil]

Needs py-spy and the rights to attach (root). The captures then replay through the real parser
and rules anywhere (tests/replay/test_pyspy_gil.py).
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

SCENARIOS = {
    "blocked": ["--neighbours", "pipe,queue,event,sleep"],      # threads that wait: no GIL held
    "ccalls": ["--neighbours", "hash,zlib,matmul"],              # C calls that release the GIL
    "spinner": ["--neighbours", "spinner,pipe"],                 # one pure-Python spinner, one blocked reader
    "native": ["--loop", "native", "--neighbours", "pipe,sleep"],  # the loop blocks in native code
}


def start(args: list[str]) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-m", "tests.jobs.gil_threads", "--seconds", "120", *args], cwd=REPO,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env=dict(os.environ, PYTHONUNBUFFERED="1"))
    assert p.stdout is not None
    for line in p.stdout:
        if line.startswith("PROGRESS"):
            return p
    raise RuntimeError("job exited early")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--duration", type=float, default=3.0)
    ap.add_argument("--out", default=str(REPO / "tests" / "data" / "pyspy" / "gil"))
    ap.add_argument("--only", default=None, help="comma-separated scenarios")
    a = ap.parse_args()
    from trainprobe.agent import diagnosis
    from trainprobe.probes.pyspy import pyspy_binary
    only = set(a.only.split(",")) if a.only else set(SCENARIOS)
    for name, args in SCENARIOS.items():
        if name not in only:
            continue
        w = start(args)
        try:
            time.sleep(1.0)
            d = diagnosis.run(w.pid, duration_s=a.duration, only=("pyspy",))
            dump = subprocess.run([pyspy_binary() or "py-spy", "dump", "--pid", str(w.pid), "--json", "--nonblocking"],
                                  capture_output=True, text=True, timeout=30).stdout
        finally:
            w.terminate()
            w.wait()
        out = Path(a.out) / name
        out.mkdir(parents=True, exist_ok=True)
        cap = next(c for c in d.captures if c.probe == "pyspy")
        with gzip.open(out / "pyspy.capture.json.gz", "wt") as fh:
            json.dump(cap.to_dict(), fh)
        (out / "pyspy-dump.json").write_text(json.dumps(json.loads(dump), indent=1))
        print(f"{name}: {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
