"""`trainprobe preflight`: node health before a job starts, with scheduler-friendly exit codes."""
from __future__ import annotations

import json
import os
import sys
import time

import click

from trainprobe.agent.cli import App
from trainprobe.agent.commands import Seconds

BAD_INPUT = 3  # Nagios UNKNOWN: a usage error must never read as "critical" (2) to a scheduler
PASSIVE_DEADLINE_S = 45.0  # well inside the 60 s after which Slurm kills a HealthCheckProgram


class _PreflightCommand(click.Command):
    """click exits 2 on a usage error; here 2 means "critical", so usage errors exit 3."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as exc:
            exc.exit_code = BAD_INPUT
            raise

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except click.UsageError as exc:
            exc.exit_code = BAD_INPUT
            raise


def _indices(value: str | None, what: str) -> list[int] | None:
    if value is None or value.strip() == "":
        return None
    from trainprobe.probes.parsers.procfs import parse_cpulist
    try:
        return parse_cpulist(value)
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a list like 0,1 or 0-3", param_hint=what) from None


@click.command("preflight", cls=_PreflightCommand)
@click.option("--profile", "profile_name", default=None, metavar="NAME|FILE",
              help="Expectations for this node type: a built-in name (default, h200-1gpu, h200-8gpu) or a "
                   "TOML/JSON file. Default: the built-in default profile.")
@click.option("--active", is_flag=True,
              help="Also run the active GPU tier: a matmul checked against the CPU, the bf16 GEMM rate and pinned "
                   "copy bandwidth on each GPU (needs torch with CUDA; a few seconds per GPU, at full load).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON object (one record per check).")
@click.option("--prometheus", "prom_file", default=None, metavar="FILE",
              help="Write the results in node_exporter textfile format (atomically) to FILE.")
@click.option("--slurm", is_flag=True,
              help="Slurm prolog / HealthCheckProgram mode: exit non-zero only when a check is critical, and print "
                   "one line (the drain reason, prefixed 'trainprobe:') on stdout.")
@click.option("--save", "save_path", default=None, metavar="BUNDLE",
              help="Also save the probes' captures (every read, with where it came from) to BUNDLE (a directory, or "
                   "an archive when it ends in .tar.gz), for --replay.")
@click.option("--save-raw", "save_raw", default=None, metavar="FILE",
              help="Save everything that was read (host, NVML, active measurements) as one JSON file, for --replay.")
@click.option("--replay", "replay_file", default=None, metavar="BUNDLE|FILE",
              help="Judge the reads saved in BUNDLE (by --save) or FILE (by --save-raw) with this trainprobe's "
                   "checks and the profile given now, instead of reading this host.")
@click.option("--disk", "disks", multiple=True, metavar="PATH",
              help="Also check free space on PATH (repeatable); the profile lists / and /tmp.")
@click.option("--gpus", default=None, metavar="LIST",
              help="GPU indices to check (NVML order, e.g. 0,1 or 0-3). Default: all; with --slurm, "
                   "SLURM_JOB_GPUS when it is set.")
@click.option("--cpus", default=None, metavar="LIST",
              help="CPUs the job may use, for the GPU NUMA-affinity check. Default: this process's affinity.")
@click.option("--skip", multiple=True, metavar="CHECK",
              help="Skip a check id or prefix (repeatable): --skip host.thp --skip 'trainprobe.*'.")
@click.option("--timeout", "timeout_s", type=Seconds(1.0, 3600.0), default=None, metavar="SECONDS",
              help="Overall deadline in seconds; each read also has its own timeout from the profile. Default: 45 "
                   "(Slurm kills a HealthCheckProgram after 60 s), plus the active tier's budget with --active.")
@click.option("-v", "--verbose", is_flag=True, help="Explain every check, not only the problems.")
@click.pass_obj
def command(app: App, profile_name: str | None, active: bool, as_json: bool, prom_file: str | None, slurm: bool,
            save_path: str | None, save_raw: str | None, replay_file: str | None, disks: tuple[str, ...],
            gpus: str | None, cpus: str | None, skip: tuple[str, ...], timeout_s: float | None, verbose: bool) -> None:
    """Check that this node is fit to run a training job, before the job starts.

    Exit codes: 0 ok, 1 warn, 2 critical, 3 unknown (or bad input). With --slurm: 0 unless a check is
    critical (then 2). Checks whose reads hang are reported as timed out, never waited for.
    """
    from trainprobe.agent.preflight import profile as profiles
    from trainprobe.agent.preflight import report as preport
    from trainprobe.agent.preflight.engine import Context
    from trainprobe.agent.preflight.runner import load_replay, run
    from trainprobe.probes.errors import BadInput

    t0 = time.monotonic()
    if save_path and replay_file:
        raise click.UsageError("--save saves what this host reads: it cannot be given with --replay")
    try:
        prof = profiles.load(profile_name)
        replay = load_replay(replay_file) if replay_file else None
    except BadInput as exc:
        raise app.fail(str(exc), BAD_INPUT) from None
    _check_save(app, save_path)
    gpu_list = _indices(gpus, "--gpus")
    if gpu_list is None and slurm and os.environ.get("SLURM_JOB_GPUS"):
        gpu_list = _indices(os.environ["SLURM_JOB_GPUS"], "SLURM_JOB_GPUS")
    job_cpus = _indices(cpus, "--cpus")
    disk_paths = list(dict.fromkeys(list(prof["host"]["disk_paths"]) + list(disks)))
    tiers = ("host", "gpu") + (("active",) if active else ())
    ctx = Context(profile=prof, root=app.root, disk_paths=disk_paths, job_cpus=job_cpus, gpus=gpu_list,
                  progress=app.progress if not slurm else (lambda msg: None))
    if timeout_s is None:
        t = prof["timeouts"]
        n_gpus = len(gpu_list) if gpu_list else 8
        timeout_s = PASSIVE_DEADLINE_S + (float(t["active_s"]) + float(t["active_per_gpu_s"]) * n_gpus if active else 0)
    result = run(ctx, tiers, skip=list(skip), deadline_s=timeout_s, replay=replay)
    raw, records, abandoned = result.raw, result.records, result.abandoned
    rep = preport.build(raw, records, prof, slurm, time.monotonic() - t0, replayed_from=replay_file)
    _save(app, save_path, result, rep)

    if save_raw:
        try:
            from trainprobe.reports import output
            output.write(save_raw, json.dumps(raw, indent=1, default=str) + "\n", private=True)
        except OSError as exc:
            raise app.fail(f"cannot write {save_raw}: {exc.strerror}", BAD_INPUT) from None
    if prom_file:
        app.save("preflight", "prometheus", rep, prom_file, BAD_INPUT)
    from trainprobe.reports import output
    if slurm:
        line = rep["drain_reason"] or _slurm_summary(rep)
        if as_json:
            output.emit("preflight", "json", rep, app.out)
            print(line, file=app.err)
        else:
            if verbose:
                output.emit("preflight", "text-verbose", rep, app.err)
            print(line, file=app.out)
    else:
        output.emit("preflight", "json" if as_json else "text-verbose" if verbose else "text", rep, app.out)
    code = rep["exit_code"]
    if abandoned:
        # A read is stuck in the kernel or the driver: do not let interpreter shutdown wait on it.
        for s in (app.out, app.err, sys.stdout, sys.stderr):
            try:
                s.flush()
            except Exception:  # noqa: BLE001
                pass
        os._exit(code)
    if code:
        raise click.exceptions.Exit(code)


def _check_save(app: App, path: str | None) -> None:
    """Refuse an unwritable bundle path before anything is read."""
    from trainprobe.agent import bundle

    if path:
        try:
            bundle.check_target(path)
        except bundle.BundleError as exc:
            raise app.fail(str(exc), BAD_INPUT) from None


def _save(app: App, path: str | None, result, rep: dict) -> None:
    from trainprobe.agent import bundle
    from trainprobe.agent.preflight.runner import bundle_context

    if not path:
        return
    try:
        bundle.save(path, result.captures, bundle_context(result.raw), rep)
    except bundle.BundleError as exc:
        raise app.fail(str(exc), BAD_INPUT) from None
    app.progress(f"saved the reads to {path} (judge them again with `trainprobe preflight --replay {path}`)")


def _slurm_summary(rep: dict) -> str:
    others = [c["check"] + (f"[{c['target']}]" if c.get("target") else "")
              for c in rep["checks"] if c["status"] in ("warn", "unknown") and not c.get("informational")]
    text = f"trainprobe: node {rep['status']}" + (f" ({', '.join(others)})" if others else "")
    return text if len(text) <= 200 else text[:197] + "..."
