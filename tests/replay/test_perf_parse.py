"""The perf stat -x parser on real perf output of each shape (tests/data/perf, provenance in its README)."""
import json

import pytest

from trainprobe.probes.parsers import perfparse as pp
from trainprobe.probes.errors import PermissionDenied, TargetGone, Unavailable
from trainprobe.probes.perfstat import classify_failure, hardware_reason, summarise
from tests.helpers import DATA

PERF = DATA / "perf"
VM_PMU = {"sources": {"software": 1, "tracepoint": 2, "breakpoint": 5, "uprobe": 8, "msr": 9},
          "hypervisor": True, "core_pmus": []}


def text(name):
    return (PERF / name).read_text()


def parsed(name, sep=None):
    return pp.parse_text(text(name), sep)


def row(p, event, **kw):
    for r in p.rows:
        if r.event == event and all(getattr(r, k) == v for k, v in kw.items()):
            return r
    raise AssertionError(f"no row {event} {kw}")


# -- shapes printed by perf 6.1 on this VM (no PMU) -------------------------------------------------

def test_interval_output_read_from_stderr_with_space_padded_timestamps():
    p = parsed("vm-interval-stderr.txt")
    assert p.sep == ","
    assert p.interval_mode and len(p.timestamps) == 3
    assert all(len(rows) == 11 for rows in [[r for r in p.rows if r.timestamp == t] for t in p.timestamps])
    first = p.timestamps[0]
    assert 0.19 < first < 0.21                                  # "     0.200244940" -> 0.200244940
    tc = row(p, "task-clock", timestamp=first)
    assert tc.unit == "msec" and tc.value == pytest.approx(73.11) and tc.runtime_ns == 73113376
    assert tc.metric_unit == "CPUs utilized" and tc.metric_value == pytest.approx(0.366)
    assert not p.unparsed


def test_not_supported_rows_are_not_counts_even_at_100_percent():
    p = parsed("vm-plain-not-supported.txt")
    assert p.started_on and p.started_on.startswith("Sun Nov 29")
    cyc = row(p, "cycles")
    assert cyc.status == pp.NOT_SUPPORTED and cyc.value is None
    assert cyc.pct_running == 100.0 and cyc.runtime_ns == 0     # perf prints 100.00 for these
    cs = pp.counters_of(p.rows)
    assert cs["cycles"].status == pp.NOT_SUPPORTED and cs["cycles"].running_share is None
    d = pp.derive(cs, 0.11)
    assert d["ipc"] is None and d["llc_miss_ratio"] is None and d["llc_mpki"] is None
    assert d["task_clock_s"] == pytest.approx(0.11065, abs=1e-5)
    assert d["page_faults"] == 9363 and d["context_switches"] == 192


def test_repeat_variance_field_sits_before_the_runtime():
    p = parsed("vm-repeat-r3.txt")
    tc = row(p, "task-clock")
    assert tc.variance_pct == pytest.approx(0.49)
    assert tc.runtime_ns == 112163231 and tc.pct_running == 100.0     # not 0.49 taken for the runtime
    assert tc.metric_value == pytest.approx(0.254)
    assert row(p, "instructions").variance_pct == 0.0


def test_not_counted_software_events_of_a_sleeping_thread_mean_zero():
    p = parsed("vm-not-counted-sleeping.txt")
    assert {r.status for r in p.rows} == {pp.NOT_COUNTED}
    assert {r.comm for r in p.rows} == {"sleep"} and {r.tid for r in p.rows} == {16061}
    d = pp.derive(pp.counters_of(p.rows), pp.window_seconds(p))
    assert d["task_clock_s"] == 0.0 and d["cpu_cores"] == 0.0
    assert d["context_switches"] == 0 and d["page_faults"] == 0


def test_user_only_fallback_modifiers_are_stripped_and_kernel_side_counts_dropped():
    p = parsed("vm-user-only-paranoid2.txt")
    assert p.sep == ";"
    r = row(p, "task-clock:u", tid=16198, timestamp=p.timestamps[0])
    assert r.name == "task-clock" and r.modifiers == "u" and r.value == pytest.approx(251.23)
    cs = pp.counters_of(p.rows)
    assert cs["context-switches"].counted_rows and cs["context-switches"].value == 0   # what perf printed
    d = pp.derive(cs, pp.window_seconds(p))
    assert d["user_only"] is True
    assert d["context_switches"] is None and d["page_faults"] is None   # :u hides kernel-side events
    assert d["task_clock_s"] > 0.5


@pytest.mark.parametrize("name,agg,cpus", [("vm-per-cpu-A.txt", "CPU1", None), ("vm-per-socket.txt", "S0", 2),
                                           ("vm-per-core.txt", "S0-D0-C1", 1), ("vm-per-node.txt", "N0", 2)])
def test_aggregation_prefixes(name, agg, cpus):
    p = parsed(name)
    r = row(p, "context-switches", aggregation=agg)
    assert r.aggregated_cpus == cpus and r.tid is None and r.timestamp is None
    assert r.value > 0 and r.runtime_ns > 1e8


def test_summary_rows_are_recognised_and_not_added_to_the_intervals():
    p = parsed("vm-interval-summary.txt")
    summ = row(p, "task-clock", aggregation="summary")
    assert summ.timestamp is None and summ.value == pytest.approx(178.32)
    res = summarise({"main": text("vm-interval-summary.txt")},
                    {"main_pid": 1, "sessions": {"main": [1]}, "tasks": {}, "events": ["task-clock"]})
    g = res["groups"]["main"]
    assert g["task_clock_s"] == pytest.approx(0.17832, abs=0.0005)      # 62.82 + 115.50 ms, not twice that


def test_per_thread_interval_capture_of_a_training_job_and_its_workers():
    targets = json.loads(text("vm-train-targets.json"))
    t = {"main_pid": 15608, "sessions": {"main": [15608], "workers": [15646, 15647]},
         "tasks": {**targets["main"], **targets["workers"]}, "comm": targets["comm"],
         "interval_ms": 500, "interval_count": 6, "events": list(pp.HARDWARE_EVENTS + pp.SOFTWARE_EVENTS),
         "pmu": VM_PMU}
    ev = summarise({"main": text("vm-train-main-interval-per-thread.txt"),
                    "workers": text("vm-train-workers-interval-per-thread.txt")}, t)
    assert ev["sessions"]["main"]["intervals"] == 6 and ev["sessions"]["workers"]["intervals"] == 6
    assert 2.9 < ev["window_s"] < 3.2
    procs = {p["pid"]: p for p in ev["processes"]}
    assert set(procs) == {15608, 15646, 15647}
    assert procs[15646]["role"] == "dataloader_worker" and procs[15608]["role"] == "main"
    assert procs[15646]["threads_counted"] == 3 and procs[15647]["threads_counted"] == 3
    for p in procs.values():                                  # software counters counted per process
        assert p["cpu_cores"] > 0.1 and p["context_switches_per_s"] > 10 and p["page_faults"] > 0
        assert p["ipc"] is None
    tt = ev["training_thread"]
    assert tt["tid"] == 15608 and tt["pid"] == 15608
    # the training thread carries nearly all of the main process's CPU; the others are helpers
    assert tt["task_clock_s"] > 0.9 * procs[15608]["task_clock_s"]
    assert ev["groups"]["workers"]["task_clock_s"] == pytest.approx(
        procs[15646]["task_clock_s"] + procs[15647]["task_clock_s"], rel=1e-6)
    assert len(ev["groups"]["main"]["series"]) == 6
    assert ev["hardware"]["available"] is False
    assert "no hardware PMU" in ev["hardware"]["reason"] and "<not supported>" in ev["hardware"]["reason"]
    assert ev["events"]["cycles"] == pp.NOT_SUPPORTED and ev["events"]["task-clock"] == pp.COUNTED


# -- bare-metal shapes published on LKML (hardware counters, multiplexing) ---------------------------

@pytest.mark.parametrize("name", ["lkml-spr-system-wide.txt", "lkml-system-wide-sleep1.txt",
                                  "lkml-interval-stat-report.txt", "lkml-per-socket-metric-line.txt"])
def test_derived_ipc_matches_what_perf_printed(name):
    p = parsed(name)
    ins = next(r for r in p.rows if r.name == "instructions")
    ipc = pp.derive(pp.counters_of(p.rows), 1.0)["ipc"]
    assert ins.metric_unit == "insn per cycle"
    assert ipc == pytest.approx(ins.metric_value, abs=0.006)
    assert pp.derive(pp.counters_of(p.rows), 1.0)["ipc_trust"] == 1.0


def test_metric_only_lines_are_skipped_not_mistaken_for_counters():
    p = parsed("lkml-spr-system-wide.txt")
    assert len(p.rows) == 8 and not p.unparsed               # 14 TopdownL1/L2 metric lines dropped
    assert {r.name for r in p.rows} >= {"cycles", "instructions", "cpu-clock", "branch-misses"}
    q = parsed("lkml-per-socket-metric-line.txt")
    assert len(q.rows) == 8 and not q.unparsed               # ",S0,1,,,,,,,2.00,stalled cycles per insn"
    assert all(r.aggregation == "S0" and r.aggregated_cpus == 1 for r in q.rows)


def test_multiplexed_hybrid_rows_are_scaled_and_flagged():
    p = parsed("lkml-hybrid-multiplexed.txt")
    atom = row(p, "cpu_atom/cycles/")
    assert atom.pmu == "cpu_atom" and atom.name == "cycles" and atom.pct_running == 54.0
    assert atom.multiplexed and not row(p, "cpu_core/cycles/").multiplexed
    assert atom.enabled_ns == pytest.approx(8695757391 / 0.54)
    cs = pp.counters_of(p.rows)
    # cpu_core and cpu_atom counts of one event add up; the trust is the time-weighted running share
    assert cs["cycles"].value == 6766433 + 256500230
    assert cs["cycles"].running_share == pytest.approx((16067551558 + 8695757391) / (16067551558 + 8695757391 / 0.54))
    d = pp.derive(cs, 1.0)
    assert d["ipc"] == pytest.approx((4688595 + 37487490) / (6766433 + 256500230), abs=1e-4)
    assert 0.7 < d["ipc_trust"] < 0.8
    core_only = pp.derive(pp.counters_of([r for r in p.rows if r.pmu in (None, "cpu_core")]), 1.0)
    assert core_only["ipc"] == pytest.approx(0.69, abs=0.006) and core_only["ipc_trust"] == 1.0


def test_interval_series_gives_per_interval_ratios():
    p = parsed("lkml-interval-stat-report.txt")
    s = pp.interval_series(p.rows)
    assert len(s) == 1 and s[0]["ipc"] == pytest.approx(1.4834, abs=1e-3)
    assert s[0]["cpu_cores"] == pytest.approx(4.0, abs=0.01)        # 4003.55 ms of cpu-clock in 1.0 s


def test_separator_is_detected():
    assert parsed("vm-train-main-interval-per-thread.txt").sep == ";"
    assert parsed("lkml-hybrid-multiplexed.txt").sep == ","


# -- errors perf printed here -------------------------------------------------------------------------

def test_paranoid_refusal_is_permission_denied_with_the_level():
    t = text("vm-error-paranoid-other-user.txt")
    assert not pp.parse_text(t).rows
    err = classify_failure(t, 255)
    assert isinstance(err, PermissionDenied)
    assert "perf_event_paranoid is 2" in str(err) and "CAP_PERFMON" in str(err)


def test_vanished_target_is_target_gone():
    assert isinstance(classify_failure(text("vm-error-no-such-pid.txt"), 234), TargetGone)


def test_hardware_reason_names_the_missing_pmu_and_the_fallback():
    status = {e: pp.NOT_SUPPORTED for e in pp.HARDWARE_EVENTS}
    assert "virtual machine" in hardware_reason(VM_PMU, status)
    bare = dict(VM_PMU, hypervisor=False)
    assert "registered no CPU PMU" in hardware_reason(bare, status)
    amd = {"core_pmus": ["cpu"], "hypervisor": False}
    st = {e: pp.COUNTED for e in pp.HARDWARE_EVENTS}
    st.update({"LLC-loads": pp.NOT_SUPPORTED, "LLC-load-misses": pp.NOT_SUPPORTED})
    assert hardware_reason(amd, st) is None                  # cache-misses/cache-references stand in
    st["cache-misses"] = pp.NOT_SUPPORTED
    assert "although a CPU PMU is present" in hardware_reason(amd, st)


def test_unrecognised_text_is_kept_aside():
    p = pp.parse_text("perf: some warning\n" + text("vm-interval-stderr.txt"))
    assert p.unparsed == ["perf: some warning"] and len(p.rows) == 33
    assert isinstance(classify_failure("event syntax error: 'LLC-loadz'", 129), Unavailable)
