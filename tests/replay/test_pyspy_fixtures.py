"""The py-spy parser and classifiers on real captures from an H200 node (tests/data/h200)."""
import pytest

from trainprobe.agent import evidence
from trainprobe.agent.rules import run_rules
from trainprobe.probes.pyspy import PySpyProbe
from tests.helpers import H200_MODES, h200_pyspy_capture


def parsed(mode):
    return PySpyProbe.parse(h200_pyspy_capture(mode))


def breakdown(mode):
    return parsed(mode)["training_thread"]["breakdown"]


def test_starved_capture_waits_on_data_about_ninety_percent():
    bd = breakdown("starved")
    assert 0.85 <= bd["data_load"] + bd["data_wait"] <= 0.95
    assert bd["data_load"] > bd["data_wait"]           # num_workers=0: loading happens in the loop


def test_starved_inloop_loading_is_in_getitem():
    tt = parsed("starved")["training_thread"]
    assert tt["data_load_breakdown"]["getitem"] > 0.9
    assert "Heavy.__getitem__" in tt["top_stacks"]["data_load"][0]["stack"][-1]


@pytest.mark.parametrize("mode", ["fixed", "healthy", "sync", "pinned", "pageable"])
def test_other_captures_do_not_look_starved(mode):
    bd = breakdown(mode)
    assert bd["data_load"] + bd["data_wait"] < 0.05


def test_fixed_capture_finds_twelve_workers_doing_getitem_and_collate():
    w = parsed("fixed")["workers"]
    assert w["count"] == 12
    assert w["breakdown"]["getitem"] > 0.3 and w["breakdown"]["collate"] > 0.05


def test_pageable_leaf_line_is_a_host_to_device_copy():
    # The leaf frame is user code on `x = x.cuda(non_blocking=True)`: only its source says so.
    bd = breakdown("pageable")
    assert bd["h2d_copy"] > 0.85


def test_source_lines_decide_the_pageable_attribution():
    from trainprobe.probes.pyspy import capture_from_chrometrace
    from tests.helpers import h200_chrometrace, h200_pid
    cap = capture_from_chrometrace(h200_chrometrace("pageable"), h200_pid("pageable"))  # no source found
    bd = PySpyProbe.parse(cap)["training_thread"]["breakdown"]
    assert bd["h2d_copy"] < 0.05 and bd["other"] > 0.85


def test_compute_captures_spend_their_time_in_forward_backward_optimizer():
    for mode in ("healthy", "sync"):
        bd = breakdown(mode)
        assert bd["forward"] + bd["backward"] + bd["optimizer"] > 0.6, mode


def test_timeline_is_anchored_to_the_wall_clock():
    cap = h200_pyspy_capture("starved")
    cap.meta["launch_unix"] = 1_000_000.0
    tl = PySpyProbe.parse(cap)["timeline"]
    assert tl[0][0] >= 1_000_000.0 and tl[-1][1] <= 1_000_000.0 + 5.0
    assert all(a <= b for a, b, _ in tl)


@pytest.mark.parametrize("mode", H200_MODES)
def test_rules_on_captures(mode):
    ev = evidence.build([h200_pyspy_capture(mode)], {"cpus_available": 16, "uses_cuda": True})
    findings, runs = run_rules(ev)
    ids = [f.id for f in findings]
    if mode == "starved":
        f = next(f for f in findings if f.id == "dataloader.starved")
        assert f.details["proposed_num_workers"] > 0
        assert "pin_memory=True" in f.fixes[0].change
        assert f.expected_speedup > 3.0
    else:
        assert "dataloader.starved" not in ids


def test_a_busy_helper_subprocess_is_not_a_rank_and_its_parent_not_a_launcher():
    # A loop blocked most of its step on an Event and on a pipe to its own Python child (which
    # answers each request), with little forward/backward: the child is busy but does not train,
    # so the target stays the training process (it was once taken for a torchrun launcher and the
    # child's `<module>` loop reported as the training thread).
    from trainprobe.probes import pyspy as pyspy_mod
    from trainprobe.probes.parsers.pystacks import Frame, Span, ThreadTrace
    job = "/work/job/train.py"
    wait = (Frame("main", job, 10), Frame("Event.wait", "/usr/lib/python3.11/threading.py", 629))
    read = (Frame("main", job, 12), Frame("TextIOWrapper.readline", "<io>", 0))
    fwd = (Frame("main", job, 8), Frame("Module._call_impl", "/x/torch/nn/modules/module.py", 1789),
           Frame("Linear.forward", "/x/torch/nn/modules/linear.py", 134))
    main = [Span(i * 0.1, i * 0.1 + 0.1, (wait, read, fwd)[i % 3] if i % 10 == 0 else (wait, read)[i % 2])
            for i in range(30)]
    child = [Span(i * 0.1, i * 0.1 + 0.1, (Frame("<module>", "<string>", 2 + i % 2),)) for i in range(30)]
    traces = [ThreadTrace(100, 100, 100, "MainThread", main, (100,)),
              ThreadTrace(101, 101, 101, None, child, (100, 101))]
    ev = pyspy_mod.analyse(traces, {}, {"pid": 100, "rate_hz": 10})
    assert ev["launcher"] is False and "ranks" not in ev
    assert ev["training_thread"]["pid"] == 100 and ev["training_thread"]["name"] == "MainThread"


def test_truncated_samples_in_loading_code_count_as_the_loops_loading():
    """py-spy's nonblocking reads leave some samples with their innermost frames only; pytorch/examples'
    mnist_rnn on 2 CPUs (a public ledger window) read 19% of its loop that way, mostly PIL and
    transforms: loading, which without its DataLoader frames counted as the loop's other work."""
    from trainprobe.agent import bundle as bundle_mod
    from trainprobe.agent.diagnosis import evidence_from
    from tests.helpers import DATA
    pub = DATA / "ledger" / "public" / "bundles"
    b = bundle_mod.load(str(pub / "mnist-rnn-cpu-r12.tar.gz"))
    tt = evidence_from(b.captures, b.context).get("pyspy")["training_thread"]
    assert 0.15 <= tt["truncated_fraction"] <= 0.22
    assert 0.13 <= tt["truncated_loading_fraction"] <= tt["truncated_fraction"]
    assert 0.37 <= tt["breakdown"]["data_load"] <= 0.43          # 0.24 with them counted as other work
    # a window with no truncated sample reads as before
    b = bundle_mod.load(str(pub / "vae-cpu-r3.tar.gz"))
    tt = evidence_from(b.captures, b.context).get("pyspy")["training_thread"]
    assert tt["truncated_fraction"] == 0.0 and tt["truncated_loading_fraction"] == 0.0


def test_py_spys_dropped_samples_are_read_from_its_log_and_shown_beside_in_loop_loading():
    from trainprobe.agent import bundle as bundle_mod
    from trainprobe.agent.diagnosis import evidence_from
    from trainprobe.agent.report import diagnose
    from trainprobe.probes.pyspy import read_unread
    from tests.helpers import DATA
    assert read_unread("py-spy> Wrote chrome trace to 'x.json'. Samples: 113 Errors: 20\n") == {
        "samples": 113, "errors": 20, "share": 0.1504}
    assert read_unread("py-spy> Sampling process 30 times a second\n") is None
    b = bundle_mod.load(str(DATA / "ledger" / "public" / "bundles" / "mnist-rnn-cpu-r12.tar.gz"))
    ev = evidence_from(b.captures, b.context)
    assert ev.get("pyspy")["unread"]["errors"] == 20
    f = next(x for x in diagnose(ev)[0] if x.id == "dataloader.starved")
    assert any("could not read" in e.fact for e in f.evidence), [e.fact for e in f.evidence]
