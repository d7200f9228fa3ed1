"""auto's choice of the agent's scheduling class from /proc/stat readings (agent/schedclass.py)."""
from __future__ import annotations

import pytest

from trainprobe.agent import schedclass as sc
from trainprobe.reports.text import _class_bit

# Two readings of this 2-CPU machine's /proc/stat, 1 s apart: cpu0 idle 0.9 s, cpu1 busy all along.
BEFORE = """cpu  4123725 33728 530197 3846535 24015 0 11313 2339 0 0
cpu0 1700439 14223 239179 2313759 7373 0 4826 1189 0 0
cpu1 2423285 19504 291017 1532775 16642 0 6487 1150 0 0
intr 31114341 0 0
"""
AFTER = """cpu  4123835 33728 530197 3846625 24015 0 11313 2339 0 0
cpu0 1700449 14223 239179 2313849 7373 0 4826 1189 0 0
cpu1 2423385 19504 291017 1532775 16642 0 6487 1150 0 0
intr 31114441 0 0
"""


def _pair(allowed={0, 1}, own_s=0.0, wall=1.0):
    a = sc.read_cpus(BEFORE, allowed)
    b = sc.read_cpus(AFTER, allowed)
    return (sc.CpuReading(0.0, a.idle, a.total, a.cpus, 0.0),
            sc.CpuReading(wall, b.idle, b.total, b.cpus, own_s))


def test_idle_ticks_of_the_allowed_cpus_over_the_gap_give_the_free_cpus():
    before, after = _pair()
    assert (before.cpus, round(after.total - before.total, 6)) == (2, 2.0)
    assert sc.free_cpus(before, after) == 0.9


def test_the_agents_own_cpu_counts_as_free_and_only_allowed_cpus_are_read():
    before, after = _pair(own_s=0.1)
    assert sc.free_cpus(before, after) == 1.0
    before, after = _pair(allowed={1})
    assert before.cpus == 1 and sc.free_cpus(before, after) == 0.0


def test_unreadable_or_mismatched_readings_give_no_figure_and_normal():
    assert sc.read_cpus("intr 1 2 3\n", {0}) is None
    a, _ = _pair()
    b = sc.read_cpus(BEFORE, {0})
    assert sc.free_cpus(a, b) is None
    assert sc.choose(None)[0] == "normal"


@pytest.mark.parametrize("free, cls", [(0.0, "normal"), (0.99, "normal"), (1.0, "idle"), (15.2, "idle")])
def test_auto_takes_sched_idle_only_with_a_whole_cpu_free(free, cls):
    got, why = sc.choose(free)
    assert got == cls and f"{free:.2f} CPUs" in why


def test_the_guard_promotes_once_when_the_agent_and_its_probes_wait_for_a_cpu(monkeypatch):
    """The waits of the agent's threads and of its probe children add up, turn by turn; a child first
    seen in a turn counts from its first reading."""
    series = {"self": iter([1.000, 1.010, 1.030, 1.060, 1.500]), 11: iter([5.0, 5.01, 5.03, 5.09, 9.0]),
              12: iter([7.0, 7.5])}
    moved: list[list[int]] = []
    monkeypatch.setattr(sc, "run_delay_s", lambda pid: next(series[pid]))
    monkeypatch.setattr(sc, "promote", lambda pids: moved.append(pids) or 3)
    d = {"asked": "auto", "class": "idle", "free_cpus": 4.0, "why": "x"}
    g = sc.Guard(d)
    g.tick([11])                  # the first readings
    g.tick([11])                  # 10 + 10 ms
    g.tick([11, 12])              # 20 + 20 ms, and 12 first seen
    assert not moved
    g.tick([11, 12])              # 30 + 60 + 500 ms: back to normal
    g.tick([11, 12])              # once only
    assert len(moved) == 1 and moved[0][1:] == [11, 12]
    assert d["class"] == "normal" and "590 ms" in d["promoted"]


def test_the_guard_leaves_a_class_the_user_asked_for():
    for d in ({"asked": "idle", "class": "idle"}, {"asked": "auto", "class": "normal"}):
        assert not sc.Guard(d).active


def test_the_text_report_says_the_class_and_why():
    assert _class_bit({"asked": "auto", "class": "idle", "free_cpus": 13.2}) == \
        "; ran at SCHED_IDLE (auto, 13.2 CPUs idle at start)"
    assert "back to normal" in _class_bit({"asked": "auto", "class": "normal", "free_cpus": 2.0, "promoted": "x"})
    assert _class_bit({"asked": "low", "class": "low"}) == "; ran at nice 10 (low)"
    assert _class_bit(None) == ""


def test_auto_keeps_normal_where_the_agent_could_not_leave_sched_idle_again(monkeypatch):
    """An unprivileged agent may return to SCHED_OTHER only within RLIMIT_NICE (sched(7)): with the
    default limit 0 it could not, so the guard could not undo SCHED_IDLE, and auto does not take it."""
    import resource
    monkeypatch.setattr(sc.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(sc.os, "getpriority", lambda *a: 0)
    monkeypatch.setattr(sc, "_cap_eff", lambda: 0)
    monkeypatch.setattr(resource, "getrlimit", lambda r: (0, 0))
    back = sc.can_return()
    assert back is not None and "RLIMIT_NICE 0" in back
    cls, why = sc.choose(4.0, back)
    assert cls == "normal" and "4.00 CPUs were idle" in why and "RLIMIT_NICE" in why
    monkeypatch.setattr(resource, "getrlimit", lambda r: (20, 20))
    assert sc.can_return() is None
    monkeypatch.setattr(sc.os, "geteuid", lambda: 0)
    monkeypatch.setattr(resource, "getrlimit", lambda r: (0, 0))
    assert sc.can_return() is None
