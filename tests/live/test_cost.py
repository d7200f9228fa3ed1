"""The agent's own cost: the budget plan, the per-child rusage, NVML's call accounting, and the
reported overhead checked against the rusage of the whole agent tree measured from outside."""
from __future__ import annotations

import json
import resource
import subprocess
import sys
import threading
import time
import types

import pytest

from trainprobe.agent import cost
from trainprobe.probes import gpu as gpu_mod
from trainprobe.probes.base import Capture, JobShape, Recorder, WatchSpec
from trainprobe.probes.support.nvml import Nvml, is_na
from trainprobe.probes.pyspy import MAX_WORKER_SAMPLERS, MIN_MAIN_RATE_HZ, PySpyProbe, plan_sampling
from tests.helpers import PY, REPO, tree_rss_mb

BURN = "import time\nt=time.process_time()\nwhile time.process_time()-t<0.3: pass"


# -- the plan ------------------------------------------------------------------------------------

def _job(workers: int, cpus: float, ranks: int = 0) -> JobShape:
    kids = {100 + i: 1 for i in range(workers)}
    for r in range(ranks):
        kids[200 + r] = 1
        kids[300 + r] = 200 + r          # a rank's own worker: a grandchild of the target
    return JobShape(pid=1, processes=(1, *kids), children=kids, threads=40, cpu_capacity=cpus, cpu_capacity_basis="t")


def test_budget_is_one_percent_of_the_job_cpus_with_a_floor():
    assert cost.budget_cpu_s(_job(0, 16), 10.0)[0] == pytest.approx(1.6)
    assert cost.budget_cpu_s(_job(0, 2), 10.0)[0] == pytest.approx(0.3)        # the floor
    assert cost.budget_cpu_s(_job(0, 4.5), 20.0)[0] == pytest.approx(0.9)


def test_many_workers_are_sampled_in_rotation_within_the_budget():
    p = plan_sampling(10.0, _job(14, 16).processes, _job(14, 16).children, 1.0, 25)
    assert p["mode"] == "per_pid" and p["main_rate_hz"] >= 10
    assert sorted(w for slot in p["worker_slots"] for w in slot) == list(range(100, 114))   # every worker, once
    assert max(len(s) for s in p["worker_slots"]) <= MAX_WORKER_SAMPLERS
    assert 0 < p["worker_rate_hz"] <= p["main_rate_hz"]
    assert p["cpu_seconds"] <= 1.0


def test_a_small_budget_keeps_the_training_thread_and_drops_worker_stacks():
    # 0.09 CPU-s: the training thread's least sampling (150 samples at 0.43 ms and py-spy's start-up)
    # fits, no worker sampler does.
    p = plan_sampling(10.0, _job(8, 2).processes, _job(8, 2).children, 0.09, 25)
    assert p["main_rate_hz"] >= MIN_MAIN_RATE_HZ and p["worker_slots"] == []
    assert p["cpu_seconds"] <= 0.09
    assert plan_sampling(10.0, (1,), {}, 0.01, 25) is None


def test_a_launcher_keeps_one_sampler_over_the_tree_at_a_planned_rate():
    job = _job(0, 16, ranks=2)
    p = plan_sampling(10.0, job.processes, job.children, 1.0, 25)
    assert p["mode"] == "subprocesses" and MIN_MAIN_RATE_HZ <= p["main_rate_hz"] <= 25


def test_the_session_plan_fits_the_budget_and_says_what_it_skipped():
    from trainprobe.probes.gil import GilProbe
    spec = WatchSpec(pid=1, window_s=10.0)
    plan = cost.plan(spec, [PySpyProbe(), GilProbe()], _job(4, 16))
    assert plan.planned_cpu_s <= plan.budget_cpu_s + 1e-9
    assert spec.options["pyspy_plan"]["main_rate_hz"] >= MIN_MAIN_RATE_HZ
    small = cost.plan(WatchSpec(pid=1, window_s=10.0), [PySpyProbe(), GilProbe()], _job(0, 2))
    assert "pyspy" in small.probes and small.planned_rss_mb <= cost.BUDGET_RSS_MB
    assert "gil" in small.skipped and "budget" in small.skipped["gil"]     # a costly probe that does not fit
    assert small.over_budget                                              # py-spy kept at its minimum, said so
    big = WatchSpec(pid=1, window_s=10.0)
    cost.plan(big, [PySpyProbe(), GilProbe()], _job(0, 64))
    assert 1.0 <= big.options["gil_rate_hz"] <= 10.0


# -- children's rusage ---------------------------------------------------------------------------

def test_recorder_counts_the_cpu_of_every_child_it_started():
    rec = Recorder(Capture("t"), threading.Event())
    r = rec.run([PY, "-c", BURN], timeout_s=20)
    assert r.rc == 0
    p = rec.spawn([PY, "-c", BURN])
    rec.finish(p, grace_s=20)
    q = rec.spawn([PY, "-c", "import time; time.sleep(30)"])
    rec.stop_all()
    got = rec.children_cost()
    assert got["children"] == 3
    assert got["children_cpu_seconds"] >= 0.55          # two children burnt 0.3 CPU-s each
    assert got["by_command"][PY.rsplit("/", 1)[-1]]["runs"] == 3
    assert got["children_max_rss_mb"] > 5
    assert q.returncode is not None


def test_a_spawned_child_dies_with_the_agent_and_is_named_by_its_own_command():
    """A probe's child gets its stop signal when the agent dies (nothing stays attached), whether
    setpriv sets it (the vfork path: no Python code between fork and exec) or the preexec_fn does;
    its accounting and provenance name the command the probe ran, not the wrapper."""
    import os
    import signal
    from trainprobe.probes import base
    code = ("import subprocess, threading\n"
            "from trainprobe.probes.base import Capture, Recorder\n"
            "rec = Recorder(Capture('t'), threading.Event())\n"
            "p = rec.spawn(['/bin/sleep', '30'], stop_signal=15, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
            "print(p.pid, p.args[0], flush=True)\n"
            "import os, time; time.sleep(0.5); os._exit(0)\n")   # setpriv sets the signal after its exec
    out = subprocess.run([PY, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=30, check=True).stdout
    pid, argv0 = out.split()
    assert argv0 == "/bin/sleep"
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                if fh.read().rsplit(")", 1)[1].split()[0] == "Z":
                    break                  # killed, waiting for init to reap it
        except FileNotFoundError:
            break
        time.sleep(0.05)
    else:
        os.kill(int(pid), signal.SIGKILL)
        pytest.fail("the child outlived the agent")
    argv, kw = base._spawn_argv(["/bin/sleep", "1"], signal.SIGINT, {})
    if base._setpriv_binary():
        assert argv[:4] == [base._setpriv_binary(), "--pdeathsig", "SIGINT", "--"] and "preexec_fn" not in kw
    else:
        assert "preexec_fn" in kw
    # A bare name (its absence must stay an OSError) and a change of user keep the preexec_fn.
    assert "preexec_fn" in base._spawn_argv(["sleep", "1"], signal.SIGINT, {})[1]
    assert "preexec_fn" in base._spawn_argv(["/bin/sleep", "1"], signal.SIGINT, {"user": 0})[1]
    rec = Recorder(Capture("t"), threading.Event())
    rec.finish(rec.spawn(["/bin/sleep", "0.1"]), grace_s=5)
    assert list(rec.children_cost()["by_command"]) == ["sleep"]
    assert rec.capture.provenance[-1]["what"] == "/bin/sleep 0.1"


# -- NVML's call accounting (a stand-in pynvml at the module boundary: no GPU here) -------------

class _Sample:
    def __init__(self, ts: int, v: int):
        self.timeStamp, self.sampleValue = ts, types.SimpleNamespace(uiVal=v)


def _fake_pynvml(hang: set[str]) -> types.SimpleNamespace:
    calls: list[str] = []
    t0 = int(time.time() * 1e6)

    def fn(name, value=None):
        def call(*a):
            calls.append(name)
            if name in hang:
                time.sleep(1.0)
            return value(*a) if callable(value) else value
        call.__name__ = name
        return call

    def samples(h, kind, last):
        now = int(time.time() * 1e6)
        return 1, [_Sample(t, 50) for t in range(max(last + 1, t0), now, 200_000)]

    m = types.SimpleNamespace(calls=calls)
    for name, value in {
        "nvmlInit": None, "nvmlShutdown": None, "nvmlDeviceGetCount": 1, "nvmlDeviceGetHandleByIndex": "h0",
        "nvmlSystemGetDriverVersion": "580", "nvmlSystemGetNVMLVersion": "13", "nvmlSystemGetCudaDriverVersion": 13000,
        "nvmlDeviceGetSamples": samples, "nvmlDeviceGetProcessUtilization": [],
        "nvmlDeviceGetUtilizationRates": types.SimpleNamespace(gpu=50, memory=10),
        "nvmlDeviceGetPcieThroughput": 1000, "nvmlDeviceGetMemoryInfo": types.SimpleNamespace(used=1, total=2),
        "nvmlDeviceGetPowerUsage": 100000, "nvmlDeviceGetTemperature": 40, "nvmlDeviceGetCurrentClocksEventReasons": 0,
        "nvmlDeviceGetComputeRunningProcesses": [], "nvmlDeviceGetGraphicsRunningProcesses": [],
        "nvmlDeviceGetName": "H200", "nvmlDeviceGetUUID": "GPU-x",
    }.items():
        setattr(m, name, fn(name, value))
    return m


def test_every_nvml_call_is_counted_and_timed_and_a_hung_call_times_out():
    fake = _fake_pynvml(hang={"nvmlDeviceGetPowerUsage"})
    nv = Nvml(timeout_s=0.3)
    nv.pynvml = fake
    assert nv.call("nvmlDeviceGetCount") == 1
    assert is_na(nv.call("nvmlDeviceGetPowerUsage"))            # hangs past the timeout
    assert nv.call("nvmlDeviceGetTemperature", "h0", 0) == 40     # the next call still works
    acct = nv.accounting()
    assert acct["nvml_calls"] == 3
    assert acct["nvml_calls_by_name"]["nvmlDeviceGetPowerUsage"]["seconds"] >= 0.3
    assert set(acct["nvml_calls_by_name"]) == {"nvmlDeviceGetCount", "nvmlDeviceGetPowerUsage",
                                               "nvmlDeviceGetTemperature"}
    nv.close()


def test_gpu_capture_reads_sample_buffers_rarely_and_per_process_only_when_shared(monkeypatch):
    fake = _fake_pynvml(hang=set())
    monkeypatch.setattr(gpu_mod, "SAMPLES_EVERY_S", 1.0)
    nv = Nvml(timeout_s=2.0)
    nv.pynvml = fake
    spec = WatchSpec(pid=1, window_s=2.5, options={"gpu_poll_s": 0.25})
    rec = Recorder(Capture("gpu"), threading.Event())
    raw = gpu_mod._Capturer(nv, spec, rec).run(time.monotonic() + 2.5, 0.25)
    n = {k: v["calls"] for k, v in nv.accounting()["nvml_calls_by_name"].items()}
    polls = n["nvmlDeviceGetPowerUsage"]
    assert polls >= 8                                           # one per 0.25 s poll
    # Two buffers (GPU and memory utilization), read at the start, every 1 s and once after: not every poll.
    assert n["nvmlDeviceGetSamples"] <= 2 * 5 < 2 * polls
    assert "nvmlDeviceGetProcessUtilization" not in n          # only the job on the GPU: not needed
    assert len(raw["gpus"][0]["gpu_util"]) >= 10                # nothing lost: ~one sample per 200 ms


# -- the reported overhead against the agent tree's rusage, measured from outside ----------------

@pytest.mark.parametrize("workers", ["0", "2"])
def test_reported_overhead_matches_the_rusage_of_the_whole_agent_tree(workload, workers):
    w = workload("--num-workers", workers, "--seconds", "60")
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    p = subprocess.Popen([PY, "-m", "trainprobe.agent", "diagnose", "--pid", str(w.pid), "--duration", "3", "--json"],
                         cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak = 0.0
    while p.poll() is None:                      # the tree's resident memory, from outside
        try:
            peak = max(peak, tree_rss_mb(p.pid))
        except Exception:  # noqa: BLE001 - the tree changes under us
            pass
        time.sleep(0.1)
    out, err = p.communicate()
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert p.returncode == 0, err[-2000:]
    measured = (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime)
    ov = json.loads(out)["overhead"]
    by_probe = ov["by_probe"]
    assert by_probe["pyspy"]["children"] >= 1 and by_probe["pyspy"]["children_cpu_seconds"] > 0
    assert ov["untracked_children_cpu_seconds"] <= 0.02
    # Reported before rendering and exit: never more than the tree used, and at most 0.1 CPU-s
    # (rendering, interpreter exit) or 15% below it.
    assert ov["agent_cpu_seconds"] <= measured + 0.02
    assert ov["agent_cpu_seconds"] >= measured - max(0.1, 0.15 * measured), (ov, measured)
    # RSS: the session samples the tree every 0.3 s until its probes finish, the test every 0.1 s.
    assert 0.7 * peak <= ov["agent_max_rss_mb"] <= 1.3 * peak + 5, (ov["agent_max_rss_mb"], peak)


def test_text_report_says_what_was_sampled_and_how_precisely():
    from trainprobe.reports.text import sampling_line
    line = sampling_line({"training_process": {"rate_hz": 25, "samples": 250, "share_half_width_95": 0.063},
                          "workers": {"known": 14, "sampled": 14, "rate_hz": 12, "samples": 240,
                                      "rotation": "2 at a time", "share_half_width_95": 0.065}})
    assert "25 Hz" in line and "250 samples" in line and "+-6 pts" in line and "14 of 14 at 12 Hz" in line
    line = sampling_line({"training_process": {"rate_hz": 10, "samples": 100, "share_half_width_95": 0.1},
                          "workers": {"known": 8, "sampled": 0}})
    assert "8 not sampled by py-spy" in line
    assert sampling_line({}) is None


def test_workers_are_sampled_in_rotation_by_per_pid_samplers(workload):
    """A real job with 3 workers; py-spy planned with room for workers: the target has its own
    sampler, the workers are sampled in slots (2 at a time), and the evidence sees every worker."""
    from trainprobe.agent.session import run_session
    from trainprobe.probes.parsers import procfs
    w = workload("--num-workers", "3", "--persistent-workers", "--seconds", "60", warmup_lines=2)
    kids = dict(procfs.descendants_of(w.pid))
    procs = (w.pid, *kids)
    spec = WatchSpec(pid=w.pid, window_s=4.0)
    spec.options["pyspy_plan"] = plan_sampling(4.0, procs, kids, 10.0, 20)
    assert len(spec.options["pyspy_plan"]["worker_slots"]) == 2
    res = run_session(spec, [PySpyProbe()], progress=lambda m: None)
    cap = res.captures[0]
    assert cap.status == "ok", cap.reason
    ev = PySpyProbe.parse(cap)
    assert ev["training_thread"]["seconds"] > 2.0
    assert ev["workers"]["count"] == 3                                # every worker, though never all at once
    assert set(cap.meta["sampling"]["workers_sampled"]) == {str(p) for p in kids}
    assert ev["workers"]["busy_fraction"] is not None
    assert res.overhead["by_probe"]["pyspy"]["children"] == 4          # the target's sampler and 3 worker samplers


def test_a_gpu_node_job_with_14_workers_gets_its_workers_sampled_within_the_budget():
    """The H200 node's 14-worker job (15 processes, 19 threads in the target): the models measured
    there leave room for every worker at a lower rate than the training thread, under 1% of 16 CPUs."""
    from trainprobe.agent.session import select_probes
    kids = {100 + i: 1 for i in range(14)}
    job = JobShape(pid=1, processes=(1, *kids), children=kids, threads=19, cpu_capacity=16.0, cpu_capacity_basis="t")
    spec = WatchSpec(pid=1, window_s=10.0, rate_hz=25)
    plan = cost.plan(spec, [p for p in select_probes() if p.name != "perfstat"], job)
    p = spec.options["pyspy_plan"]
    assert plan.planned_cpu_s <= cost.PLAN_MARGIN * plan.budget_cpu_s + 1e-9 and not plan.over_budget
    assert sorted(w for slot in p["worker_slots"] for w in slot) == sorted(kids)
    assert 0 < p["worker_rate_hz"] < p["main_rate_hz"]


def test_a_default_diagnosis_imports_neither_the_deep_probes_nor_pynvml_without_a_driver():
    """The command's start-up is most of its cost on a job without workers: the --deep probes'
    modules (and bcc's loader) are imported only when asked for, and pynvml only where the NVIDIA
    library loads."""
    code = ("import sys\n"
            "from trainprobe.agent.session import select_probes\n"
            "from trainprobe.probes.support.nvml import Nvml\n"
            "from trainprobe.probes.errors import Unavailable\n"
            "names = [p.name for p in select_probes()]\n"
            "try:\n    Nvml().open(); print('NVML')\nexcept Unavailable as e:\n    print('UNAVAILABLE', e)\n"
            "print(sorted(m for m in sys.modules if m.rsplit('.', 1)[-1] in "
            "('gil', 'sched', 'syscalls', 'throttle', 'bcc_support', 'pynvml', 'bundle', 'visuals')))\n"
            "print(names)\n")
    out = subprocess.run([PY, "-c", code], cwd=REPO, capture_output=True, text=True, check=True).stdout.splitlines()
    names = eval(out[-1])  # noqa: S307 - our own child's repr of a list of names
    assert "pyspy" in names and not {"gil", "sched", "syscalls", "throttle"} & set(names)
    deep_mods = eval(out[-2])  # noqa: S307
    if out[0] == "NVML":          # a GPU host: pynvml is the probe's own
        deep_mods = [m for m in deep_mods if m != "pynvml"]
    else:
        assert "no NVIDIA driver" in out[0]
    assert deep_mods == []
    deep = subprocess.run([PY, "-c", "import sys\nfrom trainprobe.agent.session import select_probes\n"
                           "print(sorted(p.name for p in select_probes(deep=True)))"],
                          cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert all(n in deep for n in ("gil", "sched", "syscalls", "throttle"))
