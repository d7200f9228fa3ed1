"""What torch.compile did to a public job: CUDA graphs or not, graph breaks, and the rate it gave.

    python benchmarks/gpu_compile_check.py --jobs lightning-transformer-gpu --out DIR

For each job of benchmarks/public_ledger.py, three processes run side by side and are timed in turn
(the others paused, as the ledger does): the script as it is, its trained module compiled in place
with mode="reduce-overhead" (what host.launch_bound prints), and with mode="default" (kernel fusion,
no CUDA graphs). The compiled ones run with TORCH_LOGS=perf_hints,graph_breaks,recompiles; the lines
that say why inductor skipped CUDA graphs ("skipping cudagraphs due to ..."), where dynamo broke the
graph and what it recompiled are kept, with each variant's rate over the eager one. It answers
"did the printed fix capture anything?" on a job where it measured no gain.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import public_ledger as pl  # noqa: E402

KEEP = re.compile(r"skipping cudagraphs|cudagraph|Graph break|graph break|Recompiling|recompil", re.I)


class LoggedProc(pl.PublicProc):
    """A PublicProc that keeps the lines of its output that speak of graphs."""

    def __init__(self, *args, **kwargs) -> None:
        self.lines: list[str] = []      # set before the base class starts the pump thread
        self.last: list[str] = []
        super().__init__(*args, **kwargs)

    def _pump(self) -> None:
        for line in self.proc.stdout:
            if KEEP.search(line) and len(self.lines) < 400:
                self.lines.append(line.rstrip()[:400])
            self.last = (self.last + [line.rstrip()[:400]])[-40:]


def check(job: pl.PublicJob, a: argparse.Namespace) -> dict:
    pl.prepare(job)
    variants = [("eager", {}), ("reduce-overhead", {"compile_models": "reduce-overhead"}),
                ("default", {"compile_models": "default"})]
    if job.compiled:
        variants = [("as-is", {}), ("reduce-overhead", {"compile": "reduce-overhead"}),
                    ("default", {"compile": "default"})]
    procs = []
    old = os.environ.get("TORCH_LOGS")
    for tag, knobs in variants:
        if knobs:
            os.environ["TORCH_LOGS"] = "perf_hints,graph_breaks,recompiles"
        else:
            os.environ.pop("TORCH_LOGS", None)
        procs.append(LoggedProc(job, knobs, tag=tag))
    if old is None:
        os.environ.pop("TORCH_LOGS", None)
    else:
        os.environ["TORCH_LOGS"] = old
    try:
        for p in procs:
            p.warm(job.warmup * a.warmup_scale, timeout=a.start_timeout)
        time.sleep(a.compile_wait)
        rates = pl.interleaved(procs, a.seconds, a.settle, 3, a.reps, 0.03, time.time() + a.job_seconds)
    except Exception as e:  # noqa: BLE001 - say which variant died and how
        gone = {tag: {"returncode": p.proc.poll(), "tail": p.last[-25:]}
                for (tag, _k), p in zip(variants, procs) if p.proc.poll() is not None}
        raise RuntimeError(f"{e}; exited: {json.dumps(gone)}") from None
    finally:
        for p in procs:
            try:
                p.resume(0)
            except Exception:  # noqa: BLE001 - it may have exited
                pass
            p.stop()
    out = {"job": job.name, "repo": job.repo, "commit": job.commit, "script": job.script, "variants": {}}
    for (tag, knobs), p, r in zip(variants, procs, rates):
        ratios = [x / b for x, b in zip(r, rates[0])]
        lo, hi = pl.mean_log_interval(ratios)
        out["variants"][tag] = {"knobs": knobs, "rates": [round(x, 3) for x in r],
                                "ratio": round(statistics.geometric_mean(ratios), 3),
                                "interval": [round(lo, 3), round(hi, 3)],
                                "injected": p.injected(), "log": p.lines}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seconds", type=float, default=2.5)
    ap.add_argument("--settle", type=float, default=0.7)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--warmup-scale", type=float, default=1.2)
    ap.add_argument("--compile-wait", type=float, default=20.0, help="seconds after warm-up before timing")
    ap.add_argument("--start-timeout", type=float, default=150.0)
    ap.add_argument("--job-seconds", type=float, default=120.0)
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    jobs = {j.name: j for j in pl.all_jobs()}
    res = []
    for name in a.jobs.split(","):
        try:
            r = check(jobs[name], a)
        except Exception as e:  # noqa: BLE001 - one job's failure keeps the others
            r = {"job": name, "error": str(e)[-2000:]}
        res.append(r)
        (out / "compile-check.json").write_text(json.dumps(res, indent=1))
        for tag, v in (r.get("variants") or {}).items():
            print(f"{name} {tag}: {v['ratio']}x ({v['interval'][0]}-{v['interval'][1]}) rates {v['rates']}")
            for line in v["log"][:30]:
                print("   ", line)
        if "error" in r:
            print(name, "error:", r["error"][-3000:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
