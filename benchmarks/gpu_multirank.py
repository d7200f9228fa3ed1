"""Multi-rank validation on a node with 2 GPUs: a real torchrun DDP job over NCCL, diagnosed live.

    python benchmarks/gpu_multirank.py [--out DIR] [--modes starved-rank1,healthy]

For each mode it starts `torchrun --nproc_per_node=2 benchmarks/gpu_ddp.py MODE`, waits until both
ranks train, measures steps/s untouched, runs `trainprobe diagnose` against the launcher's PID (with
--save, so the evidence can be re-diagnosed offline) and then against rank 0's PID, measures steps/s
untouched again, and stops the job. It writes MODE-launcher.json, MODE-rank.json, MODE.tar.gz (the
bundle), MODE.log and summary.json under --out (default $OUT), and prints per mode: the ranks found
with their GPUs and workers, the top finding and the rank it names, the straggler facts, the numactl
lines, and the job's steps/s while diagnosed over untouched (the agent's overhead).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
VARIANTS = "--skip gpu;--probes process,pyspy"   # extra diagnose runs, to tell the probes' costs apart
ENV = dict(os.environ, NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1",
           PYTHONUNBUFFERED="1")


def progress_points(lines: list[tuple[float, str]]) -> dict[int, list[tuple[float, int]]]:
    out: dict[int, list[tuple[float, int]]] = {}
    for _arrived, ln in lines:
        m = re.search(r"rank=(\d+) steps=(\d+) .* t=([\d.]+)", ln)
        if m:
            out.setdefault(int(m.group(1)), []).append((float(m.group(3)), int(m.group(2))))
    return out


def rate(points: list[tuple[float, int]], t0: float, t1: float) -> float | None:
    pts = [p for p in points if t0 <= p[0] <= t1]
    if len(pts) < 2 or pts[-1][0] <= pts[0][0]:
        return None
    return (pts[-1][1] - pts[0][1]) / (pts[-1][0] - pts[0][0])


def children_with_rank(pid: int) -> dict[int, int]:
    ranks = {}
    for kid in open(f"/proc/{pid}/task/{pid}/children").read().split():
        try:
            env = open(f"/proc/{kid}/environ", "rb").read().split(b"\0")
        except OSError:
            continue
        for item in env:
            if item.startswith(b"LOCAL_RANK="):
                ranks[int(item.split(b"=", 1)[1])] = int(kid)
    return ranks


def diagnose(pid: int, duration: float, extra: list[str]) -> tuple[dict | None, str, float, float]:
    t0 = time.time()
    p = subprocess.run([sys.executable, "-m", "trainprobe.agent", "diagnose", "--pid", str(pid), "--duration", str(duration),
                        "--json", *extra], cwd=REPO, capture_output=True, text=True, timeout=duration + 120, env=ENV)
    t1 = time.time()
    try:
        return json.loads(p.stdout), p.stderr, t0, t1
    except ValueError:
        return None, p.stderr + f"\n(exit {p.returncode}, no JSON)", t0, t1


def run_mode(mode: str, out: Path, duration: float, clean: float) -> dict:
    lines: list[tuple[float, str]] = []
    job = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                            str(REPO / "benchmarks" / "gpu_ddp.py"), mode, "240"], cwd=REPO, env=ENV,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)

    def pump() -> None:
        for ln in job.stdout:
            lines.append((time.time(), ln.rstrip("\n")))

    threading.Thread(target=pump, daemon=True).start()
    row: dict = {"mode": mode, "launcher_pid": job.pid}
    try:
        deadline = time.time() + 150
        while time.time() < deadline and len(progress_points(lines)) < 2:
            if job.poll() is not None:
                raise RuntimeError("torchrun exited: " + " | ".join(ln for _, ln in lines[-10:]))
            time.sleep(0.5)
        ranks = children_with_rank(job.pid)
        row["rank_pids"] = {str(k): v for k, v in sorted(ranks.items())}
        time.sleep(3)
        c0 = time.time()
        time.sleep(clean)
        c1 = time.time()
        rep_l, err_l, d0, d1 = diagnose(job.pid, duration, ["--save", str(out / f"{mode}.tar.gz")])
        rep_r, err_r, e0, e1 = diagnose(ranks[0], duration, [])
        variants = {}
        for extra in [v for v in VARIANTS.split(";") if v.strip()]:
            rep_v, _err_v, v0, v1 = diagnose(job.pid, duration, extra.split())
            variants[extra] = (v0, v1)
        f0 = time.time()
        time.sleep(clean)
        f1 = time.time()
        pts = progress_points(lines)
        over = {}
        for r, p in pts.items():
            untouched = [x for x in (rate(p, c0, c1), rate(p, f0, f1)) if x]
            during = [x for x in (rate(p, d0 + 1, d1), rate(p, e0 + 1, e1)) if x]
            if untouched and during:
                over[str(r)] = {"untouched": round(statistics.mean(untouched), 2),
                                "diagnosed": round(statistics.mean(during), 2),
                                "ratio": round(statistics.mean(during) / statistics.mean(untouched), 4)}
                for extra, (v0, v1) in variants.items():
                    v = rate(p, v0 + 1, v1)
                    if v:
                        over[str(r)][f"ratio with {extra}"] = round(v / statistics.mean(untouched), 4)
        row["steps_per_s"] = over
        for tag, rep, err in (("launcher", rep_l, err_l), ("rank", rep_r, err_r)):
            (out / f"{mode}-{tag}.json").write_text(json.dumps(rep, indent=1) if rep else err)
            row[tag] = summarize(rep, err)
    finally:
        try:
            os.killpg(job.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            job.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(job.pid, signal.SIGKILL)
        (out / f"{mode}.log").write_text("\n".join(ln for _, ln in lines[-400:]))
    return row


def summarize(rep: dict | None, err: str) -> dict:
    if rep is None:
        return {"error": err[-600:]}
    f0 = rep["findings"][0] if rep["findings"] else {}
    return {
        "target": rep["target"]["pid"], "requested": rep["target"].get("requested_pid"),
        "ranks": rep["target"].get("ranks"),
        "workers": [w for w in rep["target"]["workers"] if w["role"] == "dataloader_worker"],
        "gpus": [(g.get("index"), g.get("bus_id"), g.get("numa_node")) for g in rep["host"]["gpus"]],
        "findings": [(f["id"], f["expected_speedup"], f["title"]) for f in rep["findings"]],
        "top_details": f0.get("details"),
        "straggler_facts": [(e["fact"], e["value"]) for e in f0.get("evidence", []) if "rank" in e["fact"]],
        "commands": [fx["command"] for f in rep["findings"] for fx in f["fixes"] if fx.get("command")],
        "notes": rep.get("notes"), "probes": [(p["name"], p["status"], p["reason"]) for p in rep["probes"]],
        "gpu": rep.get("gpu"), "overhead": rep.get("overhead"),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT") or "gpu-multirank-out")
    ap.add_argument("--modes", default="starved-rank1,healthy")
    ap.add_argument("--duration", type=float, default=8.0)
    ap.add_argument("--clean", type=float, default=6.0)
    ap.add_argument("--variants", default=None, help="';'-separated extra diagnose argument sets")
    a = ap.parse_args()
    if a.variants is not None:
        globals()["VARIANTS"] = a.variants
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for mode in a.modes.split(","):
        try:
            rows.append(run_mode(mode, out, a.duration, a.clean))
        except Exception as exc:  # noqa: BLE001 - one failed mode never sinks the other
            rows.append({"mode": mode, "error": f"{type(exc).__name__}: {exc}"})
        print(json.dumps(rows[-1], indent=1, default=str)[:6000], flush=True)
    (out / "summary.json").write_text(json.dumps(rows, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
