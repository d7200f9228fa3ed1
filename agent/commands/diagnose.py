"""`trainprobe diagnose`: attach to a running training process, watch it, print ranked fixes."""
from __future__ import annotations

import math

import click

from trainprobe.agent import schedclass
from trainprobe.agent.cli import App, redact_option
from trainprobe.agent.commands import Seconds
from trainprobe.agent.target import EXIT_INTERRUPTED, EXIT_NOT_PERMITTED, UserError

MAX_WINDOW_S = 600.0


# The windows' figures for one fix differ by more than this (max/min) before the summary pools them: a
# job's phases (loading share, evaluation passes) move one window's split more than its sampling error.
POOL_SPREAD = 1.2


def pooled_fixes(rows: list[dict]) -> dict[str, dict]:
    """Each finding with a fix that at least half of the windows rated: the geometric mean of its
    expected speedup over those windows, with their range."""
    out: dict[str, dict] = {}
    ids = {k for w in rows for k in w.get("speedups") or {}}
    for fid in sorted(ids):
        xs = [w["speedups"][fid] for w in rows if fid in (w.get("speedups") or {})]
        if fid == "compute.bound" or 2 * len(xs) < len(rows) or not all(x > 0 for x in xs):
            continue
        out[fid] = {"windows": len(xs), "geomean": round(math.exp(sum(math.log(x) for x in xs) / len(xs)), 2),
                    "min": min(xs), "max": max(xs)}
    return out


def windows_summary(reports: list[dict]) -> dict:
    """How the verdicts of consecutive windows agree: each window's top finding and trust, and one line;
    where the windows rate one fix differently, that fix's numbers pooled over them (pooled_fixes)."""
    rows = []
    for r in reports:
        top = (r.get("findings") or [None])[0]
        trust = (r.get("window") or {}).get("trust") or {}
        rows.append({"start_unix": (r.get("window") or {}).get("start_unix"),
                     "seconds": (r.get("window") or {}).get("seconds"),
                     "top": top["id"] if top else None,
                     "expected_speedup": top.get("expected_speedup") if top else None,
                     "interval": top.get("expected_speedup_interval") if top else None,
                     "speedups": {f["id"]: f["expected_speedup"] for f in r.get("findings") or []
                                  if f.get("expected_speedup")},
                     "trusted": bool(trust.get("trusted", True)), "reasons": list(trust.get("reasons") or [])})
    tops = [w["top"] for w in rows]
    lead = max(set(tops), key=tops.count) if tops else None
    same = tops.count(lead)
    gains = [w["expected_speedup"] for w in rows if w["top"] == lead and w["expected_speedup"]]
    span = f" ({min(gains):.2f}-{max(gains):.2f}x)" if gains else ""
    name = lead or "no finding"
    untrusted = sum(1 for w in rows if not w["trusted"])
    if same == len(rows):
        verdict = f"all {len(rows)} windows agree: {name}{span}"
    else:
        others = ", ".join(f"{t or 'no finding'} x{tops.count(t)}" for t in sorted(set(tops) - {lead}, key=str))
        verdict = f"{same} of {len(rows)} windows give {name}{span}; the others: {others}"
    if untrusted:
        verdict += f"; {untrusted} window(s) not steady (see window: notes)"
    pooled = pooled_fixes(rows)
    best = max(pooled, key=lambda k: pooled[k]["geomean"], default=None)
    if best is not None and (same < len(rows) or pooled[best]["max"] > POOL_SPREAD * pooled[best]["min"]):
        p = pooled[best]
        verdict += (f"; {best}'s fix over {p['windows']} windows: {p['min']:.2f}-{p['max']:.2f}x, geometric mean "
                    f"{p['geomean']:.2f}x (the windows' split moved: the mean is the steadier figure)")
    return {"n": len(rows), "agree": same == len(rows), "top": lead, "per_window": rows, "pooled": pooled,
            "verdict": verdict}


def _names(value: str | None) -> tuple[str, ...]:
    return tuple(x.strip() for x in (value or "").split(",") if x.strip())


def _settle(app: App, chooser: schedclass.Chooser) -> dict:
    """The agent's class, set once before any thread starts; a class that could not be set is said."""
    first = chooser.decision is None
    d = chooser.settle()
    if first and d.get("not_set"):
        app.progress(f"--priority {d['not_set']}; running at normal priority")
    return d


@click.command("diagnose")
@click.option("--pid", type=int, default=None,
              help="The training process (its DataLoader workers and threads are followed). "
                   "Default: the busiest Python process that loaded torch.")
@click.option("--duration", type=Seconds(0.5, MAX_WINDOW_S), default=10.0, show_default=True,
              help="Seconds to watch.")
@click.option("--rate", type=click.IntRange(1, 500), default=None,
              help="py-spy sampling rate (Hz) for the target and every child, under one sampler. Default: planned "
                   "to keep the whole agent under 1% of the job's CPUs (at most 25 Hz for the training process, "
                   "its DataLoader workers a few at a time at a lower rate; see docs/cost.md).")
@click.option("--windows", type=click.IntRange(1, 20), default=1, show_default=True,
              help="Watch this many consecutive windows of --duration each and report how their verdicts "
                   "agree (the full report is the last window's).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON object on stdout.")
@click.option("--priority", type=click.Choice(schedclass.LEVELS), default="auto", show_default=True,
              help="The CPU scheduling class of the agent and its probes: idle (SCHED_IDLE: the agent runs only "
                   "where no other thread of the node wants the CPU, and preempts none of the job's; on a node "
                   "with no idle CPU its window's samples come late or not at all); normal; low (nice 10); auto: "
                   "idle where at least one of the node's CPUs was idle at start-up, else normal. See docs/cost.md.")
@click.option("--probes", "only", default=None, help="Run only these probes (comma-separated).")
@click.option("--skip", default=None, help="Do not run these probes (comma-separated).")
@click.option("--deep", is_flag=True,
              help="Also run the costly probes: eBPF syscall tracing (its tracepoint tax falls on every process "
                   "of the host while attached; measured and reported) and the GIL sampler (10-20% of one core).")
@click.option("--native", is_flag=True,
              help="Include native frames in py-spy stacks. This needs blocking sampling, which stops the "
                   "target's threads for each sample: use on a job you can afford to slow down.")
@click.option("--save", "save_path", metavar="BUNDLE", default=None,
              help="Also save the raw evidence to BUNDLE (a directory, or an archive when it ends in .tar.gz) "
                   "for `trainprobe report BUNDLE`.")
@click.option("--html", "html_path", metavar="FILE", default=None,
              help="Also write the report as one self-contained HTML file (timeline, flame graphs).")
@click.option("--slurm-job", "slurm_job", metavar="JOBID", default=None,
              help="Diagnose every node of this running Slurm job (srun fans the agent out; one merged job report).")
@click.option("--nodes", default=None, help="With --slurm-job: only these nodes (a Slurm host list).")
@click.option("--slurm-local", "slurm_local", metavar="JOBID", default=None, hidden=True)
@click.option("--with-captures", is_flag=True, hidden=True)
@click.option("--node-timeout", type=float, default=None, hidden=True)
@redact_option
@click.pass_obj
def command(app: App, pid: int | None, duration: float, rate: int | None, windows: int, as_json: bool,
            priority: str, only: str | None,
            skip: str | None, deep: bool, native: bool, save_path: str | None, html_path: str | None,
            slurm_job: str | None = None, nodes: str | None = None, slurm_local: str | None = None,
            with_captures: bool = False, node_timeout: float | None = None) -> None:
    """Attach to a running training process and explain what holds its step back."""
    chooser = schedclass.Chooser(priority)
    if priority != "auto":
        _settle(app, chooser)
    from trainprobe.agent import cost
    cost.note_startup()            # this machine's speed now, for the plan (agent/cost.py)
    from trainprobe.agent import diagnosis
    from trainprobe.agent.commands.report import check_outputs, write_outputs
    from trainprobe.probes.registry import probe_names
    from trainprobe.reports import output

    known = set(probe_names("diagnose"))
    unknown = [n for n in _names(only) + _names(skip) if n not in known]
    if unknown:
        raise click.BadParameter(f"unknown probe(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}",
                                 param_hint="--probes/--skip")
    if windows > 1 and (slurm_local or slurm_job):
        raise click.BadParameter("--windows applies to one process; a Slurm job is diagnosed in one window",
                                 param_hint="--windows")
    if slurm_local or slurm_job:
        _settle(app, chooser)
        from trainprobe.agent.commands import slurm_job as sj
        if slurm_local:
            return sj.run_local(app, slurm_local, duration, rate, _names(only), _names(skip), deep, with_captures)
        code = sj.run_job(app, slurm_job, _names(nodes), duration, rate, _names(only), _names(skip), deep,
                          as_json, save_path, html_path, node_timeout)
        if code:
            raise app.fail(f"no node of job {slurm_job} gave a report", code)
        return
    check_outputs(app, save_path, html_path)
    seen: list[dict] = []
    for i in range(windows):
        if windows > 1:
            app.progress(f"window {i + 1} of {windows}")
        try:
            d = diagnosis.run(pid, duration_s=duration, rate_hz=rate, only=_names(only), skip=_names(skip),
                              native=native, root=app.root, progress=app.progress, deep=deep,
                              settle=lambda: _settle(app, chooser))
        except UserError as exc:
            if not seen:
                raise app.fail(str(exc), exc.exit_code) from None
            app.progress(f"window {i + 1} could not run ({exc}); reporting the {len(seen)} before it")
            d = last
            break
        pid = d.report["target"].get("requested_pid") or d.report["target"].get("pid") or pid
        seen.append(d.report)
        last = d
        if d.exit_code:
            break
    if windows > 1:
        d.report["windows"] = windows_summary(seen)
    write_outputs(app, d.report, d.evidence, d.captures, d.context, save_path, html_path)
    output.emit("report", "json" if as_json else "text", d.report, app.out)
    if d.exit_code == EXIT_INTERRUPTED:
        raise app.fail(f"interrupted after {d.report['window']['seconds']:.1f} s; reported what was gathered",
                       d.exit_code)
    if d.exit_code == EXIT_NOT_PERMITTED:
        reason = next((c.reason for c in d.captures if c.probe == "pyspy"), None)
        raise app.fail(f"not permitted: {reason}", d.exit_code)
    if d.exit_code:
        raise app.fail(f"the target exited before enough evidence was gathered "
                       f"({d.report['window']['seconds']:.1f} s observed)", d.exit_code)
