"""GPU idle time on the host's clock: the attribution on the real H200 captures, the anchoring of
the two clocks, and the allocation and step inference as pure functions."""
import pytest

from trainprobe.agent.analysis.gpu_idle import allocate_idle, attribute, correlate, infer_steps, sample_spans
from tests.helpers import H200_MODES, h200_evidence


def att(mode, shift_s=0.0):
    ev = h200_evidence(mode, shift_s)
    return correlate(ev.get("gpu"), ev.get("pyspy"))


@pytest.mark.parametrize("mode", H200_MODES)
def test_the_two_clocks_overlap_for_the_whole_py_spy_recording(mode):
    a = att(mode)
    assert a.ok, a.reason
    # py-spy recorded ~4 s (-d 4); NVML's samples cover all of it.
    assert 3.5 <= a.observed_s <= 4.6
    assert a.samples >= 18
    assert a.gpu_indices == [0] and a.period_s == pytest.approx(0.2, abs=0.002)
    assert a.idle_total_s == pytest.approx(a.observed_s - a.busy_seconds, rel=1e-6)


def test_starved_idle_time_is_the_loop_loading_its_batches():
    a = att("starved")
    assert a.busy_fraction < 0.07
    assert a.idle_share("data_load") > 0.8
    assert a.idle_share("data_load") > 10 * a.idle_share("launch")


def test_pageable_idle_time_is_the_host_to_device_copy():
    a = att("pageable")
    assert a.idle_share("h2d_copy") > 0.7
    assert a.idle_share("data_wait", "data_load") == 0.0


def test_sync_idle_time_is_the_host_issuing_tiny_kernels():
    a = att("sync")
    assert a.idle_share("launch") > 0.75
    assert a.idle_share("data_wait", "data_load", "h2d_copy") < 0.02


@pytest.mark.parametrize("mode", ["healthy", "pinned"])
def test_a_busy_gpu_leaves_nothing_to_attribute(mode):
    a = att(mode)
    assert a.busy_fraction > 0.97
    assert max(a.idle_share(c) for c in ("data_wait", "data_load", "h2d_copy", "launch", "host_sync", "other")) < 0.02
    # The host does sync in these jobs (every 50 steps), but the GPU is busy while it waits.
    assert a.host_share("host_sync") > 0.1 and a.idle_share("host_sync") < 0.005


@pytest.mark.parametrize("mode,cause", [("starved", "data_load"), ("pageable", "h2d_copy"), ("sync", "launch")])
@pytest.mark.parametrize("shift_s", [-0.25, 0.25])
def test_attribution_does_not_hang_on_the_exact_anchor(mode, cause, shift_s):
    # The H200 captures do not record when py-spy started; we anchor it at started_unix_us. These
    # jobs are steady, so an anchor off by a quarter second must not move the answer.
    assert att(mode, shift_s).idle_share(cause) == pytest.approx(att(mode).idle_share(cause), abs=0.05)


def test_a_timeline_that_misses_the_nvml_window_is_not_attributed():
    a = att("starved", shift_s=3600.0)
    assert not a.ok and "overlap" in a.reason


def test_the_clock_alignment_decides_the_attribution():
    # GPU idle for the first 2 s, busy for the next 2 s; the host loads data, then computes.
    util = [[100.0 + 0.2 * k, 0.0 if k <= 10 else 100.0] for k in range(1, 21)]
    host = [[100.0, 102.0, "data_load"], [102.0, 104.0, "forward"]]
    a = attribute(util, 0.2, host)
    assert a.ok and a.idle_share("data_load") == pytest.approx(0.5, abs=0.01)
    assert a.idle_share("launch") == pytest.approx(0.0, abs=0.01)
    # The same host timeline 2 s late: the idle time now falls on the compute phase... which the
    # alignment then blames for it. Same samples, same categories, another clock: another answer.
    late = [[t0 + 2.0, t1 + 2.0, c] for t0, t1, c in host]
    util_long = util + [[104.0 + 0.2 * k, 0.0] for k in range(1, 11)]
    b = attribute(util_long, 0.2, late)
    assert b.idle_share("data_load") == pytest.approx(0.0, abs=0.01)
    assert b.idle_share("launch") == pytest.approx(0.5, abs=0.01)


def test_idle_goes_first_to_data_and_copies_then_to_launching_never_first_to_a_sync():
    host = {"data_load": 0.05, "launch": 0.10, "host_sync": 0.05}
    out = allocate_idle(host, 0.08)
    assert out["data_load"] == pytest.approx(0.05)
    assert out["launch"] == pytest.approx(0.03)
    assert out["host_sync"] == 0.0
    out = allocate_idle(host, 0.18)
    assert out["host_sync"] == pytest.approx(0.03)
    # Within a tier, in proportion to the host's time.
    out = allocate_idle({"launch": 0.3, "other": 0.1}, 0.2)
    assert out["launch"] == pytest.approx(0.15) and out["other"] == pytest.approx(0.05)


def test_sample_spans_use_the_real_spacing_and_cap_a_missing_sample():
    spans = sample_spans([[10.0, 50], [10.2, 100], [11.0, 0]], 0.2)
    assert spans[0] == pytest.approx((9.8, 10.0, 0.5))
    assert spans[1] == pytest.approx((10.0, 10.2, 1.0))
    assert spans[2] == pytest.approx((10.8, 11.0, 0.0))      # a gap: one period, not 0.8 s


def test_steps_are_inferred_from_a_timeline_slow_enough_to_see_them():
    # 1 s steps: 0.4 s waiting for a batch, 0.6 s computing; GPU busy only while computing.
    tl, util = [], []
    for k in range(8):
        t = 100.0 + k
        tl += [[t, t + 0.4, "data_wait"], [t + 0.4, t + 0.7, "forward"], [t + 0.7, t + 1.0, "backward"]]
    for k in range(1, 41):
        t = 100.0 + 0.2 * k
        util.append([t, 0.0 if (t - 100.0) % 1.0 <= 0.4 + 1e-9 and (t - 100.0) % 1.0 > 1e-9 else 100.0])
    st = infer_steps(tl, 50, util, 0.2)
    assert st["inferred"] and st["count"] == 7 and st["median_seconds"] == pytest.approx(1.0)
    assert st["busy_share_per_step_summary"]["mean"] == pytest.approx(0.6, abs=0.05)


@pytest.mark.parametrize("mode", H200_MODES)
def test_steps_of_the_h200_jobs_are_too_short_for_py_spy_and_it_says_so(mode):
    st = att(mode).steps
    assert st["inferred"] is False and st["why"]
