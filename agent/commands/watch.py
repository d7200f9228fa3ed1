"""`trainprobe watch`: follow every training process on this node at low cost, export Prometheus
metrics, and run a full diagnosis (kept as a bundle) when a job stays starved."""
from __future__ import annotations

import signal
import threading

import click

from trainprobe.agent.cli import App
from trainprobe.agent.commands import Seconds
from trainprobe.agent.target import EXIT_BAD_INPUT


@click.command("watch")
@click.option("--listen", default="127.0.0.1:9464", show_default=True,
              help="HOST:PORT of the metrics endpoint (localhost by default; '' or 'none' for no endpoint).")
@click.option("--textfile", metavar="PATH", default=None,
              help="Also write the metrics to PATH for node_exporter's textfile collector (atomically, each sample).")
@click.option("--interval", type=Seconds(0.2, 3600), default=5.0, show_default=True,
              help="Seconds between samples.")
@click.option("--trigger", default="gpu-busy<0.5", show_default=True,
              help="When to diagnose: gpu-busy<X (NVML), loop-wait>X or loop-cpu<X (the training thread, /proc).")
@click.option("--for", "hold_s", type=Seconds(0, None), default=300.0, show_default=True,
              help="Seconds the trigger must hold before a diagnosis runs.")
@click.option("--diagnose-seconds", type=Seconds(0.5, 600), default=10.0, show_default=True,
              help="Window of a triggered diagnosis.")
@click.option("--cooldown", type=Seconds(0, None), default=1800.0, show_default=True,
              help="Seconds before the same job may be diagnosed again.")
@click.option("--bundle-dir", default="/var/lib/trainprobe/bundles", show_default=True,
              help="Where triggered diagnoses keep their bundles.")
@click.option("--keep", type=click.IntRange(1, 10000), default=20, show_default=True, help="Bundles kept at most.")
@click.option("--max-disk-mb", type=click.FloatRange(1, None), default=500.0, show_default=True,
              help="Disk the bundles may use in all; the oldest go first.")
@click.option("--pid", "pids", type=int, multiple=True, help="Follow only these root PIDs (default: every training process).")
@click.option("--no-diagnose", is_flag=True, help="Export metrics only; never run a diagnosis.")
@click.option("--duration", type=Seconds(0, None), default=0.0, help="Stop after this long (0: run until stopped).")
@click.pass_obj
def command(app: App, listen: str, textfile: str | None, interval: float, trigger: str, hold_s: float,
            diagnose_seconds: float, cooldown: float, bundle_dir: str, keep: int, max_disk_mb: float,
            pids: tuple[int, ...], no_diagnose: bool, duration: float) -> None:
    """Follow every training process on this node; export Prometheus metrics; diagnose starved jobs."""
    from prometheus_client import start_http_server

    from trainprobe.agent import watch
    from trainprobe.reports import output, watch_metrics

    try:
        watch.parse_trigger(trigger)
    except ValueError as exc:
        raise app.fail(str(exc), EXIT_BAD_INPUT) from None
    why = output.check_path(textfile) if textfile else None
    if why:
        raise app.fail(why, EXIT_BAD_INPUT)
    w = watch.Watcher(interval_s=interval, trigger=trigger, hold_s=hold_s, diagnose_s=diagnose_seconds,
                      cooldown_s=cooldown, bundle_dir=bundle_dir, keep=keep, max_disk_mb=max_disk_mb,
                      only=set(pids) or None, root=app.root, progress=app.progress, diagnose=not no_diagnose)

    registry = watch_metrics.registry(lambda: watch.snapshot(w))
    if listen and listen.lower() != "none":
        host, _, port = listen.rpartition(":")
        try:
            start_http_server(int(port), addr=host or "127.0.0.1", registry=registry)
        except (OSError, ValueError) as exc:
            raise app.fail(f"cannot listen on {listen}: {exc}", EXIT_BAD_INPUT) from None
        app.progress(f"metrics on http://{host or '127.0.0.1'}:{port}/metrics")
    if w.gpus.error:
        app.progress(f"GPU metrics off: {w.gpus.error}")

    def on_sample() -> None:
        if textfile:
            try:
                output.save("watch", "prometheus", watch.snapshot(w), textfile)
            except OSError as exc:
                app.progress(f"cannot write {textfile}: {exc.strerror or exc}")

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    if duration:
        threading.Timer(duration, stop.set).start()
    app.progress(f"watching training processes every {interval:g} s; trigger {trigger} for {hold_s:g} s")
    w.run(stop, on_sample)
    w.gpus.close()
