"""cpu.memory_bound on parsed evidence.

The py-spy side is real: captures from the H200 node (tests/data/h200) and from the bundled CPU
workload on this VM (tests/data/perf/pyspy-*). The hardware counters are rule inputs: this VM has
no PMU and no real per-process bare-metal capture with LLC events was found to replay, so they are
built from counts through the parser's own derivation (perfparse.derive), in the evidence shape
that `summarise` produces (checked below against a real capture).
"""
import gzip
import json

import pytest

from trainprobe.agent import evidence
from trainprobe.agent.rules import run_rules
from trainprobe.agent.rules.cpu_memory_bound import IPC_LOW, speedup
from trainprobe.probes.parsers import perfparse as pp
from trainprobe.probes.base import Capture
from trainprobe.probes.perfstat import summarise
from trainprobe.probes.pyspy import capture_from_chrometrace
from tests.helpers import DATA, REPO, h200_pyspy_capture

PERF = DATA / "perf"


def cpu_pyspy_capture(name):
    meta = json.loads((PERF / f"{name}.json").read_text())
    with gzip.open(PERF / f"{name}.chrometrace.json.gz", "rt") as fh:
        text = fh.read()
    return capture_from_chrometrace(text, meta["pid"], meta["launch_unix"], meta["rate_hz"],
                                    source_remap={"/work/wt-perf/": str(REPO) + "/"}), meta["pid"]


def counts(ipc, miss_ratio, seconds=4.0, pct=100.0, instructions=8e9, llc_loads=5e7, cpu_ms=3000.0):
    """Rows of one thread or process, as perf would report them (value already scaled)."""
    cycles = instructions / ipc
    mk = lambda ev, v, unit="": pp.Row(event=ev, name=ev, status=pp.COUNTED, value=v, unit=unit,
                                       runtime_ns=seconds * 1e9 * pct / 100.0, pct_running=pct)
    return [mk("instructions", instructions), mk("cycles", cycles), mk("LLC-loads", llc_loads),
            mk("LLC-load-misses", llc_loads * miss_ratio), mk("task-clock", cpu_ms, "msec"),
            mk("context-switches", 400.0), mk("cpu-migrations", 3.0), mk("page-faults", 100.0),
            mk("major-faults", 0.0)]


def perf_capture_evidence(main_pid, thread=None, workers=None, seconds=4.0):
    """The perfstat evidence for a training thread (tid == main_pid) and optional workers."""
    d = lambda rows: pp.derive(pp.counters_of(rows), seconds)
    t = dict(d(thread), pid=main_pid, tid=main_pid, comm="python")
    ev = {"hardware": {"available": True, "reason": None}, "training_thread": t, "threads": [t],
          "groups": {"main": dict(d(thread), series=[])}, "processes": [dict(d(thread), pid=main_pid, role="main")]}
    if workers is not None:
        ev["groups"]["workers"] = dict(d(workers), series=[])
    return ev


def diagnose(spy_capture, perf_ev, context=None):
    ev = evidence.build([spy_capture], dict(context or {}))
    ev.parsed["perfstat"] = perf_ev
    findings, runs = run_rules(ev)
    run = next(r for r in runs if r.finding_id == "cpu.memory_bound")
    return next((f for f in findings if f.id == "cpu.memory_bound"), None), run


MEMORY = dict(ipc=0.45, miss_ratio=0.38)
COMPUTE = dict(ipc=2.1, miss_ratio=0.04)


def test_evidence_shape_matches_what_summarise_produces():
    t = json.loads((PERF / "vm-train-targets.json").read_text())
    real = summarise({"main": (PERF / "vm-train-main-interval-per-thread.txt").read_text()},
                     {"main_pid": 15608, "sessions": {"main": [15608]}, "tasks": t["main"], "events": []})
    built = perf_capture_evidence(15608, counts(**MEMORY))
    assert set(built) <= set(real)
    assert set(built["training_thread"]) <= set(real["training_thread"])
    assert set(built["groups"]["main"]) - {"series"} <= set(real["groups"]["main"])


def test_starved_workers_with_memory_bound_counters_get_the_finding():
    cap, pid = cpu_pyspy_capture("pyspy-cpu-starved-1worker")
    perf = perf_capture_evidence(pid, counts(**COMPUTE), workers=counts(**MEMORY))
    f, run = diagnose(cap, perf)
    assert run.status == "fired" and f is not None
    assert f.details["where"] == "workers"
    s = f.details["share"]
    assert 0.6 < s < 0.8                                       # the loop waits ~71% of the step
    assert f.expected_speedup == pytest.approx(1.0 / max(1 - s, 0.45), abs=0.01)
    assert f.expected_speedup <= 1.0 / (1 - s)                 # never above the share's Amdahl ceiling
    facts = {e.fact: e.value for e in f.evidence}
    assert any("SyntheticDataset.__getitem__" in str(v) for v in facts.values())   # the stacks say where
    assert any("for comparison" in k and v == pytest.approx(2.1) for k, v in facts.items())
    assert f.confidence in ("high", "medium")
    assert any(fx.command and fx.command.startswith("numactl --cpunodebind=") for fx in f.fixes)
    assert any("uint8" in (fx.change or "") or "bytes" in (fx.change or "") for fx in f.fixes)


def test_starved_workers_running_compute_bound_code_do_not():
    cap, pid = cpu_pyspy_capture("pyspy-cpu-starved-1worker")
    f, run = diagnose(cap, perf_capture_evidence(pid, counts(**COMPUTE), workers=counts(**COMPUTE)))
    assert f is None and run.status == "quiet"


def test_high_miss_ratio_with_high_ipc_is_not_memory_bound():
    cap, pid = cpu_pyspy_capture("pyspy-cpu-starved-1worker")
    f, _ = diagnose(cap, perf_capture_evidence(pid, counts(**COMPUTE), workers=counts(ipc=1.8, miss_ratio=0.5)))
    assert f is None


def test_inloop_loading_on_the_h200_with_memory_bound_thread():
    cap = h200_pyspy_capture("starved")
    pid = cap.meta["pid"]
    f, run = diagnose(cap, perf_capture_evidence(pid, counts(**MEMORY)), {"uses_cuda": True})
    assert f is not None and f.details["where"] == "in_loop"
    s = f.details["share"]
    assert s > 0.85
    assert f.expected_speedup == pytest.approx(1.0 / ((1 - s) + s * 0.45), abs=0.01)
    assert "Heavy.__getitem__" in " ".join(str(e.value) for e in f.evidence)
    assert any("uint8" in (fx.change or "") for fx in f.fixes)    # CUDA job: convert on the GPU


def test_gpu_bound_compute_stacks_do_not_get_it_even_with_slow_host_code():
    cap = h200_pyspy_capture("healthy")
    f, run = diagnose(cap, perf_capture_evidence(cap.meta["pid"], counts(**MEMORY)), {"uses_cuda": True})
    assert f is None and run.status == "quiet"


def test_cpu_training_compute_bound_does_not_get_it():
    cap, pid = cpu_pyspy_capture("pyspy-cpu-compute-bound")
    f, _ = diagnose(cap, perf_capture_evidence(pid, counts(**COMPUTE)))
    assert f is None


def test_cpu_training_whose_own_compute_stalls_on_memory_gets_it():
    cap, pid = cpu_pyspy_capture("pyspy-cpu-compute-bound")
    f, _ = diagnose(cap, perf_capture_evidence(pid, counts(**MEMORY)))
    assert f is not None and f.details["where"] == "cpu_compute"
    assert "Tensor.backward" in " ".join(str(e.value) for e in f.evidence)


def test_multiplexed_counters_lower_the_confidence_and_too_little_counting_says_nothing():
    cap, pid = cpu_pyspy_capture("pyspy-cpu-starved-1worker")
    f, _ = diagnose(cap, perf_capture_evidence(pid, counts(**COMPUTE), workers=counts(**MEMORY, pct=60.0)))
    assert f is not None and f.confidence == "medium" and f.details["trust"] == pytest.approx(0.6)
    f, _ = diagnose(cap, perf_capture_evidence(pid, counts(**COMPUTE), workers=counts(**MEMORY, pct=40.0)))
    assert f is not None and f.confidence == "low"
    f, _ = diagnose(cap, perf_capture_evidence(pid, counts(**COMPUTE), workers=counts(**MEMORY, pct=20.0)))
    assert f is None


def test_no_hardware_counters_keeps_the_rule_quiet_on_a_real_vm_capture():
    cap, pid = cpu_pyspy_capture("pyspy-cpu-starved-1worker")
    t = json.loads((PERF / "vm-train-targets.json").read_text())
    perf = summarise({"main": (PERF / "vm-train-main-interval-per-thread.txt").read_text(),
                      "workers": (PERF / "vm-train-workers-interval-per-thread.txt").read_text()},
                     {"main_pid": 15608, "sessions": {"main": [15608], "workers": [15646, 15647]},
                      "tasks": {**t["main"], **t["workers"]}, "events": [], "interval_ms": 500,
                      "pmu": {"core_pmus": [], "hypervisor": True}})
    f, run = diagnose(cap, perf)
    assert f is None and run.status == "quiet"
    assert "no hardware PMU" in perf["hardware"]["reason"]


def test_one_numa_node_drops_the_binding_fix_and_says_why():
    cap, pid = cpu_pyspy_capture("pyspy-cpu-starved-1worker")
    ev = evidence.build([cap], {})
    ev.parsed["perfstat"] = perf_capture_evidence(pid, counts(**COMPUTE), workers=counts(**MEMORY))
    ev.parsed["topology"] = {"numa_node_count": 1, "nodes": [{"node": 0, "cpus": "0-1"}]}
    f = next(f for f in run_rules(ev)[0] if f.id == "cpu.memory_bound")
    assert not any(fx.command and "numactl" in fx.command for fx in f.fixes)
    assert any(e.probe == "topology" for e in f.evidence)
    ev.parsed["topology"] = {"numa_node_count": 2}
    ev.parsed["gpu"] = {"gpus": [{"index": 0, "numa_node": 1}], "target_gpus": [0], "busy_fraction": 0.3}
    f = next(f for f in run_rules(ev)[0] if f.id == "cpu.memory_bound")
    assert any(fx.command and fx.command.startswith("numactl --cpunodebind=1 --membind=1 ") for fx in f.fixes)


def test_busy_gpu_means_the_host_is_not_the_limit():
    cap, pid = cpu_pyspy_capture("pyspy-cpu-starved-1worker")
    ev = evidence.build([cap], {})
    ev.parsed["perfstat"] = perf_capture_evidence(pid, counts(**COMPUTE), workers=counts(**MEMORY))
    ev.parsed["gpu"] = {"busy_fraction": 0.97}
    assert not any(f.id == "cpu.memory_bound" for f in run_rules(ev)[0])


@pytest.mark.parametrize("model", ["workers", "serial"])
def test_speedup_stays_under_the_amdahl_ceiling_and_grows_with_the_stall(model):
    for s in (0.1, 0.5, 0.9):
        prev = 1.0
        for ipc in (0.9, 0.6, 0.3, 0.1):
            sp = speedup(model, s, ipc / IPC_LOW)
            assert 1.0 <= sp <= 1.0 / (1.0 - s) + 1e-9
            assert sp >= prev - 1e-12
            prev = sp


def test_worker_counters_are_those_of_the_processes_pyspy_saw_in_the_worker_loop():
    cap, pid = cpu_pyspy_capture("pyspy-cpu-starved-1worker")
    ev = evidence.build([cap], {})
    worker = ev.get("pyspy")["workers"]["per_worker"][0]["pid"]
    perf = perf_capture_evidence(pid, counts(**COMPUTE), workers=counts(**COMPUTE))   # all descendants
    d = lambda rows: pp.derive(pp.counters_of(rows), 4.0)
    perf["processes"] += [dict(d(counts(**MEMORY)), pid=worker, role="dataloader_worker"),
                          dict(d(counts(**COMPUTE)), pid=worker + 1000, role="child")]   # e.g. a compiler child
    perf["window_s"] = 4.0
    ev.parsed["perfstat"] = perf
    f = next((f for f in run_rules(ev)[0] if f.id == "cpu.memory_bound"), None)
    assert f is not None and f.details["where"] == "workers"
    assert f.details["ipc"] == pytest.approx(0.45, abs=1e-3) and f.details["llc_miss_ratio"] == pytest.approx(0.38)
