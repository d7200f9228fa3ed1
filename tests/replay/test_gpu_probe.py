"""The gpu probe: its parser on the real H200 NVML captures, its capture loop against a replayed
NVML at the library boundary, and the honest no-driver path on this machine."""
import json
import sys
import time
import types

import pytest

from trainprobe.probes.base import Capture, Recorder, WatchSpec
from trainprobe.probes.errors import Unavailable
from trainprobe.probes.gpu import (GpuProbe, analyse, cpulist_from_words, decode_clock_reasons, normalise,
                        pcie_link_gbps, sample_period_s)
from tests.helpers import H200_MODES, h200_gpu_capture, h200_nvml

# GPU utilization means the README of tests/data/h200 quotes for each capture.
README_UTIL = {"starved": 0.049, "fixed": 0.372, "healthy": 0.990, "sync": 0.125, "pageable": 0.176, "pinned": 0.990}


def parsed(mode):
    return GpuProbe.parse(h200_gpu_capture(mode))


@pytest.mark.parametrize("mode", H200_MODES)
def test_busy_fraction_matches_the_captured_nvml_mean(mode):
    g = parsed(mode)
    assert g["busy_fraction"] == pytest.approx(README_UTIL[mode], abs=0.006)
    assert g["idle_fraction"] == pytest.approx(1 - g["busy_fraction"], abs=1e-6)


@pytest.mark.parametrize("mode", H200_MODES)
def test_sample_period_is_200_ms_and_the_report_says_what_that_hides(mode):
    g = parsed(mode)
    assert g["sample_period_s"] == pytest.approx(0.2, abs=0.002)
    note = next(n for n in g["notes"] if "NVML samples" in n)
    assert "200 ms" in note and "cannot be resolved from NVML" in note


def test_the_target_is_found_on_its_gpu_through_nvml_process_samples():
    g = parsed("starved")
    assert g["target_gpus"] == [0] and g["target_pid"] == h200_nvml("starved")["pid"]
    assert {"pid": 903, "gpu_index": 0, "kind": "sampled", "used_memory_mb": None} in g["processes"]
    row = next(r for r in g["process_utilization"] if r["pid"] == 903)
    assert row["target"] and 3 <= row["sm_pct_mean"] <= 7


def test_only_in_window_samples_count():
    raw = h200_nvml("healthy")
    g = parsed("healthy")
    start = raw["started_unix_us"] / 1e6
    # ~110 samples in NVML's buffer, 13 s of them from before the window: only ~41 are the window's.
    assert len(raw["gpu_util"]) > 100
    assert 38 <= g["per_gpu"][0]["samples"] <= 42
    assert all(t >= start for t, _ in g["utilization"][0])


def test_device_facts_in_the_shape_other_rules_read():
    gpu = parsed("pinned")["gpus"][0]
    assert gpu["index"] == 0 and gpu["name"] == "NVIDIA H200" and gpu["bus_id"] == "00000000:00:06.0"
    assert gpu["pcie"]["gen"] == 5 and gpu["pcie"]["width"] == 16
    assert gpu["pcie"]["max_gen"] == 5 and gpu["pcie"]["max_width"] == 16
    assert gpu["pcie"]["link_gbps"] == pytest.approx(63.0, abs=0.1)
    # This capture stored the ctypes affinity array's repr, not its words: unknown, not a guess.
    assert gpu["cpu_affinity"] is None and gpu["numa_node"] is None


def test_pcie_throughput_tells_pageable_from_pinned_copies():
    rx = {m: parsed(m)["per_gpu"][0]["pcie"]["rx_gbps_mean"] for m in ("pageable", "pinned")}
    assert 6.0 < rx["pageable"] < 9.0
    assert 38.0 < rx["pinned"] < 47.0
    assert rx["pinned"] / rx["pageable"] > 5


def test_clock_event_reasons_are_decoded():
    assert parsed("healthy")["per_gpu"][0]["clocks_event_reasons"] == {"sw_power_cap": 1.0}
    assert parsed("sync")["per_gpu"][0]["clocks_event_reasons"] == {}
    assert decode_clock_reasons(0x1 | 0x40) == ["gpu_idle", "hw_thermal_slowdown"]
    assert decode_clock_reasons(None) == []


def test_idle_intervals_are_runs_of_fully_idle_periods():
    raw = h200_nvml("sync")
    start = raw["started_unix_us"]
    # Make one second of the window idle: five consecutive samples at 0%.
    zeroed = 0
    for s in raw["gpu_util"]:
        if start + 2_000_000 < s[0] <= start + 3_000_000:
            s[1] = 0
            zeroed += 1
    g = analyse(raw)
    assert zeroed == 5
    assert len(g["idle_intervals"]) == 1
    t0, t1 = g["idle_intervals"][0]
    assert t1 - t0 == pytest.approx(1.0, abs=0.02)
    st = g["per_gpu"][0]
    assert st["idle_seconds_in_idle_periods"] == pytest.approx(1.0, abs=0.02)
    assert st["utilization_histogram"]["0"] == 5
    # The rest of the idle time lies in partly busy periods: gaps NVML cannot place.
    assert st["idle_seconds_unresolved"] == pytest.approx(st["idle_seconds"] - 1.0, abs=0.02)


def test_helpers():
    assert cpulist_from_words([0xFFFF]) == "0-15"
    assert cpulist_from_words([0xF0F, 0x1]) == "0-3,8-11,64"
    assert cpulist_from_words([]) is None and cpulist_from_words(None) is None
    assert pcie_link_gbps(4, 16) == pytest.approx(31.5, abs=0.1)
    assert pcie_link_gbps(3, 8) == pytest.approx(7.88, abs=0.01)
    assert pcie_link_gbps(None, 16) is None
    assert sample_period_s([[0, 1], [200_000, 1], [400_000, 1], [601_000, 1]]) == 0.2
    assert sample_period_s([[0, 1]]) is None


def test_the_older_single_gpu_layout_is_normalised():
    d = normalise(h200_nvml("starved"))
    assert d["gpus"][0]["index"] == 0 and d["watched_pids"] == [903]
    assert d["gpus"][0]["device"]["cpu_affinity_words"] is None
    assert normalise(d) is d


def test_a_cpu_job_on_a_gpu_host_has_no_target_gpu():
    raw = h200_nvml("healthy")
    raw["pid"] = 4242                  # a process NVML never saw
    g = analyse(raw)
    assert g["target_gpus"] == [] and g["busy_fraction"] is None
    assert any("use no GPU" in n for n in g["notes"])
    assert g["gpus"]                   # the host's GPUs are still reported


# -- the capture loop, against NVML replayed at the library boundary --------------------------------

class _Err(Exception):
    def __init__(self, value):
        super().__init__(value)
        self.value = value


def _replaying_pynvml(mode, pid, t_shift_us, calls):
    """A pynvml stand-in that serves one real capture's samples as if they were arriving now."""
    raw = h200_nvml(mode)
    m = types.ModuleType("pynvml")
    m.NVML_ERROR_NOT_FOUND, m.NVML_ERROR_NOT_SUPPORTED = 6, 3
    m.NVML_GPU_UTILIZATION_SAMPLES, m.NVML_MEMORY_UTILIZATION_SAMPLES = 1, 2
    streams = {1: raw["gpu_util"], 2: raw["mem_util"]}

    def now_us():
        return int(time.time() * 1e6)

    def rec(name, fn):
        def wrapped(*a):
            calls.append((name, a[1:]))
            return fn(*a)
        setattr(m, name, wrapped)

    class Sample:
        def __init__(self, ts, v):
            self.timeStamp = ts
            self.sampleValue = types.SimpleNamespace(uiVal=v)

    def samples(h, kind, last):
        got = [Sample(ts + t_shift_us, v) for ts, v in streams[kind] if last < ts + t_shift_us <= now_us()]
        if not got:
            raise _Err(6)
        return 1, got

    def proc_util(h, last):
        got = [types.SimpleNamespace(pid=pid, timeStamp=ts + t_shift_us, smUtil=sm, memUtil=mu)
               for ts, _p, sm, mu in raw["proc_util"] if last < ts + t_shift_us <= now_us()]
        if not got:
            raise _Err(6)
        return got

    def unsupported(*a):
        raise _Err(3)

    rec("nvmlInit", lambda: None)
    rec("nvmlShutdown", lambda: None)
    rec("nvmlSystemGetDriverVersion", lambda: "580.159.04")
    rec("nvmlSystemGetNVMLVersion", lambda: "13.580.159.04")
    rec("nvmlSystemGetCudaDriverVersion", lambda: 13000)
    rec("nvmlDeviceGetCount", lambda: 1)
    rec("nvmlDeviceGetHandleByIndex", lambda i: ("gpu", i))
    rec("nvmlDeviceGetPciInfo", lambda h: types.SimpleNamespace(busId=b"00000000:00:06.0"))
    rec("nvmlDeviceGetMemoryInfo", lambda h: types.SimpleNamespace(total=150 * 2**30, used=3 * 2**30))
    rec("nvmlDeviceGetCpuAffinity", lambda h, n: [0xFFFF] + [0] * (n - 1))
    rec("nvmlDeviceGetNumaNodeId", unsupported)
    rec("nvmlDeviceGetName", lambda h: "NVIDIA H200")
    rec("nvmlDeviceGetUUID", lambda h: "GPU-0000")
    rec("nvmlDeviceGetCurrPcieLinkGeneration", lambda h: 5)
    rec("nvmlDeviceGetCurrPcieLinkWidth", lambda h: 16)
    rec("nvmlDeviceGetMaxPcieLinkGeneration", lambda h: 5)
    rec("nvmlDeviceGetMaxPcieLinkWidth", lambda h: 16)
    rec("nvmlDeviceGetEnforcedPowerLimit", lambda h: 700_000)
    rec("nvmlDeviceGetPersistenceMode", lambda h: 1)
    rec("nvmlDeviceGetSamples", samples)
    rec("nvmlDeviceGetProcessUtilization", proc_util)
    rec("nvmlDeviceGetUtilizationRates", lambda h: types.SimpleNamespace(gpu=99, memory=70))
    rec("nvmlDeviceGetPcieThroughput", lambda h, c: 81_000 if c == 1 else 18_000)
    rec("nvmlDeviceGetPowerUsage", lambda h: 690_000)
    rec("nvmlDeviceGetTemperature", lambda h, s: 59)
    rec("nvmlDeviceGetCurrentClocksEventReasons", lambda h: 0x4)
    rec("nvmlDeviceGetComputeRunningProcesses",
        lambda h: [types.SimpleNamespace(pid=pid, usedGpuMemory=8 * 2**30)])
    rec("nvmlDeviceGetGraphicsRunningProcesses", lambda h: [])
    return m, raw


def test_capture_reads_samples_incrementally_and_replays_through_the_parser(monkeypatch, tmp_path):
    calls = []
    raw = h200_nvml("healthy")
    # Shift the capture so that its window's samples arrive from now on.
    shift = int(time.time() * 1e6) - raw["started_unix_us"]
    fake, _ = _replaying_pynvml("healthy", 31337, shift, calls)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    dev = tmp_path / "sys/bus/pci/devices/0000:00:06.0"
    dev.mkdir(parents=True)
    (dev / "numa_node").write_text("0\n")
    (tmp_path / "proc/31337").mkdir(parents=True)
    (tmp_path / "proc/31337/maps").write_text(
        "7f0000000000-7f0000001000 r-xp 00000000 08:01 1 /usr/lib/x86_64-linux-gnu/libcuda.so.580.159.04\n")
    spec = WatchSpec(pid=31337, window_s=1.5, root=str(tmp_path), options={"gpu_poll_s": 0.25})
    cap = Capture("gpu")
    import threading
    rec = Recorder(cap, threading.Event())
    GpuProbe().capture(spec, rec, time.monotonic() + 1.5)
    out = json.loads(cap.artifacts["nvml.json"])
    g = out["gpus"][0]
    ts = [t for t, _ in g["gpu_util"]]
    assert ts == sorted(set(ts))                       # no sample read twice
    # The first read asks for everything NVML holds (0); every later one for what is newer than seen.
    lasts = [a[1] for name, a in calls if name == "nvmlDeviceGetSamples" and a[0] == 1]
    assert lasts[0] == 0 and all(b >= a for a, b in zip(lasts, lasts[1:])) and lasts[-1] > 0
    assert len(g["polls"]) >= 4 and len(g["pcie_rx_kbs"]) == len(g["polls"])
    assert g["device"]["numa_node"] == 0 and g["device"]["numa_source"] == "sysfs"
    assert g["errors"]["numa_node"] == "not supported on this GPU or driver"
    assert out["target_maps_cuda"] == ["/usr/lib/x86_64-linux-gnu/libcuda.so.580.159.04"]
    assert cap.meta["overhead"]["nvml_calls"] == len(calls) - 2     # nvmlInit and nvmlShutdown aside
    ev = GpuProbe.parse(cap)
    assert ev["target_gpus"] == [0] and ev["sample_period_s"] == pytest.approx(0.2, abs=0.002)
    assert ev["busy_fraction"] == pytest.approx(0.99, abs=0.01)
    assert ev["gpus"][0]["cpu_affinity"] == "0-15" and ev["gpus"][0]["numa_node"] == 0
    assert ev["per_gpu"][0]["clocks_event_reasons"] == {"sw_power_cap": 1.0}
    assert {"pid": 31337, "gpu_index": 0, "kind": "compute", "used_memory_mb": 8192.0} in ev["processes"]
    assert ev["per_gpu"][0]["power_limit_w"] == 700.0


# -- no driver on this machine ---------------------------------------------------------------------

def _driver_present():
    try:
        import pynvml
        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        return True
    except Exception:  # noqa: BLE001
        return False


@pytest.mark.skipif(_driver_present(), reason="an NVIDIA driver is present: the no-driver path cannot be seen")
def test_without_a_driver_the_probe_says_so():
    av = GpuProbe().check(WatchSpec(pid=1, window_s=1.0))
    assert not av.ok and "no NVIDIA driver" in av.reason and "libnvidia-ml.so" in av.reason
    import threading
    cap = Capture("gpu")
    with pytest.raises(Unavailable, match="no NVIDIA driver"):
        GpuProbe().capture(WatchSpec(pid=1, window_s=1.0), Recorder(cap, threading.Event()), time.monotonic() + 1)


def test_without_pynvml_the_probe_says_how_to_get_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)     # import pynvml -> ImportError
    av = GpuProbe().check(WatchSpec(pid=1, window_s=1.0))
    assert not av.ok and "pip install nvidia-ml-py" in av.reason


def test_without_a_sample_buffer_the_polls_stand_in_and_the_report_says_so():
    raw = h200_nvml("starved")
    raw["gpu_util"], raw["mem_util"] = [], []
    raw["errors"] = {"gpu_util": "not supported on this GPU or driver"}
    g = analyse(raw)
    st = g["per_gpu"][0]
    assert st["utilization_source"] == "nvmlDeviceGetUtilizationRates (polls)"
    assert g["sample_period_s"] == pytest.approx(0.547, abs=0.01)       # the polls' spacing
    assert g["busy_fraction"] == pytest.approx(0.055, abs=0.01)          # the polls read 5-6%
    assert any("no NVML utilization sample buffer" in n and "not supported" in n for n in g["notes"])


def test_evidence_shape_other_helpers_rely_on():
    g = parsed("fixed")
    for k in ("driver", "gpus", "processes", "target_gpus", "sample_period_s", "busy_fraction", "idle_fraction",
              "idle_intervals", "utilization"):
        assert k in g, k
    gpu = g["gpus"][0]
    assert set(gpu) >= {"index", "name", "uuid", "bus_id", "pcie", "cpu_affinity", "numa_node"}
    assert set(gpu["pcie"]) >= {"gen", "width", "max_gen", "max_width"}
    assert all(set(p) >= {"pid", "gpu_index"} for p in g["processes"])
    t, pct = g["utilization"][0][0]
    assert t > 1.7e9 and 0 <= pct <= 100
    assert g["driver"] == "580.159.04"
