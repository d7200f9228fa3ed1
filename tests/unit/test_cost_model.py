"""The cost model the plan uses: py-spy's per-sample cost by thread kind, the job's threads, and a
plan that survives a probe whose own cost model fails."""
import pytest

from trainprobe.agent import cost
from trainprobe.probes import pyspy
from trainprobe.probes.base import JobShape, Probe, ProbeCost, WatchSpec, expected_job_threads


@pytest.mark.parametrize("threads,workers,measured_ms", [
    (1, 0, 0.452),       # benchmarks/bench_pyspy_threads.py on the H200 node: a 1-thread loop
    (48, 0, 0.878),      # + 47 idle native threads (an OpenMP pool)
    (34, 0, 0.632),      # the CUDA training job without workers (34 threads, 2 of them Python)
    (19, 14, 1.498),     # the same job with 14 workers (17 Python threads: feeders, pin-memory)
])
def test_py_spy_per_sample_cost_is_within_30_percent_of_the_measured_one(threads, workers, measured_ms):
    planned = pyspy.sample_cpu_s(threads, workers) * 1000
    assert 0.7 <= planned / measured_ms <= 1.3, (planned, measured_ms)


def test_the_old_per_thread_figure_would_have_overestimated_a_cuda_process_sevenfold():
    # 0.13 ms per OS thread for the 34-thread job: 4.4 ms planned against 0.63 ms measured.
    assert 0.00013 * 34 / pyspy.sample_cpu_s(34, 0) > 5


def test_python_threads_are_expected_from_the_workers():
    assert pyspy.python_threads(34, 0) == 1
    assert pyspy.python_threads(19, 14) == 16            # main, 14 feeder threads, pin-memory
    assert pyspy.python_threads(3, 14) == 3              # never more than the OS threads


def test_expected_job_threads_counts_the_target_and_each_worker():
    job = JobShape(pid=1, processes=(1, 2, 3), children={2: 1, 3: 1}, threads=10)
    assert expected_job_threads(job) == 10 + 2 * 3


@pytest.mark.parametrize("threads,workers,speed,measured", [
    (34, 0, 1.457, 0.0788),   # the H100 node, the job without workers (benchmarks/results/h100-cost-check-2026-12-06-a)
    (34, 0, 1.318, 0.0772),
    (19, 14, 1.438, 0.0991),  # the same job with 14 workers
])
def test_the_process_probe_plans_a_perf_event_on_each_thread_of_the_target(threads, workers, speed, measured):
    from trainprobe.probes.process import ProcessProbe
    pids = tuple(range(1, workers + 2))
    job = JobShape(pid=1, processes=pids, children={p: 1 for p in pids[1:]}, threads=threads)
    planned = ProcessProbe().estimate_cost(WatchSpec(pid=1, window_s=10), job).cpu_s * speed
    assert 0.7 <= planned / measured <= 1.3, (planned, measured)


class _Broken(Probe):
    name = "broken"
    cost_cpu_s_fixed = 0.01

    def estimate_cost(self, spec, job):
        raise ZeroDivisionError("no")


class _Fine(Probe):
    name = "fine"
    cost_cpu_s_fixed = 0.02


def test_a_probe_whose_cost_model_fails_is_planned_at_its_fixed_figure():
    spec = WatchSpec(pid=1, window_s=10.0)
    p = cost.plan(spec, [_Broken(), _Fine()], JobShape(pid=1, processes=(1,), cpu_capacity=2.0), speed=(1.0, "x"))
    assert p.probes["broken"].cpu_s == pytest.approx(0.01)
    assert "cost model failed" in p.probes["broken"].basis
    assert p.probes["fine"].cpu_s == pytest.approx(0.02)
    assert isinstance(p.probes["fine"], ProbeCost)


def _job_with_a_thread(kind):
    import subprocess
    import sys
    import time
    code = ("import threading, time\n"
            "ev = threading.Event()\n"
            "def spin():\n    while True: pass\n"
            f"threading.Thread(target={'spin' if kind == 'spin' else 'ev.wait'}, daemon=True).start()\n"
            "print('ready', flush=True)\n"
            "while True: time.sleep(0.05)\n")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    p.stdout.readline()
    time.sleep(1.5)      # the main thread's start-up falls under 5% of its life
    return p


@pytest.mark.parametrize("kind,busy", [("idle", 0), ("spin", 1)])
def test_busy_threads_counts_what_ran_on_a_cpu(kind, busy):
    # A process whose main thread sleeps: an idle thread beside it counts nothing, a spinning one one.
    p = _job_with_a_thread(kind)
    try:
        assert cost.busy_threads(p.pid) == busy
    finally:
        p.kill()
        p.wait()


def test_no_gil_sampler_beside_only_idle_threads():
    plan = pyspy.plan_sampling(10.0, (1,), {}, 1.0, 25, threads=3, busy=1)
    assert plan["gil_rate_hz"] == 0 and "no other thread" in plan["gil_skipped"]
    plan = pyspy.plan_sampling(10.0, (1,), {}, 1.0, 25, threads=3, busy=2)
    assert plan["gil_rate_hz"] > 0


def test_a_spent_budget_keeps_the_training_thread_at_its_least_rate_when_no_gil_sampler_runs():
    """The least sampling counts the GIL sampler only where one is planned: counted beside an idle
    thread, its share went to the training thread (20 Hz for 15 on the 2-CPU machine)."""
    spec = WatchSpec(pid=1, window_s=10.0, rate_hz=25)
    job = JobShape(pid=1, processes=(1,), threads=2, busy_threads=1, cpu_capacity=2.0)
    p = cost.plan(spec, [pyspy.PySpyProbe()], job, speed=(1.0, "test"))
    assert p.over_budget and p.probes["pyspy"].cpu_s > 0
    least = pyspy.min_main_rate(10.0)
    assert pyspy.PySpyProbe.min_cost(10.0, 2, 0, busy=1) < pyspy.PySpyProbe.min_cost(10.0, 2, 0, busy=2)
    assert f"at {least} Hz" in p.probes["pyspy"].basis, p.probes["pyspy"].basis


def test_the_speed_factor_scales_the_interpreters_share_of_a_probe_not_py_spys_own_process():
    """The CLI's start-up gauges the interpreter: on an H100 node it read x1.27-1.38 and py-spy, priced
    at that, measured 0.68-0.74 of its planned figure; py-spy's own process keeps the models' figure."""
    from trainprobe.probes.process import ProcessProbe
    spec = WatchSpec(pid=1, window_s=6.0, rate_hz=25)
    job = JobShape(pid=1, processes=(1,), threads=20, busy_threads=2, cpu_capacity=16.0)
    probes = [pyspy.PySpyProbe(), ProcessProbe()]
    at1 = cost.plan(spec, probes, job, enforce=False, speed=(1.0, "x"))
    at2 = cost.plan(spec, probes, job, enforce=False, speed=(2.0, "x"))
    share = pyspy.PySpyProbe.native_share
    assert 0.7 <= share <= 0.9
    assert at2.probes["pyspy"].cpu_s == pytest.approx(at1.probes["pyspy"].cpu_s * (share + (1 - share) * 2.0))
    assert at2.probes["process"].cpu_s == pytest.approx(at1.probes["process"].cpu_s * 2.0)
    # where the budget is ample the fitted rate is the same at either speed, and only the price moves
    fit1 = cost.plan(spec, [pyspy.PySpyProbe()], job, speed=(1.0, "x"))
    fit2 = cost.plan(spec, [pyspy.PySpyProbe()], job, speed=(1.38, "x"))
    assert fit1.probes["pyspy"].basis.split(";")[0] == fit2.probes["pyspy"].basis.split(";")[0]
    assert fit2.probes["pyspy"].cpu_s == pytest.approx(fit1.probes["pyspy"].cpu_s * (share + (1 - share) * 1.38))


# -- the plan's speed factor: a start-up that compiled bytecode is not a measure of speed ----------

class _Spec:
    def __init__(self, origin: str, cached: str) -> None:
        self.origin, self.cached = origin, cached


class _Mod:
    def __init__(self, origin: str, cached: str) -> None:
        self.__spec__ = _Spec(origin, cached)


def test_compiled_modules_are_those_without_a_cache_or_with_one_written_since_the_start(tmp_path):
    import os

    from trainprobe.agent import cost
    old, new = tmp_path / "old.pyc", tmp_path / "new.pyc"
    old.write_bytes(b"")
    new.write_bytes(b"")
    os.utime(old, (1000.0, 1000.0))
    os.utime(new, (5000.0, 5000.0))
    mods = {"a": _Mod("/x/a.py", str(old)), "b": _Mod("/x/b.py", str(new)),
            "c": _Mod("/x/c.py", str(tmp_path / "missing.pyc")),
            "ext": _Mod("/x/ext.so", str(tmp_path / "missing2.pyc")), "builtin": object()}
    assert cost.compiled_this_run(mods, since=4000.0) == 2       # b (written since) and c (no cache)
    assert cost.compiled_this_run(mods, since=6000.0) == 1       # only c


def test_a_cold_start_up_plans_at_the_models_speed_and_says_why(tmp_path):
    """A real interpreter with an empty bytecode cache (PYTHONPYCACHEPREFIX): its start-up compiles
    every module, and the plan does not read that as a slow machine."""
    import os
    import subprocess
    import sys
    code = ("from trainprobe.agent import cost; cost.note_startup(); f, why = cost.machine_speed(); "
            "print(f); print(why)")
    env = {**os.environ, "PYTHONPYCACHEPREFIX": str(tmp_path / "pyc")}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    cold = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    f, why = cold.stdout.splitlines()
    assert float(f) == 1.0 and "compiled" in why and "bytecode" in why
    # The second start-up finds the cache the first wrote: a measure of speed again.
    import time
    time.sleep(0.3)
    warm = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert "compiled" not in warm.stdout and "start-up took" in warm.stdout


def test_the_plan_records_the_start_ups_unclamped_speed(monkeypatch):
    """The plan's factor is never below 1 (the budget's guard); the start-up's own ratio beside it,
    below 1 on a machine faster than the models, lets the cost benchmarks compare the model there."""
    monkeypatch.setattr(cost, "_startup", [(cost.AGENT_START_NOMINAL_CPU_S * 0.6, 0)])
    assert cost.machine_speed()[0] == 1.0
    assert abs(cost.startup_speed() - 0.6) < 1e-9
    p = cost.plan(WatchSpec(pid=1, window_s=10), [], JobShape(pid=1, processes=(1,)))
    assert p.to_dict()["speed_factor"] == 1.0 and p.to_dict()["startup_speed"] == 0.6
    monkeypatch.setattr(cost, "_startup", [(0.3, cost.COMPILED_MIN)])       # compiled bytecode: no measure
    assert cost.startup_speed() is None
    assert "startup_speed" not in cost.plan(WatchSpec(pid=1, window_s=10), [], JobShape(pid=1, processes=(1,))).to_dict()
