"""`trainprobe watch` on a GPU node: NVML busy share per GPU and per job, the gpu-busy trigger on a
starved job (one full diagnosis and a bundle), none on a healthy job, and watch's own CPU.

Runs two jobs of benchmarks/gpu_workloads.py on the one GPU, one after the other: `starved` (the
GPU about 5% busy) and `healthy` (about 99%), each under `watch --trigger gpu-busy<0.5 --for 20`.
Writes OUT/gpu_watch.json (metrics seen, trigger results, CPU) and keeps the bundles in OUT/bundles.

    PYTHONPATH=$REPO python3 benchmarks/gpu_watch.py OUT [--seconds 90]
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    rest = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(rest[11]) + int(rest[12])) / TICK


def scrape(port: int) -> dict:
    from prometheus_client.parser import text_string_to_metric_families
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out: dict = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append({"labels": s.labels, "value": s.value})
    return out


def one(mode: str, seconds: float, out: Path) -> dict:
    job = subprocess.Popen([sys.executable, str(REPO / "benchmarks" / "gpu_workloads.py"), mode, str(seconds + 60)],
                           cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(15)                                  # CUDA context, first batches
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    w = subprocess.Popen([sys.executable, "-m", "trainprobe.agent", "watch", "--listen", f"127.0.0.1:{port}", "--interval", "2",
                          "--trigger", "gpu-busy<0.5", "--for", "20", "--diagnose-seconds", "10",
                          "--bundle-dir", str(out / "bundles" / mode), "--pid", str(job.pid)],
                         cwd=REPO, stderr=open(out / f"watch-{mode}.log", "w"))
    res: dict = {"mode": mode}
    try:
        time.sleep(10)
        c0, t0 = cpu_s(w.pid), time.monotonic()
        deadline = time.monotonic() + seconds
        m = {}
        while time.monotonic() < deadline:
            time.sleep(5)
            m = scrape(port)
            n = [x["value"] for x in m.get("trainprobe_watch_diagnoses_total", [])]
            if mode == "starved" and n and n[0] >= 1:
                break
        c1, t1 = cpu_s(w.pid), time.monotonic()
        res.update(metrics=m, watch_cpu_share=round((c1 - c0) / (t1 - t0), 5), measured_s=round(t1 - t0, 1),
                   bundles=sorted(os.listdir(out / "bundles" / mode)) if (out / "bundles" / mode).exists() else [])
    finally:
        w.terminate()
        w.wait(timeout=30)
        job.terminate()
        job.wait(timeout=30)
    return res


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--seconds", type=float, default=90.0)
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    results = [one("starved", a.seconds, out), one("healthy", a.seconds, out)]
    (out / "gpu_watch.json").write_text(json.dumps(results, indent=2))
    for r in results:
        busy = [x["value"] for x in r["metrics"].get("trainprobe_watch_process_gpu_busy_share", [])]
        diag = [x for x in r["metrics"].get("trainprobe_watch_last_diagnosis_expected_speedup", [])]
        print(f"{r['mode']}: job GPU busy {busy}, diagnoses {[(d['labels'].get('finding'), d['value']) for d in diag]}, "
              f"bundles {r['bundles']}, watch CPU {100 * r['watch_cpu_share']:.3f}% of one core")
    return 0


if __name__ == "__main__":
    sys.exit(main())
