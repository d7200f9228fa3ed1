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

from trainprobe.agent import __version__

COMMANDS = (
    ("trainprobe.agent.commands.diagnose", "diagnose"),
    ("trainprobe.agent.commands.demo", "demo"),
    ("trainprobe.agent.commands.preflight", "preflight"),
    ("trainprobe.agent.commands.flamegraph", "flamegraph"),
    ("trainprobe.agent.commands.report", "report"),
    ("trainprobe.agent.commands.watch", "watch"),
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
            print(f"trainprobe: {_safe(msg)}", file=self.err, flush=True)

    def fail(self, msg: str, code: int) -> "click.exceptions.Exit":
        print(f"trainprobe: {_safe(msg)}", file=self.err, flush=True)
        return click.exceptions.Exit(code)

    def save(self, kind: str, fmt: str, doc: object, path: str, code: int) -> None:
        """Write one output form to the file `path` (reports.output); failing that, exit `code`."""
        from trainprobe.reports import output
        try:
            output.save(kind, fmt, doc, path)
        except OSError as exc:
            raise self.fail(f"cannot write {path}: {exc.strerror or exc}", code) from None


def _safe(msg: str) -> str:
    """A message may quote the target (its command line, a frame): redacted and escaped."""
    from trainprobe.probes.parsers import redact
    from trainprobe.reports.output import terminal_safe
    return terminal_safe(redact.text(str(msg)))


def _set_redact(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> tuple[str, ...]:
    from trainprobe.probes.parsers import redact
    try:
        redact.configure(value)
    except redact.RedactPatternError as exc:
        raise click.BadParameter(str(exc), ctx=ctx, param=param) from None
    return value


# `--redact REGEX` (repeatable) for every command that reads a target or a bundle. It is applied
# where data enters trainprobe (probes.parsers.redact), before any probe runs: eager, and kept by the
# redact module for this process rather than passed along as a value.
redact_option = click.option(
    "--redact", metavar="REGEX", multiple=True, expose_value=False, is_eager=True, callback=_set_redact,
    help="Also hide what matches REGEX (Python syntax; repeatable) in every output. Credentials in option "
         "values, NAME=value pairs and URLs are always hidden.")


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


EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130


def run(args: list[str] | None = None) -> None:
    """The exit-code contract at every point in time: 0, 1 (failed), 2 (bad input), 3 (target gone),
    4 (not permitted), 130 (Ctrl-C, wherever it lands: never click's "Aborted!")."""
    sys.exit(_run(args))


def _run(args: list[str] | None) -> int:
    try:
        rc = main(args=args, standalone_mode=False)
        return rc if isinstance(rc, int) else 0
    except (KeyboardInterrupt, click.exceptions.Abort) as exc:
        if isinstance(exc, click.exceptions.Abort) and isinstance(exc.__context__, EOFError):
            print("trainprobe: end of input", file=sys.stderr)
            return EXIT_BAD_INPUT
        print("\ntrainprobe: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.ClickException as exc:
        exc.show()
        # A usage error is bad input (2), except where a command maps it to its own code
        # (preflight: 3, Nagios UNKNOWN, so a typo never reads as a critical node).
        return exc.exit_code if isinstance(exc, click.UsageError) and exc.exit_code != 2 else EXIT_BAD_INPUT
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else EXIT_FAILED)
    except BrokenPipeError:
        return EXIT_FAILED
    except Exception as exc:  # noqa: BLE001 - the last line of defence against a traceback
        if os.environ.get("TRAINPROBE_DEBUG"):
            raise
        print(f"trainprobe: internal error: {type(exc).__name__}: {_safe(str(exc))} "
              "(TRAINPROBE_DEBUG=1 shows the traceback)", file=sys.stderr)
        return EXIT_FAILED


if __name__ == "__main__":
    run()
