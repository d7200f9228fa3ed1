"""`diagnose --windows N` watches N consecutive windows of a real job and says how their verdicts agree;
a window whose job changed pace, whose CPU pressure moved, or that has too few samples says so."""
from __future__ import annotations

import pytest

from tests.helpers import run_cli, start_workload
from trainprobe.agent.combiners.window_trust import window_trust
from trainprobe.agent.commands.diagnose import windows_summary


class Ev:
    def __init__(self, data):
        self.data = data

    def get(self, name):
        return self.data.get(name)


def spy(timeline, rate=100, t0=0.0, t1=10.0):
    return {"rate_hz": rate, "timeline": timeline,
            "training_thread": {"seconds": t1 - t0, "observed_from": t0, "observed_to": t1}}


def steady(t0=0.0, t1=10.0, period=0.5, wait=0.2):
    out, t = [], t0
    while t + period <= t1 + 1e-9:
        out += [[t, t + wait, "data_wait"], [t + wait, t + period, "forward"]]
        t += period
    return out


def test_a_steady_window_is_trusted():
    tr = window_trust(Ev({"pyspy": spy(steady())}))
    assert tr["trusted"] and tr["checks"]["pace"]["batches"] == [10, 10]


def test_a_window_whose_data_wait_moves_is_not_trusted():
    tl = steady(0, 5, wait=0.05) + steady(5, 10, wait=0.45)
    tr = window_trust(Ev({"pyspy": spy(tl)}))
    assert not tr["trusted"] and "pace moved" in tr["reasons"][0]


def test_a_window_whose_batch_rate_halves_is_not_trusted():
    tl = steady(0, 5, period=0.25, wait=0.05) + steady(5, 10, period=0.625, wait=0.125)
    tr = window_trust(Ev({"pyspy": spy(tl)}))
    assert not tr["trusted"] and "batches/s" in tr["reasons"][0]


def test_few_samples_and_a_pressure_jump_are_said():
    ev = Ev({"pyspy": spy(steady(), rate=5),
             "pressure": {"host": {"cpu": {"some": {"avg10": 70.0, "avg60": 20.0, "avg300": 5.0}}}}})
    tr = window_trust(ev)
    assert not tr["trusted"]
    assert any("few samples: 50" in r for r in tr["reasons"])
    assert any("CPU pressure changed" in r for r in tr["reasons"])


def test_the_summary_counts_agreement():
    def rep(top, x, trusted=True):
        f = [{"id": top, "expected_speedup": x, "expected_speedup_interval": [1, x]}] if top else []
        return {"findings": f, "window": {"start_unix": 0, "seconds": 2, "trust": {"trusted": trusted, "reasons": []}}}
    s = windows_summary([rep("dataloader.starved", 2.1), rep("dataloader.starved", 2.4)])
    assert s["agree"] and s["verdict"] == "all 2 windows agree: dataloader.starved (2.10-2.40x)"
    s = windows_summary([rep("dataloader.starved", 2.1), rep("dataloader.starved", 2.0), rep(None, 0, False)])
    assert not s["agree"] and s["verdict"].startswith("2 of 3 windows give dataloader.starved")
    assert "no finding x1" in s["verdict"] and "1 window(s) not steady" in s["verdict"]


@pytest.fixture
def job():
    w = start_workload("--seconds", "60", "--num-workers", "0", "--sample-work", "1500")
    yield w
    w.stop()


def test_windows_on_a_real_job(job):
    r = run_cli("diagnose", "--pid", str(job.pid), "--duration", "2", "--windows", "2", "--json", timeout=120)
    assert r.rc == 0, r.err
    rep = r.json()
    assert rep["windows"]["n"] == 2 and len(rep["windows"]["per_window"]) == 2
    assert "trust" in rep["window"] and isinstance(rep["window"]["trust"]["trusted"], bool)
    assert rep["windows"]["per_window"][0]["start_unix"] < rep["windows"]["per_window"][1]["start_unix"]
    assert job.alive()
    t = run_cli("diagnose", "--pid", str(job.pid), "--duration", "1.5", "--windows", "2", timeout=120)
    assert t.rc == 0 and "windows: " in t.out


def test_windows_that_rate_one_fix_differently_are_pooled():
    # mnist_rnn on 2 CPUs, four 5 s windows a minute apart (benchmarks/window_spread.py): the loader
    # fix led two windows at 1.38x and 1.40x and was rated 1.00x below compute.bound in the other two.
    def rep(fs):
        return {"findings": [{"id": i, "expected_speedup": x, "expected_speedup_interval": [0.5, 1.6]} for i, x in fs],
                "window": {"start_unix": 0, "seconds": 5, "trust": {"trusted": True, "reasons": []}}}
    s = windows_summary([rep([("dataloader.starved", 1.38)]), rep([("dataloader.starved", 1.40)]),
                         rep([("compute.bound", 1.0), ("dataloader.starved", 1.0)]),
                         rep([("compute.bound", 1.0), ("dataloader.starved", 1.0)])])
    assert not s["agree"]
    assert s["pooled"] == {"dataloader.starved": {"windows": 4, "geomean": 1.18, "min": 1.0, "max": 1.4}}
    assert "dataloader.starved's fix over 4 windows: 1.00-1.40x, geometric mean 1.18x" in s["verdict"]
    # One window's finding is not pooled; windows within 1.2x of each other that agree keep their line.
    s = windows_summary([rep([("dataloader.starved", 2.1), ("host.sync", 1.3)]), rep([("dataloader.starved", 2.3)]),
                         rep([("dataloader.starved", 2.2)])])
    assert set(s["pooled"]) == {"dataloader.starved"} and s["verdict"] == "all 3 windows agree: dataloader.starved (2.10-2.30x)"
