#!/usr/bin/env python3
"""Validate trainprobe's GPU diagnosis on a real GPU node, in one command.

Estimated at 4-5 minutes; no new mode starts after --budget (450 s).

    python benchmarks/gpu_validate.py                 # results under $OUT (else ./gpu-validate-out)

For each mode of benchmarks/gpu_workloads.py (starved, healthy, sync, pageable, then the fixes:
fixed, pinned, graphed) it starts the workload, lets it warm up, measures its steps/s untouched,
then runs `python -m trainprobe.agent diagnose --pid PID --duration D --json` against it while it trains
(measuring steps/s meanwhile: the agent's real cost), and stops it. It records each mode's top
finding, the finding it should give and its predicted speedup, and computes the measured speedups
starved -> fixed, pageable -> pinned and sync -> graphed from the untouched rates of one run.

Writes: reports/MODE.json (the diagnose report), logs/MODE.workload.txt, logs/MODE.diagnose.txt,
summary.json and summary.md (also printed). Exit code: 0 every mode ran and gave its expected
finding; 1 a mode failed or gave another finding; 2 the node is not ready (no py-spy, no NVML, no
CUDA torch), with the reason on stderr.

Needs: Python with torch (CUDA), nvidia-ml-py, psutil, click, and py-spy (`pip install` the wheel
first). Runs as root (py-spy attaches to the workloads).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
WORKLOADS = REPO / "benchmarks" / "gpu_workloads.py"
DEFAULT_MODES = ("starved", "healthy", "sync", "pageable", "fixed", "pinned", "graphed")

# What each mode should give: ("is", ids) the top finding is one of ids; ("not", ids) none of them
# appears among the findings.
EXPECT: dict[str, tuple[str, tuple[str, ...]]] = {
    "starved": ("is", ("dataloader.starved",)),
    "healthy": ("is", ("compute.bound",)),
    "sync": ("is", ("host.launch_bound", "host.sync")),
    "pageable": ("is", ("h2d.pageable",)),
    "fixed": ("not", ("dataloader.starved",)),
    "pinned": ("not", ("h2d.pageable",)),
    "graphed": ("not", ("host.launch_bound", "host.sync")),
}
# (slow mode, its fixed version, the finding whose predicted speedup the pair measures)
PAIRS = (("starved", "fixed", ("dataloader.starved",)),
         ("pageable", "pinned", ("h2d.pageable",)),
         ("sync", "graphed", ("host.launch_bound", "host.sync")))


def log(msg: str) -> None:
    print(f"[gpu-validate {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# -- the workload's progress lines ---------------------------------------------------------------

@dataclass
class Point:
    arrived: float      # wall clock when the line was read
    steps: int
    clock: float        # the workload's own seconds (elapsed=, else t=, else arrival)


def parse_progress(line: str, arrived: float) -> Point | None:
    """'PROGRESS mode=M steps=N elapsed=E ...' (or train_cpu's 't=UNIX steps=N ...') -> Point."""
    if not line.startswith(("PROGRESS", "RESULT")):
        return None
    fields = dict(kv.split("=", 1) for kv in line.split()[1:] if "=" in kv)
    try:
        steps = int(fields["steps"])
        if "elapsed" in fields:
            clock = float(fields["elapsed"])
        elif "t" in fields:
            clock = float(fields["t"])
        else:
            clock = arrived
    except (KeyError, ValueError):
        return None
    return Point(arrived, steps, clock)


def rate_between(points: list[Point], a: float, b: float) -> tuple[float | None, float]:
    """Steps/s between wall-clock a and b, from the workload's own counters: the first and last
    progress lines that arrived in [a, b], widened to the nearest lines outside when fewer than two
    arrived. Returns (rate, seconds the rate spans)."""
    pts = sorted(points, key=lambda p: p.arrived)
    inside = [p for p in pts if a <= p.arrived <= b]
    if len(inside) >= 2:
        s, e = inside[0], inside[-1]
    else:
        before = [p for p in pts if p.arrived < a]
        after = [p for p in pts if p.arrived > b]
        s = before[-1] if before else (inside[0] if inside else None)
        e = after[0] if after else (inside[-1] if inside else None)
    if s is None or e is None or e.steps <= s.steps or e.clock <= s.clock:
        return None, 0.0
    return (e.steps - s.steps) / (e.clock - s.clock), e.clock - s.clock


# -- one mode ------------------------------------------------------------------------------------

@dataclass
class Workload:
    proc: subprocess.Popen
    logfile: Any
    lines: list[tuple[float, str]] = field(default_factory=list)
    points: list[Point] = field(default_factory=list)

    def pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            now = time.time()
            line = line.rstrip("\n")
            self.lines.append((now, line))
            self.logfile.write(f"{now:.3f} {line}\n")
            self.logfile.flush()
            p = parse_progress(line, now)
            if p is not None:
                self.points.append(p)

    def stop(self) -> None:
        """Stop the workload and its DataLoader workers: its own process group, by its id."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
                self.proc.wait(timeout=10)

    def tail(self, n: int = 8) -> str:
        return " | ".join(ln for _t, ln in self.lines[-n:])


def start_workload(argv: list[str], logpath: Path) -> Workload:
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONWARNINGS="ignore")
    fh = open(logpath, "w")
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, start_new_session=True)
    w = Workload(proc, fh)
    threading.Thread(target=w.pump, daemon=True).start()
    return w


def expected_ok(mode: str, finding_ids: list[str]) -> bool | None:
    if mode not in EXPECT:
        return None
    how, ids = EXPECT[mode]
    if how == "is":
        return bool(finding_ids) and finding_ids[0] in ids
    return not any(i in ids for i in finding_ids)


def expectation_text(mode: str) -> str:
    if mode not in EXPECT:
        return "-"
    how, ids = EXPECT[mode]
    return (" or ".join(ids)) if how == "is" else "not " + " / ".join(ids)


def run_mode(mode: str, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    row: dict[str, Any] = {"mode": mode, "expected": expectation_text(mode), "status": "failed"}
    run_s = args.warmup + args.clean + args.duration + 60
    argv = [*args.workload_cmd, mode, str(run_s)]
    log(f"{mode}: starting {' '.join(argv)}")
    w = start_workload(argv, out / "logs" / f"{mode}.workload.txt")
    try:
        t0 = time.time()
        while not w.points:
            if w.proc.poll() is not None:
                row["error"] = f"the workload exited (rc {w.proc.returncode}) before its first progress line: {w.tail()}"
                return row
            if time.time() - t0 > args.start_timeout:
                row["error"] = f"no progress line within {args.start_timeout:g} s: {w.tail()}"
                return row
            time.sleep(0.2)
        row["startup_s"] = round(time.time() - t0, 1)
        time.sleep(args.warmup)
        c0 = time.time()
        time.sleep(args.clean)
        c1 = time.time()
        if w.proc.poll() is not None:
            row["error"] = f"the workload exited during the clean measurement: {w.tail()}"
            return row
        d0 = time.time()
        cmd = [sys.executable, "-m", "trainprobe.agent", "diagnose", "--pid", str(w.proc.pid), "--duration",
               str(args.duration), "--json"]
        if mode in [m.strip() for m in args.keep.split(",") if m.strip()]:
            (out / "kept").mkdir(exist_ok=True)
            cmd += ["--save", str(out / "kept" / f"{mode}.tar.gz"), "--html", str(out / "kept" / f"{mode}.html")]
        log(f"{mode}: {' '.join(cmd[1:])}")
        try:
            p = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=args.duration + 150)
            rc, stdout, stderr = p.returncode, p.stdout, p.stderr
        except subprocess.TimeoutExpired as exc:
            rc, stdout, stderr = None, exc.stdout or "", (exc.stderr or "") + "\n(timed out)"
            stdout = stdout.decode() if isinstance(stdout, bytes) else stdout
            stderr = stderr.decode() if isinstance(stderr, bytes) else stderr
        d1 = time.time()
        time.sleep(0.5)
        (out / "logs" / f"{mode}.diagnose.txt").write_text(f"$ {' '.join(cmd)}\nrc={rc}\n--- stderr\n{stderr}")
        clean, clean_span = rate_between(w.points, c0, c1)
        during, during_span = rate_between(w.points, d0 + 1.0, d0 + args.duration)
        row.update({"steps_per_s": round(clean, 2) if clean else None, "clean_span_s": round(clean_span, 2),
                    "steps_per_s_while_diagnosed": round(during, 2) if during else None,
                    "diagnose_rc": rc, "diagnose_seconds": round(d1 - d0, 1)})
        if clean and during:
            row["measured_slowdown"] = round(1.0 - during / clean, 4)
        if rc != 0 or not stdout.strip():
            row["error"] = f"diagnose exited {rc}: {stderr.strip().splitlines()[-1] if stderr.strip() else 'no output'}"
            return row
        try:
            rep = json.loads(stdout)
        except ValueError as exc:
            row["error"] = f"diagnose printed no JSON: {exc}"
            return row
        (out / "reports" / f"{mode}.json").write_text(json.dumps(rep, indent=1))
        row.update(summarise_report(mode, rep))
        row["status"] = "ok"
        return row
    finally:
        w.stop()
        w.logfile.close()


def summarise_report(mode: str, rep: dict[str, Any]) -> dict[str, Any]:
    findings = rep.get("findings") or []
    ids = [f["id"] for f in findings]
    top = findings[0] if findings else None
    gpu = rep.get("gpu") or {}
    att = gpu.get("idle_attribution") or {}
    probes = {p["name"]: p["status"] + (f" ({p['reason']})" if p.get("reason") else "") for p in rep.get("probes", [])}
    return {
        "findings": [[f["id"], f["expected_speedup"], f["confidence"]] for f in findings],
        "top_finding": top["id"] if top else None,
        "top_speedup": top["expected_speedup"] if top else None,
        "top_confidence": top["confidence"] if top else None,
        "expected_met": expected_ok(mode, ids),
        "gpu_busy": gpu.get("busy_fraction"), "sample_period_s": gpu.get("sample_period_s"),
        "idle_share_by_cause": att.get("idle_share_by_cause"),
        "probes": probes,
        "agent_slowdown_estimate": (rep.get("overhead") or {}).get("target_slowdown_estimate"),
        "agent_cpu_seconds": (rep.get("overhead") or {}).get("agent_cpu_seconds"),
    }


# -- the summary ---------------------------------------------------------------------------------

def pairs(rows: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for slow, fast, fids in PAIRS:
        a, b = rows.get(slow), rows.get(fast)
        if not a or not b:
            continue
        pred = next((f for f in (a.get("findings") or []) if f[0] in fids), None)
        measured = (b["steps_per_s"] / a["steps_per_s"]) if a.get("steps_per_s") and b.get("steps_per_s") else None
        out.append({"from": slow, "to": fast, "finding": pred[0] if pred else " or ".join(fids),
                    "predicted_speedup": pred[1] if pred else None,
                    "measured_speedup": round(measured, 2) if measured else None,
                    "predicted_over_measured": round(pred[1] / measured, 2) if (pred and measured) else None})
    return out


def _f(v: Any, fmt: str = "{:.2f}") -> str:
    return "-" if v is None else fmt.format(v)


def markdown(rows: list[dict[str, Any]], prs: list[dict[str, Any]], facts: dict[str, Any]) -> str:
    lines = ["# trainprobe GPU validation", ""]
    lines.append(" ".join(f"{k}: {v};" for k, v in facts.items() if v is not None).rstrip(";"))
    lines += ["", "| mode | expected | top finding (predicted speedup, confidence) | as expected | GPU busy | "
                  "steps/s | steps/s while diagnosed | measured slowdown |",
              "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r.get("status") != "ok":
            lines.append(f"| {r['mode']} | {r['expected']} | {r.get('status')}: {r.get('error', '')} | no | - | "
                         f"{_f(r.get('steps_per_s'))} | {_f(r.get('steps_per_s_while_diagnosed'))} | - |")
            continue
        top = (f"{r['top_finding']} ({_f(r['top_speedup'])}x, {r['top_confidence']})" if r.get("top_finding")
               else "no finding")
        lines.append(f"| {r['mode']} | {r['expected']} | {top} | {'yes' if r.get('expected_met') else 'NO'} | "
                     f"{_f(r.get('gpu_busy'), '{:.0%}')} | {_f(r.get('steps_per_s'))} | "
                     f"{_f(r.get('steps_per_s_while_diagnosed'))} | {_f(r.get('measured_slowdown'), '{:.1%}')} |")
    if prs:
        lines += ["", "| fix | finding | predicted speedup | measured speedup | predicted / measured |",
                  "|---|---|---|---|---|"]
        for p in prs:
            lines.append(f"| {p['from']} -> {p['to']} | {p['finding']} | {_f(p['predicted_speedup'])}x | "
                         f"{_f(p['measured_speedup'])}x | {_f(p['predicted_over_measured'])} |")
    lines += ["", "Measured speedups: untouched steps/s of the fixed mode over the slow mode's, one run, one node.",
              "steps/s come from each workload's own counters (steps and elapsed time every 50 steps)."]
    return "\n".join(lines) + "\n"


# -- preflight -----------------------------------------------------------------------------------

def preflight(args: argparse.Namespace) -> dict[str, Any]:
    sys.path.insert(0, str(REPO))
    facts: dict[str, Any] = {"python": sys.version.split()[0]}
    from trainprobe.probes.pyspy import pyspy_binary
    spy = pyspy_binary()
    if spy is None:
        raise SystemExit("py-spy not found next to this Python or on PATH: `pip install py_spy-*.whl` first "
                         "(without it GPU idle time cannot be attributed to the host)")
    facts["py_spy"] = spy
    if args.no_preflight:
        return facts
    from trainprobe.probes.support.nvml import Nvml
    try:
        with Nvml() as nv:
            n = nv.call("nvmlDeviceGetCount")
            names = [nv.call("nvmlDeviceGetName", nv.call("nvmlDeviceGetHandleByIndex", i)) for i in range(int(n or 0))]
            facts["driver"] = nv.call("nvmlSystemGetDriverVersion")
            facts["gpus"] = ", ".join(str(x) for x in names)
    except Exception as exc:  # noqa: BLE001
        raise SystemExit(f"NVML is not usable here: {exc}") from None
    probe = [*args.workload_cmd[:1], "-c", "import torch; assert torch.cuda.is_available(), 'torch sees no CUDA GPU'; "
                                           "print(torch.__version__, torch.version.cuda)"]
    try:
        p = subprocess.run(probe, capture_output=True, text=True, timeout=180)
    except subprocess.TimeoutExpired:
        raise SystemExit("importing torch and initialising CUDA took over 180 s") from None
    if p.returncode != 0:
        raise SystemExit("torch cannot use CUDA here: " + (p.stderr.strip().splitlines() or ["?"])[-1])
    facts["torch"] = p.stdout.strip()
    return facts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT") or "gpu-validate-out", help="output directory ($OUT)")
    ap.add_argument("--modes", default=",".join(DEFAULT_MODES), help="comma-separated, run in this order")
    ap.add_argument("--duration", type=float, default=8.0, help="diagnose window, seconds")
    ap.add_argument("--warmup", type=float, default=3.0, help="seconds after the first progress line")
    ap.add_argument("--clean", type=float, default=8.0, help="seconds of untouched steps/s measurement")
    ap.add_argument("--start-timeout", type=float, default=120.0, help="seconds to wait for a first progress line")
    ap.add_argument("--budget", type=float, default=450.0, help="stop starting new modes after this many seconds")
    ap.add_argument("--workload-cmd", default=f"{sys.executable} {WORKLOADS}",
                    help="command that takes MODE SECONDS and prints progress lines (split on spaces)")
    ap.add_argument("--no-preflight", action="store_true", help="skip the NVML and CUDA checks (testing only)")
    ap.add_argument("--keep", default="", help="comma-separated modes whose bundle (--save) and HTML report to keep")
    args = ap.parse_args(argv)
    args.workload_cmd = args.workload_cmd.split()
    out = Path(args.out)
    (out / "reports").mkdir(parents=True, exist_ok=True)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    try:
        facts = preflight(args)
    except SystemExit as exc:
        print(f"gpu-validate: not ready: {exc}", file=sys.stderr)
        (out / "summary.md").write_text(f"# trainprobe GPU validation\n\nnot ready: {exc}\n")
        (out / "summary.json").write_text(json.dumps({"not_ready": str(exc)}, indent=1))
        return 2
    log("node: " + "; ".join(f"{k}={v}" for k, v in facts.items()))
    started = time.time()
    per_mode_s = args.warmup + args.clean + args.duration + 25
    rows: list[dict[str, Any]] = []
    for mode in [m.strip() for m in args.modes.split(",") if m.strip()]:
        left = args.budget - (time.time() - started)
        if left < per_mode_s:
            rows.append({"mode": mode, "expected": expectation_text(mode), "status": "skipped",
                         "error": f"time budget: {left:.0f} s left of {args.budget:g} s"})
            log(f"{mode}: skipped (time budget)")
            continue
        try:
            row = run_mode(mode, args, out)
        except Exception as exc:  # noqa: BLE001 - one broken mode never sinks the run
            row = {"mode": mode, "expected": expectation_text(mode), "status": "failed",
                   "error": f"{type(exc).__name__}: {exc}"}
        rows.append(row)
        log(f"{mode}: {row.get('status')} top={row.get('top_finding')} speedup={row.get('top_speedup')} "
            f"steps/s={row.get('steps_per_s')} as_expected={row.get('expected_met')} {row.get('error', '')}")
    prs = pairs({r["mode"]: r for r in rows if r.get("status") == "ok"})
    facts["seconds"] = round(time.time() - started, 1)
    summary = {"node": facts, "modes": rows, "pairs": prs}
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    md = markdown(rows, prs, facts)
    (out / "summary.md").write_text(md)
    print(md)
    ok = all(r.get("status") == "ok" and r.get("expected_met") is not False for r in rows)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
