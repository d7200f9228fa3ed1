"""One click command per module. Heavy imports (bcc, pynvml, torch) stay inside the command."""
from __future__ import annotations

from typing import Any

import click


class Seconds(click.FloatRange):
    """A number of seconds within [lo, hi]; a bad value reads as one, not as click's 'float range'."""

    name = "seconds"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        try:
            return super().convert(value, param, ctx)
        except click.BadParameter:
            lo, hi = self.min, self.max
            span = (f"from {lo:g} to {hi:g}" if hi is not None else f"of at least {lo:g}") if lo is not None else ""
            try:
                float(value)
            except (TypeError, ValueError):
                self.fail(f"{value!r} is not a number of seconds (a number {span}, e.g. 10)".replace("  ", " "),
                          param, ctx)
            self.fail(f"{value} seconds is out of range: give a number {span}", param, ctx)
