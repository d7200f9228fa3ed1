"""`trainprobe flamegraph`: sample a training process with py-spy and write a flame graph.

Sampling is the py-spy probe's (non-blocking, --idle, so a loop blocked on its DataLoader shows
where it waits); --threads and --subprocesses choose the view as py-spy's flags of the same name
do. Formats: an interactive SVG, an HTML page, speedscope JSON, folded stacks. --diff BEFORE
draws the change since a saved profile.
"""
from __future__ import annotations

from typing import Any

import click

from trainprobe.agent.cli import App, redact_option
from trainprobe.agent.commands import Seconds
from trainprobe.agent.target import EXIT_BAD_INPUT, EXIT_INTERRUPTED, EXIT_NOT_PERMITTED, EXIT_TARGET_GONE, UserError
from trainprobe.reports import output

FORMATS = output.formats("profile")
GROUPS = ("function", "line")
EXIT_FAILED = 1


def _split_of(captures: list, threads: bool, subprocesses: bool) -> list[dict[str, Any]]:
    """Each sampled thread's on-CPU / run-queue / off-CPU seconds, from a process capture beside the
    py-spy one (agent/flame_split.py); [] when there is none."""
    from trainprobe.agent import flame_split, profiles
    from trainprobe.probes.process import ProcessProbe
    cap = profiles.pyspy_capture(captures)
    proc = next((c for c in captures if c.probe == "process" and c.status == "ok"
                 and c.artifacts.get("snapshots.json")), None)
    if cap is None or proc is None:
        return []
    try:
        st = profiles.stacks_of(cap)
        ev = ProcessProbe.parse(proc)
    except (profiles.ProfileError, ValueError, KeyError, TypeError):
        return []
    pids = {t.pid for t in st.traces} if subprocesses else {st.main_pid}
    return flame_split.thread_split(ev, st.traces, pids)


def sample(app: App, pid: int | None, duration: float, rate: int, native: bool, threads: bool,
           subprocesses: bool) -> tuple[dict[str, int], str, str, bool, list[dict[str, Any]]]:
    """Run the py-spy probe (and the process probe, for each thread's time on and off a CPU) over one
    window -> (profile, title, subtitle, interrupted, per-thread split)."""
    from trainprobe.agent import profiles
    from trainprobe.agent.session import run_session
    from trainprobe.agent.target import resolve
    from trainprobe.probes.base import WatchSpec
    from trainprobe.probes.process import ProcessProbe
    from trainprobe.probes.pyspy import PySpyProbe
    from trainprobe.probes.support.target import is_alive

    try:
        info = resolve(pid, app.root).info
    except UserError as exc:
        raise app.fail(str(exc), exc.exit_code) from None
    if native:
        app.progress("--native: py-spy samples in blocking mode and stops the target's threads for every sample")
    spec = WatchSpec(pid=info.pid, window_s=duration, rate_hz=rate, child_pids=tuple(info.children), native=native,
                     root=app.root)
    result = run_session(spec, [PySpyProbe(), ProcessProbe()], app.progress,
                         target_alive=lambda: is_alive(info.pid, app.root))
    cap = next(c for c in result.captures if c.probe == "pyspy")
    gone = not is_alive(info.pid, app.root)
    if cap.status != "ok" or not cap.artifacts.get("chrometrace.json"):
        reason = cap.reason or "py-spy gathered nothing"
        if result.interrupted:
            raise app.fail(f"interrupted before py-spy gathered anything ({reason})", EXIT_INTERRUPTED)
        denied = cap.meta.get("error_kind") == "permission_denied" or "ermi" in reason or "sudo" in reason
        code = EXIT_TARGET_GONE if gone else (EXIT_NOT_PERMITTED if denied else EXIT_FAILED)
        raise app.fail(f"py-spy could not sample PID {info.pid}: {reason}", code)
    prof = profiles.process_profile(profiles.stacks_of(cap), threads=threads, subprocesses=subprocesses)
    if not prof:
        saw = f"py-spy saw no Python stack in PID {info.pid} over {result.observed_s:.1f} s"
        if result.interrupted:
            raise app.fail(f"interrupted before py-spy gathered anything ({saw})", EXIT_INTERRUPTED)
        raise app.fail(saw, EXIT_TARGET_GONE if gone else EXIT_FAILED)
    mode = "blocking" if native else "non-blocking"
    view = ("all processes" if subprocesses else "main process") + (", one root per thread" if threads else
                                                                       ", threads merged")
    title = f"PID {info.pid}: {info.cmdline[:90]}"
    sub = (f"{result.observed_s:.1f} s window, py-spy {mode} --idle at {rate} Hz, {view}; "
           f"counts are microseconds of wall-clock time")
    return prof, title, sub, result.interrupted, _split_of(result.captures, threads, subprocesses)


@click.command("flamegraph")
@click.option("--pid", type=int, default=None,
              help="The training process. Default: the busiest Python process that loaded torch.")
@click.option("--input", "input_path", metavar="PROFILE", default=None,
              help="Draw a saved profile instead of sampling: a bundle, folded stacks, speedscope JSON or a "
                   "py-spy chrometrace.")
@click.option("--duration", type=Seconds(0.5, 600.0), default=10.0, show_default=True,
              help="Seconds to sample.")
@click.option("--rate", type=click.IntRange(1, 500), default=25, show_default=True, help="Samples per second.")
@click.option("-o", "--output", "output_path", metavar="FILE", default=None, help="Write here (default: stdout).")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default=None,
              help="Output format. Default: from the extension of -o (.svg .html .json .folded), else svg.")
@click.option("--threads", is_flag=True, help="One root per thread instead of merging the threads.")
@click.option("--subprocesses", is_flag=True, help="Include child processes (DataLoader workers), one root each.")
@click.option("--native", is_flag=True,
              help="Include native frames. Needs blocking sampling, which stops the target's threads for each "
                   "sample: use on a job you can afford to slow down.")
@click.option("--diff", "diff_path", metavar="BEFORE", default=None,
              help="Differential flame graph against BEFORE (folded stacks, speedscope JSON, a bundle): red where "
                   "a frame's share of the time grew, blue where it shrank.")
@click.option("--group", type=click.Choice(GROUPS), default="function", show_default=True,
              help="One box per function (the lines of a function merged, as py-spy's --nolineno), or one per "
                   "line number as sampled.")
@click.option("--title", default=None, help="Title of the graph.")
@redact_option
@click.pass_obj
def command(app: App, pid: int | None, input_path: str | None, duration: float, rate: int, output_path: str | None,
            fmt: str | None, threads: bool, subprocesses: bool, native: bool, diff_path: str | None,
            group: str, title: str | None) -> None:
    """Sample a training process and write its flame graph (SVG, HTML, speedscope or folded).

    Blue frames waited in a blocking call; bars above the graph split each thread's time into on
    a CPU, waiting for a CPU and off-CPU, as the kernel measured it (SVG and HTML)."""
    from trainprobe.agent import flame_split, profiles

    fmt = output.format_for("profile", fmt, output_path, default="svg")
    if pid is not None and input_path:
        raise app.fail("give either --pid (sample a process) or --input (draw a saved profile), not both",
                       EXIT_BAD_INPUT)
    if diff_path and fmt == "speedscope":
        raise app.fail("--diff draws a differential flame graph: use --format svg, html, or folded "
                       "(two counts per line)", EXIT_BAD_INPUT)
    if output_path:
        why = output.check_path(output_path)
        if why:
            raise app.fail(why, EXIT_BAD_INPUT)
    before = None
    before_desc = ""
    if diff_path:
        try:
            before, before_desc = profiles.load_profile(diff_path, threads, subprocesses)
        except profiles.ProfileError as exc:
            raise app.fail(f"--diff: {exc}", EXIT_BAD_INPUT) from None
    if input_path:
        try:
            prof, desc = profiles.load_profile(input_path, threads, subprocesses)
        except profiles.ProfileError as exc:
            raise app.fail(f"--input: {exc}", EXIT_BAD_INPUT) from None
        graph_title, sub, interrupted = f"Flame graph of {desc}", "", False
        split = _bundle_split(input_path, threads, subprocesses)
    else:
        prof, graph_title, sub, interrupted, split = sample(app, pid, duration, rate, native, threads, subprocesses)
    if title:
        graph_title = title
    if before is not None:
        sub = (sub + "; " if sub else "") + f"before: {before_desc}"
    from trainprobe.probes.parsers import redact
    doc: output.ProfileDoc = {"profile": prof, "title": redact.text(graph_title), "subtitle": redact.text(sub),
                              "unit": profiles.UNIT, "before": before, "exporter": f"trainprobe@{_version()}",
                              "group": group, "waiting": flame_split.waiting_part(prof) if before is None else None,
                              "threads": [dict(t, name=redact.text(t["name"])) for t in split]}
    if output_path:
        app.save("profile", fmt, doc, output_path, EXIT_BAD_INPUT)
        app.progress(f"wrote {fmt} to {output_path}: {len(prof)} distinct stacks, {sum(prof.values()) / 1e6:.2f} s")
    else:
        output.emit("profile", fmt, doc, app.out)
        if hasattr(app.out, "flush"):
            app.out.flush()
    if interrupted:
        raise app.fail("interrupted: drew what was sampled until then", EXIT_INTERRUPTED)


def _bundle_split(path: str, threads: bool, subprocesses: bool) -> list[dict[str, Any]]:
    """The per-thread split of a saved bundle's window ([] for any other saved profile)."""
    from trainprobe.agent import bundle
    try:
        if not bundle.is_bundle(path):
            return []
        return _split_of(bundle.load(path).captures, threads, subprocesses)
    except (bundle.BundleError, OSError, ValueError):
        return []


def _version() -> str:
    from trainprobe.agent import __version__
    return __version__
