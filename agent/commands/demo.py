"""`trainprobe demo`: diagnose a bundled starved training job, apply the fix, measure it.

1. start the bundled CPU workload (agent/workloads/train_cpu.py) with num_workers=0;
2. measure its steps/s with nothing attached;
3. diagnose it and print the report;
4. restart it with the DataLoader settings the top finding proposes, measure again;
5. print the predicted and the measured speedup side by side (and diagnose the fixed job).
"""
from __future__ import annotations

import ctypes
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import click

from trainprobe.agent.cli import App
from trainprobe.agent.commands import Seconds

WORKLOAD = "trainprobe.agent.workloads.train_cpu"


@dataclass
class Job:
    args: list[str]
    proc: subprocess.Popen
    progress: list[tuple[float, int]] = field(default_factory=list)   # (unix time, cumulative steps)
    tail: list[str] = field(default_factory=list)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def steps_per_s(self, t_from: float, t_to: float) -> float | None:
        pts = [(t, n) for t, n in self.progress if t_from <= t <= t_to]
        if len(pts) < 2:
            return None
        (t0, n0), (t1, n1) = pts[0], pts[-1]
        return (n1 - n0) / (t1 - t0) if t1 > t0 else None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _die_with_parent() -> None:
    try:
        ctypes.CDLL("libc.so.6").prctl(1, signal.SIGKILL)   # PR_SET_PDEATHSIG: never outlive the demo
    except OSError:
        pass


def start_job(args: list[str]) -> Job:
    proc = subprocess.Popen([sys.executable, "-u", "-W", "ignore", "-m", WORKLOAD, "--seconds", "0", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=_die_with_parent)
    job = Job(args, proc)

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            line = line.rstrip("\n")
            job.tail = (job.tail + [line])[-20:]
            if line.startswith("PROGRESS"):
                kv = dict(x.split("=", 1) for x in line.split()[1:])
                job.progress.append((float(kv["t"]), int(kv["steps"])))

    threading.Thread(target=pump, daemon=True).start()
    return job


def wait_progress(job: Job, n: int, timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while len(job.progress) < n:
        if job.proc.poll() is not None:
            raise click.ClickException("the demo workload exited early:\n" + "\n".join(job.tail))
        if time.monotonic() > deadline:
            raise click.ClickException("the demo workload did not start in time:\n" + "\n".join(job.tail))
        time.sleep(0.1)


def measure(job: Job, seconds: float) -> tuple[float, float]:
    """Mean steps/s over `seconds`, and the spread (max-min over mean) of its 1 s intervals."""
    wait_progress(job, 2)
    t0 = time.time()
    time.sleep(seconds)
    t1 = time.time()
    rate = job.steps_per_s(t0 - 0.01, t1 + 0.01)
    if rate is None:
        raise click.ClickException("could not measure the demo workload's steps/s")
    pts = [(t, n) for t, n in job.progress if t0 - 0.01 <= t <= t1 + 0.01]
    rates = [(n1 - n0) / (t1_ - t0_) for (t0_, n0), (t1_, n1) in zip(pts, pts[1:]) if t1_ > t0_]
    spread = (max(rates) - min(rates)) / rate if len(rates) >= 2 and rate > 0 else 0.0
    return rate, spread


def workload_args(kwargs: dict[str, Any]) -> list[str]:
    args = ["--num-workers", str(int(kwargs.get("num_workers", 0)))]
    if kwargs.get("pin_memory"):
        args.append("--pin-memory")
    if kwargs.get("persistent_workers"):
        args.append("--persistent-workers")
    if kwargs.get("prefetch_factor"):
        args += ["--prefetch-factor", str(int(kwargs["prefetch_factor"]))]
    return args


@click.command("demo")
@click.option("--duration", type=Seconds(2.0, 120.0), default=8.0, show_default=True,
              help="Diagnosis window (s).")
@click.option("--measure", "measure_s", type=Seconds(2.0, 120.0), default=6.0, show_default=True,
              help="Seconds of steps/s measurement before and after the fix.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary (with both reports) on stdout.")
@click.option("--no-rediagnose", is_flag=True, help="Do not diagnose the fixed job.")
@click.pass_obj
def command(app: App, duration: float, measure_s: float, as_json: bool, no_rediagnose: bool) -> None:
    """Diagnose a bundled starved training job, apply the proposed fix, and compare prediction and measurement."""
    from trainprobe.agent import diagnosis
    from trainprobe.agent.target import UserError
    from trainprobe.reports import output

    out = app.out
    say = app.progress
    summary: dict[str, Any] = {"workload": f"python -m {WORKLOAD}"}
    say("starting the bundled training job: a small MLP on the CPU, DataLoader(num_workers=0) with a "
        "costly per-sample transform")
    job = start_job(["--num-workers", "0"])
    try:
        wait_progress(job, 2)
        say(f"measuring its speed for {measure_s:g} s with nothing attached ...")
        before, before_spread = measure(job, measure_s)
        summary["before"] = {"args": job.args, "steps_per_s": round(before, 2), "spread": round(before_spread, 3)}
        say(f"before: {before:.1f} steps/s; diagnosing PID {job.pid} ...")
        try:
            d = diagnosis.run(job.pid, duration_s=duration, progress=say)
        except UserError as exc:
            raise app.fail(str(exc), exc.exit_code) from None
        summary["report"] = d.report
        if not as_json:
            output.emit("report", "text", d.report, out)
    finally:
        job.stop()
    top = next((f for f in d.report["findings"] if f["id"] == "dataloader.starved"), None)
    if top is None or not top.get("details", {}).get("dataloader_kwargs"):
        msg = "trainprobe did not propose DataLoader settings for the demo job: nothing to compare"
        if as_json:
            summary["result"] = msg
            output.emit("demo", "json", summary, out)
        else:
            out.write("\n" + msg + "\n")
        raise click.exceptions.Exit(1)
    kwargs = top["details"]["dataloader_kwargs"]
    predicted = float(top["expected_speedup"])
    fixed_args = workload_args(kwargs)
    say("restarting the job with " + ", ".join(f"{k}={v}" for k, v in kwargs.items()) + " ...")
    job2 = start_job(fixed_args)
    try:
        wait_progress(job2, 2)
        after, after_spread = measure(job2, measure_s)
        summary["after"] = {"args": job2.args, "steps_per_s": round(after, 2), "spread": round(after_spread, 3)}
        if not no_rediagnose:
            say(f"after: {after:.1f} steps/s; diagnosing the fixed job ...")
            d2 = diagnosis.run(job2.pid, duration_s=max(3.0, duration / 2), progress=say)
            summary["report_after"] = d2.report
    finally:
        job2.stop()
    measured = after / before if before > 0 else float("nan")
    summary.update({"predicted_speedup": predicted, "measured_speedup": round(measured, 3),
                    "prediction_error": round(predicted / measured - 1.0, 3) if measured else None})
    if as_json:
        output.emit("demo", "json", summary, out)
        return
    label = ", ".join(f"{k}={v}" for k, v in kwargs.items())
    out.write("\n")
    out.write(f"  before   DataLoader(num_workers=0)                 {before:7.1f} steps/s\n")
    out.write(f"  after    DataLoader({label}){'':<{max(0, 30 - len(label))}}  {after:7.1f} steps/s\n")
    out.write(f"  measured speedup   {measured:.2f}x\n")
    iv = top.get("expected_speedup_interval") or [predicted, predicted]
    out.write(f"  predicted speedup  {predicted:.2f}x   (trainprobe's estimate, likely {iv[0]:.2f}-{iv[1]:.2f}x; "
              f"{100 * (predicted / measured - 1):+.0f}% vs measured)\n")
    if before_spread > 0.15 or after_spread > 0.15:
        out.write("  note: steps/s varied by more than 15% within a measurement: something else on this host "
                  "is using the CPUs, so both figures are noisy\n")
    if "report_after" in summary:
        fs = summary["report_after"]["findings"]
        if fs:
            f0 = fs[0]
            fix = f0["fixes"][0]["title"] if f0.get("fixes") else "no host-side fix"
            out.write(f"\n  diagnosing the fixed job: {f0['id']} ({f0['expected_speedup']:.2f}x): {f0['title']}\n"
                      f"    next: {fix}\n")
        else:
            out.write("\n  diagnosing the fixed job: no finding\n")
    out.write("\n  Run it on your own job:  sudo trainprobe diagnose --pid <PID>\n")
