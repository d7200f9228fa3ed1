"""Every command's --help reads as written (no printf escapes), and a bad number of seconds says so."""
from __future__ import annotations

import pytest

from tests.helpers import run_cli

COMMANDS = ("diagnose", "demo", "preflight", "flamegraph", "report", "watch")


@pytest.mark.parametrize("cmd", COMMANDS)
def test_help_has_no_printf_escapes(cmd):
    r = run_cli(cmd, "--help")
    assert r.rc == 0, r.err
    assert "%%" not in r.out
    assert "float range" not in r.out


def test_help_states_the_cost_with_a_plain_percent():
    out = run_cli("diagnose", "--help").out
    assert "under 1% of the job's CPUs" in " ".join(out.split())


@pytest.mark.parametrize("args,said", [
    (("diagnose", "--pid", "1", "--duration", "abc"), "'abc' is not a number of seconds (a number from 0.5 to 600"),
    (("diagnose", "--pid", "1", "--duration", "0.1"), "0.1 seconds is out of range: give a number from 0.5 to 600"),
    (("flamegraph", "--pid", "1", "--duration", "x"), "'x' is not a number of seconds"),
    (("watch", "--interval", "soon"), "'soon' is not a number of seconds"),
])
def test_a_bad_duration_is_one_line_of_bad_input(args, said):
    r = run_cli(*args)
    assert r.rc == 2
    assert said in r.err and "float range" not in r.err and "Traceback" not in r.err
