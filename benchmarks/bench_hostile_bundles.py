"""What a hostile bundle costs `trainprobe report`: peak RSS and wall time of the real command.

    python benchmarks/bench_hostile_bundles.py [--pax-mib 1024] [--member-mib 255] [--members 4]

Builds, in a temporary directory, bundles crafted to exhaust the reader:
  pax-bomb       a PAX extended header of --pax-mib MiB before the real members
  gzip-declared  one capture member whose header declares 4 GiB (spaces)
  gzip-members   --members capture members of --member-mib MiB of spaces each, all listed
  deep-json      a bundle.json whose context nests 900 levels
and runs `python -m trainprobe.agent report BUNDLE` on each as a child, printing its exit code,
peak RSS (the child's ru_maxrss, from wait4) and wall time, with the file's size on disk, and the
same figures for a real bundle (the H200 starved capture) as the yardstick.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from scripts import bundle_craft as craft  # noqa: E402


def measure(path: str, timeout_s: float) -> dict:
    t0 = time.monotonic()
    p = subprocess.Popen([sys.executable, "-m", "trainprobe.agent", "report", path, "--json"], cwd=REPO,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = t0 + timeout_s
    while True:
        pid, status, ru = os.wait4(p.pid, os.WNOHANG)
        if pid:
            break
        if time.monotonic() > deadline:
            p.kill()
            pid, status, ru = os.wait4(p.pid, 0)
            break
        time.sleep(0.02)
    wall = time.monotonic() - t0
    err = p.stderr.read().decode(errors="replace").strip().splitlines()
    return {"rc": os.waitstatus_to_exitcode(status), "max_rss_mb": round(ru.ru_maxrss / 1024, 1),
            "wall_s": round(wall, 2), "stderr": err[-1][:150] if err else ""}


def real_bundle(d: str) -> str:
    from trainprobe.agent import bundle, diagnosis
    from trainprobe.probes.pyspy import capture_from_chrometrace
    import gzip
    h200 = REPO / "tests" / "data" / "h200" / "starved"
    with gzip.open(h200 / "pyspy.chrometrace.json.gz", "rt") as fh:
        trace = fh.read()
    pid = json.loads((h200 / "nvml.json").read_text())["pid"]
    cap = capture_from_chrometrace(trace, pid)
    ctx = {"window": {"start_unix": 1.0, "seconds": 10.0}, "host": {}, "target": {"pid": pid}}
    rep, _ev = diagnosis.report_from([cap], ctx, {}, [])
    path = os.path.join(d, "real.tar.gz")
    bundle.save(path, [cap], ctx, rep)
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pax-mib", type=int, default=1024)
    ap.add_argument("--member-mib", type=int, default=255)
    ap.add_argument("--members", type=int, default=4)
    ap.add_argument("--timeout", type=float, default=120.0)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        cases = {"real": real_bundle(d)}
        p = os.path.join(d, "pax.tar.gz")
        craft.write_tgz(p, craft.pax_bomb_parts(a.pax_mib << 20, craft.member("b/bundle.json", craft.index([]))
                                                + craft.END), level=9)
        cases["pax-bomb"] = p
        p = os.path.join(d, "declared.tar.gz")
        craft.write_tgz(p, craft.gzip_bomb_parts(4 << 30, 1), level=9)
        cases["gzip-declared"] = p
        p = os.path.join(d, "members.tar.gz")
        craft.write_tgz(p, craft.gzip_bomb_parts(a.member_mib << 20, a.members), level=9)
        cases["gzip-members"] = p
        deep = {"window": {"seconds": 1}}
        cur = deep
        for _ in range(900):
            cur["x"] = {}
            cur = cur["x"]
        p = os.path.join(d, "deep.tar.gz")
        craft.write_tgz(p, [craft.member("b/bundle.json", craft.index([], context=deep)), craft.END])
        cases["deep-json"] = p
        for name, path in cases.items():
            r = measure(path, a.timeout)
            print(f"{name:14s} {os.path.getsize(path) / 1e6:8.2f} MB on disk  rc={r['rc']}  "
                  f"peak RSS {r['max_rss_mb']:7.1f} MB  {r['wall_s']:6.2f} s  {r['stderr']}", flush=True)


if __name__ == "__main__":
    main()
