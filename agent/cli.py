"""The `trainprobe` command line. One command per module in agent/commands; this file wires them.

Bad input gets one line on stderr and an exit code; never a traceback (set TRAINPROBE_DEBUG=1 to
see one for an internal error).
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from typing import TextIO

import click

from agent import __version__

COMMANDS = (
    ("agent.commands.diagnose", "diagnose"),
    ("agent.commands.demo", "demo"),
    ("agent.commands.preflight", "preflight"),
    ("agent.commands.flamegraph", "flamegraph"),
    ("agent.commands.report", "report"),
    ("agent.commands.watch", "watch"),
)


@dataclass
class App:
    """What every command shares, passed through click's context."""

    out: TextIO = field(default_factory=lambda: sys.stdout)
    err: TextIO = field(default_factory=lambda: sys.stderr)
    root: str = "/"
    quiet: bool = False

    def progress(self, msg: str) -> None:
        if not self.quiet:
            print(f"trainprobe: {msg}", file=self.err, flush=True)

    def fail(self, msg: str, code: int) -> "click.exceptions.Exit":
        print(f"trainprobe: {msg}", file=self.err, flush=True)
        return click.exceptions.Exit(code)


class LazyGroup(click.Group):
    """Imports a command's module only when that command runs, so --help stays instant."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [name for _mod, name in COMMANDS]

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        for mod, cmd in COMMANDS:
            if cmd == name:
                import importlib
                return getattr(importlib.import_module(mod), "command")
        return None


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="trainprobe")
@click.option("-q", "--quiet", is_flag=True, help="No progress on stderr.")
@click.pass_context
def main(ctx: click.Context, quiet: bool) -> None:
    """Host-side diagnostics for ML training nodes: why is the GPU (or the step) waiting on the host?"""
    ctx.obj = App(root=os.environ.get("TRAINPROBE_ROOT", "/"), quiet=quiet)


def run() -> None:
    try:
        main(standalone_mode=True)
    except KeyboardInterrupt:
        print("trainprobe: interrupted", file=sys.stderr)
        sys.exit(130)
    except SystemExit:
        raise
    except Exception as exc:  # noqa: BLE001 - the last line of defence against a traceback
        if os.environ.get("TRAINPROBE_DEBUG"):
            raise
        print(f"trainprobe: internal error: {type(exc).__name__}: {exc} (TRAINPROBE_DEBUG=1 shows the traceback)",
              file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    run()
