"""`trainprobe report BUNDLE`: re-diagnose a saved bundle offline and render it (text, JSON, HTML).

The parsers and the rules run again on the bundle's raw captures (agent.diagnosis.report_from),
so a bundle saved on a training node can be read, shared and re-checked anywhere, with no access
to the node or the job.
"""
from __future__ import annotations

from typing import Any

import click

from trainprobe.agent.cli import App, redact_option
from trainprobe.agent.target import EXIT_BAD_INPUT


def check_outputs(app: App, save_path: str | None, html_path: str | None) -> None:
    """Refuse unwritable output paths before a window is spent watching the job."""
    from trainprobe.reports import output

    if save_path:
        from trainprobe.agent import bundle      # tarfile and the bundle rules: only when saving
        try:
            bundle.check_target(save_path)
        except bundle.BundleError as exc:
            raise app.fail(str(exc), EXIT_BAD_INPUT) from None
    if html_path:
        why = output.check_path(html_path)
        if why:
            raise app.fail(why, EXIT_BAD_INPUT)


def write_outputs(app: App, report: dict[str, Any], ev: Any, captures: list, context: dict[str, Any],
                  save_path: str | None, html_path: str | None) -> None:
    if save_path:
        from trainprobe.agent import bundle
        try:
            bundle.save(save_path, captures, context, report)
        except bundle.BundleError as exc:
            raise app.fail(str(exc), EXIT_BAD_INPUT) from None
        app.progress(f"saved the raw evidence to {save_path} (re-diagnose with `trainprobe report {save_path}`)")
    if html_path:
        from trainprobe.agent import visuals
        # The page draws the timeline and flame graphs (visuals) beside the report's findings.
        app.save("report", "html", dict(report, visuals=visuals.build(ev, captures)), html_path, EXIT_BAD_INPUT)
        app.progress(f"wrote the HTML report to {html_path}")


def _finding_ids(report: dict[str, Any] | None) -> list[str]:
    return [f.get("id") for f in (report or {}).get("findings", [])]


@click.command("report")
@click.argument("bundle_path", metavar="BUNDLE")
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON object on stdout.")
@click.option("--html", "html_path", metavar="FILE", default=None,
              help="Also write the report as one self-contained HTML file.")
@redact_option
@click.pass_obj
def command(app: App, bundle_path: str, as_json: bool, html_path: str | None) -> None:
    """Re-diagnose a bundle saved by `diagnose --save`, offline."""
    from trainprobe.agent import bundle, diagnosis
    from trainprobe.reports import output

    check_outputs(app, None, html_path)
    from trainprobe.agent.fleet import jobbundle
    if jobbundle.is_job_bundle(bundle_path):
        from trainprobe.agent.commands.slurm_job import render
        try:
            rep = jobbundle.rediagnose(bundle_path)
        except bundle.BundleError as exc:
            raise app.fail(str(exc), EXIT_BAD_INPUT) from None
        return render(app, rep, as_json, html_path)
    try:
        b = bundle.load(bundle_path)
    except bundle.BundleError as exc:
        raise app.fail(str(exc), EXIT_BAD_INPUT) from None
    if b.context.get("command") == "preflight":
        raise app.fail(f"{bundle_path} is a preflight bundle: judge it with `trainprobe preflight --replay "
                       f"{bundle_path}`", EXIT_BAD_INPUT)
    if not isinstance(b.context.get("window"), dict):
        raise app.fail(f"{bundle_path}: the bundle has no diagnosis window in its context", EXIT_BAD_INPUT)
    notes = b.context.get("session_notes")
    if notes is None:
        # Bundles saved before the session's notes were kept apart from the rules': keep only the
        # session's own lines, the rules make theirs again.
        notes = [n for n in b.notes if n.startswith(("the target exited", "interrupted after"))]
    try:
        rep, ev = diagnosis.report_from(b.captures, b.context, b.overhead, notes)
    except (TypeError, ValueError, KeyError, AttributeError) as exc:   # a context no live run writes
        raise app.fail(f"{bundle_path}: the bundle's context is malformed ({type(exc).__name__}: {exc})",
                       EXIT_BAD_INPUT) from None
    rep["command"] = "report"
    rep["source"] = {"bundle": bundle_path, "saved_unix": b.saved_unix, "saved_by_version": b.tool_version,
                     "live_findings": _finding_ids(b.report) if b.report is not None else None}
    if b.report is not None and _finding_ids(b.report) != _finding_ids(rep):
        rep["notes"].append(f"the live run found {', '.join(_finding_ids(b.report)) or 'nothing'}; re-diagnosed "
                            f"here: {', '.join(_finding_ids(rep)) or 'nothing'} (the rules differ between "
                            f"trainprobe {b.tool_version} and this one)")
    if html_path:
        write_outputs(app, rep, ev, b.captures, b.context, None, html_path)
    output.emit("report", "json" if as_json else "text", rep, app.out)
