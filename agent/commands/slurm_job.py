"""`diagnose --slurm-job JOBID`: one report for a whole Slurm job (the coordinator), and
`diagnose --slurm-local JOBID`: the node agent that srun starts on each node (hidden)."""
from __future__ import annotations

import json
from typing import Any

from trainprobe.agent.cli import App
from trainprobe.agent.target import EXIT_BAD_INPUT, UserError


def run_local(app: App, job_id: str, duration: float, rate: int, only: tuple[str, ...], skip: tuple[str, ...],
              deep: bool, with_captures: bool) -> None:
    from trainprobe.agent.fleet import node
    payload = node.run(job_id, duration, rate, only, skip, deep, with_captures, app.root, app.progress)
    from trainprobe.agent.fleet.fanout import FRAME_BEGIN, FRAME_END
    # One framed line: srun --label cuts long lines into labelled pieces, the coordinator joins them.
    app.out.write(FRAME_BEGIN + json.dumps(payload, separators=(",", ":"), default=str) + FRAME_END + "\n")
    app.out.flush()


def run_job(app: App, job_id: str, nodes: tuple[str, ...], duration: float, rate: int, only: tuple[str, ...],
            skip: tuple[str, ...], deep: bool, as_json: bool, save_path: str | None, html_path: str | None,
            node_timeout: float | None) -> int:
    from trainprobe.agent import bundle
    from trainprobe.agent.fleet import fanout, jobbundle
    from trainprobe.agent.fleet.merge import merge
    from trainprobe.reports import output

    if save_path:
        try:
            jobbundle.check_target(save_path)
        except bundle.BundleError as exc:
            raise app.fail(str(exc), EXIT_BAD_INPUT) from None
    if html_path and output.check_path(html_path):
        raise app.fail(output.check_path(html_path), EXIT_BAD_INPUT)
    try:
        job_nodes = fanout.job_nodes(job_id)
        if nodes:
            extra = [n for n in fanout.expand_hostlist(",".join(nodes)) if n not in job_nodes]
            if extra:
                raise UserError(f"node(s) {', '.join(extra)} are not in job {job_id} (its nodes: "
                                f"{', '.join(job_nodes)})", EXIT_BAD_INPUT)
            wanted = set(fanout.expand_hostlist(",".join(nodes)))
            job_nodes = [n for n in job_nodes if n in wanted]
        # No --rate: each node plans its own sampling within its own budget.
        args = ["--duration", f"{duration:g}", *(["--rate", str(rate)] if rate else []), "--json"]
        if only:
            args += ["--probes", ",".join(only)]
        if skip:
            args += ["--skip", ",".join(skip)]
        if deep:
            args.append("--deep")
        if save_path:
            args.append("--with-captures")
        timeout = node_timeout if node_timeout else duration + fanout.LAUNCH_GRACE_S
        fo = fanout.fan_out(job_id, job_nodes, args, timeout, app.progress)
    except UserError as exc:
        raise app.fail(str(exc), exc.exit_code) from None
    rep = merge(job_id, fo.payloads, duration, nodes=job_nodes, notes=fo.notes)
    rep["fan_out"] = {"seconds": round(fo.seconds, 3), "srun_exit_code": fo.srun_rc, "method": "srun --overlap"}
    if save_path:
        try:
            jobbundle.save(save_path, rep, fo.payloads)
        except bundle.BundleError as exc:
            raise app.fail(str(exc), EXIT_BAD_INPUT) from None
        app.progress(f"saved every node's evidence to {save_path} (re-diagnose with `trainprobe report {save_path}`)")
    render(app, rep, as_json, html_path)
    return rep["exit_code"]


def render(app: App, rep: dict[str, Any], as_json: bool, html_path: str | None) -> None:
    from trainprobe.reports import output

    if html_path:
        app.save("job", "html", rep, html_path, EXIT_BAD_INPUT)
        app.progress(f"wrote the HTML job report to {html_path}")
    output.emit("job", "json" if as_json else "text", rep, app.out)
