"""GPU probe: the GPUs, which of them the target uses, and how busy they were over the window (NVML).

Every NVML call goes through probes/support/nvml.py (`Nvml.call`), so a metric a GPU or driver lacks is an
NA with its reason, never an exception. At the start it reads each GPU's identity (name, UUID, PCI
bus id, PCIe generation and width, CPU affinity, NUMA node) and the driver version. Then it polls
within a call budget (docs/cost.md):

- every 5 s and once after the window, `nvmlDeviceGetSamples` for GPU and memory utilization, read
  incrementally: each read asks only for the samples newer than the last timestamp seen. NVML fills
  its own buffer once per sample period (200 ms on an H200) and keeps ~20 s of it, so 5 s reads lose
  nothing;
- with the same reads, `nvmlDeviceGetProcessUtilization` (per-process SM and memory utilization,
  also incremental), only when another process than the job holds a context on the GPU: otherwise
  the GPU's utilization is the job's;
- every 1 s, PCIe TX/RX throughput, memory used, power, temperature, clock-event (throttle) reasons;
- every 5 s, the compute and graphics process lists (which PIDs hold a context on which GPU).

The raw artifact `nvml.json` keeps NVML's own timestamps (µs since the epoch), so GPU samples and
host evidence (py-spy's wall-clock timeline) sit on one clock. A single-GPU capture in the older
layout (tests/data/h200/*/nvml.json) replays through the same parser. Cost: about ten NVML calls per
GPU per poll (their wall time is measured into capture.meta["overhead"]); nothing attaches to the
target.
"""
from __future__ import annotations

import json
import os
import time
from typing import Any

from trainprobe.probes.parsers import procfs
from trainprobe.probes.base import Availability, Capture, JobShape, Probe, ProbeCost, Recorder, WatchSpec
from trainprobe.probes.schema import GpuEvidence
from trainprobe.probes.errors import Unavailable, parser
from trainprobe.probes.parsers.hw import canonical_bdf, clock_event_keys, cpulist_from_nvml_words, link_gbps, nvml_affinity_words
from trainprobe.probes.support.nvml import (NA, Nvml, is_na, read_device_identity, read_error_counters,
                                            read_max_sm_clock, read_pcie_link, read_sm_clock)

FORMAT = "trainprobe.nvml/1"
POLL_S = 1.0                   # power, temperature, PCIe throughput, memory used, clock reasons
# NVML keeps about 20 s of utilization samples (one per 200 ms on an H200: a 100-entry buffer), so
# reading them every 5 s loses nothing and costs a fifth of reading them every second.
SAMPLES_EVERY_S = 5.0
PROCESS_LIST_EVERY_S = 5.0
# Nvml's reasons that mean "no sample newer than asked" (NVML_ERROR_NOT_FOUND), or an empty list
# that pynvml reports as an error with NVML's success code.
NO_NEW_SAMPLES = ("not found", "Success")

# NVML sampling types and counters (the values pynvml defines; used when pynvml lacks the name).
GPU_UTILIZATION_SAMPLES = 1
MEMORY_UTILIZATION_SAMPLES = 2
PCIE_TX, PCIE_RX = 0, 1
TEMPERATURE_GPU = 0


# Keys of one GPU's record in nvml.json (the older single-GPU layout has them at the top level).
PER_GPU_KEYS = ("device", "gpu_util", "mem_util", "proc_util", "polls", "pcie_tx_kbs", "pcie_rx_kbs",
                "mem_used", "power_mw", "temp_c", "clocks_event_reasons", "sm_clock_mhz", "processes", "errors",
                "counters_start", "counters_end")

CUDA_LIBS = ("libcuda.so", "libcudart", "libnvidia-ml")


class GpuProbe(Probe):
    name = "gpu"
    description = "NVIDIA GPUs (NVML): which the target uses, utilization samples, PCIe throughput, power, clocks"
    needs = ("an NVIDIA driver (libnvidia-ml.so)", "nvidia-ml-py")
    cost = "about ten NVML calls per GPU every 0.5 s; nothing attaches to the target"
    timeout_s = 10.0
    evidence_schema = GpuEvidence

    def check(self, spec: WatchSpec) -> Availability:
        nv = Nvml(timeout_s=5.0)
        try:
            nv.open()
        except Unavailable as exc:
            return Availability.no(str(exc))
        try:
            count = nv.call("nvmlDeviceGetCount")
        finally:
            nv.close()
        if is_na(count):
            return Availability.no(f"NVML could not count the GPUs: {count.reason}")
        if not count:
            return Availability.no("NVML sees no NVIDIA GPU on this host")
        return Availability.yes()

    # Measured on the H200 node: the probe's thread 0.02 CPU-s and the NVML thread's calls 0.05 per
    # 10 s window (104 calls; nvmlInit and the device facts are most of it).
    cost_cpu_s_fixed = 0.03
    cost_cpu_s_per_s = 0.004       # per GPU: ~10 calls a second

    def estimate_cost(self, spec: WatchSpec, job: JobShape) -> ProbeCost:
        poll_s = float(spec.options.get("gpu_poll_s", POLL_S))
        return ProbeCost(self.cost_cpu_s_fixed + self.cost_cpu_s_per_s * spec.window_s * POLL_S / poll_s, 0.0,
                         f"per GPU: 8 calls per {poll_s:g} s poll, samples every {SAMPLES_EVERY_S:g} s")

    def capture(self, spec: WatchSpec, rec: Recorder, deadline_monotonic: float) -> None:
        poll_s = float(spec.options.get("gpu_poll_s", POLL_S))
        nv = Nvml(timeout_s=5.0)
        t0 = time.time()
        nv.open()                                       # Unavailable: the session records the reason
        rec.note("nvml", "nvmlInit", 0, t0, time.time() - t0)
        try:
            raw = _Capturer(nv, spec, rec).run(deadline_monotonic, poll_s)
        finally:
            nv.close()
        rec.add("nvml.json", json.dumps(raw, separators=(",", ":")))
        acct = nv.accounting()
        rec.note("nvml", f"{acct['nvml_calls']} NVML calls over {len(raw['gpus'])} GPU(s)", 0, t0, time.time() - t0)
        rec.capture.meta["overhead"] = {**acct, "poll_interval_s": poll_s, "samples_every_s": SAMPLES_EVERY_S,
                                        "process_lists_every_s": PROCESS_LIST_EVERY_S}
        # The NVML thread's CPU is this probe's too (the session adds it to the probe's thread CPU).
        rec.capture.meta["helper_thread_cpu_seconds"] = acct["nvml_call_cpu_seconds"]

    @staticmethod
    def parse(capture: Capture) -> GpuEvidence:
        return analyse(json.loads(capture.artifacts["nvml.json"]))


def _us() -> int:
    return int(time.time() * 1e6)


class _Capturer:
    """One capture: device facts once, then polls until the window ends."""

    def __init__(self, nv: Nvml, spec: WatchSpec, rec: Recorder):
        self.nv, self.spec, self.rec = nv, spec, rec
        self.handles: list[Any] = []
        self.gpus: list[dict[str, Any]] = []
        self.last_seen: dict[tuple[int, str], int] = {}
        self.watched: set[int] = {spec.pid, *spec.child_pids}
        self.errors: dict[str, str] = {}

    def _err(self, g: dict[str, Any] | None, what: str, v: NA) -> None:
        (g["errors"] if g is not None else self.errors).setdefault(what, v.reason)

    def _val(self, g: dict[str, Any] | None, what: str, name: str, *args: Any) -> Any:
        v = self.nv.call(name, *args)
        if is_na(v):
            self._err(g, what, v)
            return None
        return v

    def run(self, deadline_monotonic: float, poll_s: float) -> dict[str, Any]:
        nv = self.nv
        system = {
            "driver": _text(self._val(None, "driver", "nvmlSystemGetDriverVersion")),
            "nvml_version": _text(self._val(None, "nvml_version", "nvmlSystemGetNVMLVersion")),
            "cuda_driver_version": self._val(None, "cuda_driver_version", "nvmlSystemGetCudaDriverVersion"),
        }
        count = nv.call("nvmlDeviceGetCount")
        if is_na(count):
            raise Unavailable(f"NVML could not count the GPUs: {count.reason}")
        for i in range(int(count)):
            h = nv.call("nvmlDeviceGetHandleByIndex", i)
            g: dict[str, Any] = {"index": i, "errors": {}, "gpu_util": [], "mem_util": [], "proc_util": [],
                                 "polls": [], "pcie_tx_kbs": [], "pcie_rx_kbs": [], "mem_used": [],
                                 "power_mw": [], "temp_c": [], "clocks_event_reasons": [], "sm_clock_mhz": [],
                                 "processes": []}
            if is_na(h):
                g["errors"]["handle"] = h.reason
                g["device"] = {}
                self.gpus.append(g)
                self.handles.append(None)
                continue
            self.handles.append(h)
            g["device"] = self._device(g, h, system)
            g["counters_start"] = self._counters(g, h)
            self.gpus.append(g)
        maps_cuda = self._target_maps_cuda()
        gpu_devices = self._target_gpu_devices()
        started = _us()
        last_lists = last_samples = 0.0
        polls = 0
        while True:
            now_m = time.monotonic()
            if now_m - last_lists >= PROCESS_LIST_EVERY_S or polls == 0:
                self._refresh_watched()
                for g, h in zip(self.gpus, self.handles):
                    if h is not None:
                        self._process_lists(g, h)
                last_lists = now_m
            read_samples = polls == 0 or now_m - last_samples >= SAMPLES_EVERY_S
            for g, h in zip(self.gpus, self.handles):
                if h is not None:
                    if read_samples:
                        self._samples(g, h)
                    self._poll(g, h)
            if read_samples:
                last_samples = now_m
            polls += 1
            if self.rec.stop.is_set() or time.monotonic() >= deadline_monotonic:
                break
            self.rec.stop.wait(min(poll_s, max(0.0, deadline_monotonic - time.monotonic())))
        # The samples of the window's last period arrive after it ends: one more read catches them.
        if not self.rec.stop.is_set():
            for g, h in zip(self.gpus, self.handles):
                if h is not None:
                    self._samples(g, h)
        for g, h in zip(self.gpus, self.handles):
            if h is not None:
                g["counters_end"] = self._counters(g, h)
        return {
            "format": FORMAT, "pid": self.spec.pid, "watched_pids": sorted(self.watched),
            "target_maps_cuda": maps_cuda, "target_gpu_devices": gpu_devices,
            "started_unix_us": started, "ended_unix_us": _us(),
            "poll_interval_s": poll_s, "system": system, "gpus": self.gpus, "errors": self.errors,
        }

    # -- once per GPU ---------------------------------------------------------------------------
    def _device(self, g: dict[str, Any], h: Any, system: dict[str, Any]) -> dict[str, Any]:
        v = lambda what, name, *a: self._val(g, what, name, h, *a)  # noqa: E731
        call = lambda what, name, *a: self._val(g, what, name, *a)  # noqa: E731
        ident = read_device_identity(call, h)
        busid = _text(ident["bus_id"])
        mem = v("memory", "nvmlDeviceGetMemoryInfo")
        ncpu = os.cpu_count() or 64
        words = v("cpu_affinity", "nvmlDeviceGetCpuAffinity", nvml_affinity_words(ncpu))
        numa = v("numa_node", "nvmlDeviceGetNumaNodeId")
        numa_source = "nvml" if numa is not None else None
        if numa is None and busid:
            numa = self._sysfs_numa(busid)
            numa_source = "sysfs" if numa is not None else None
        link = read_pcie_link(call, h)
        return {
            "name": _text(ident["name"]), "uuid": _text(ident["uuid"]),
            "bus_id": busid,
            "pcie_gen": link["gen"], "pcie_width": link["width"],
            "pcie_max_gen": link["max_gen"], "pcie_max_width": link["max_width"],
            "cpu_affinity_words": [int(w) for w in words] if words is not None else None,
            "numa_node": numa, "numa_source": numa_source,
            "mem_total": getattr(mem, "total", None) if mem is not None else None,
            "power_limit_mw": v("power_limit", "nvmlDeviceGetEnforcedPowerLimit"),
            "max_sm_clock_mhz": read_max_sm_clock(call, self.nv.const, h),
            "persistence": v("persistence", "nvmlDeviceGetPersistenceMode"),
            "driver": system.get("driver"),
        }

    def _counters(self, g: dict[str, Any], h: Any) -> dict[str, Any]:
        """PCIe replays and volatile ECC errors so far (read at both ends of the window)."""
        return read_error_counters(lambda what, name, *a: self._val(g, what, name, *a), self.nv.const, h)

    def _sysfs_numa(self, busid: str) -> int | None:
        bdf = canonical_bdf(busid)
        if bdf is None:
            return None
        path = procfs.path(self.spec.root, f"sys/bus/pci/devices/{bdf}/numa_node")
        try:
            text = self.rec.read_file(path, artifact=f"numa_node:{bdf}")
        except Exception:  # noqa: BLE001 - no sysfs entry: the node is simply unknown
            return None
        try:
            return int(text.strip())
        except ValueError:
            return None

    def _target_gpu_devices(self) -> list[str] | None:
        """The NVIDIA device files (/dev/nvidia0, nvidiactl, nvidia-uvm) the target holds open: a CUDA
        context opens them, while a CUDA build of torch maps libcudart whether or not it uses a GPU.
        None when the fd table cannot be read (another user's process without ptrace access)."""
        base = procfs.path(self.spec.root, f"proc/{self.spec.pid}/fd")
        try:
            names = os.listdir(base)[:4096]
        except OSError:
            return None
        out = set()
        for n in names:
            try:
                link = os.readlink(os.path.join(base, n))
            except OSError:
                continue
            if link.startswith("/dev/nvidia"):
                out.add(link)
        self.rec.note("file", base, 0, time.time(), 0.0)
        return sorted(out)

    def _target_maps_cuda(self) -> list[str]:
        """The CUDA libraries the target has mapped: says whether it uses a GPU at all."""
        text = procfs.try_read_text(self.spec.root, f"proc/{self.spec.pid}/maps") or ""
        self.rec.note("file", procfs.path(self.spec.root, f"proc/{self.spec.pid}/maps"), 0, time.time(), 0.0)
        return sorted({lib for lib in procfs.parse_maps_libraries(text) if any(m in lib for m in CUDA_LIBS)})

    def _refresh_watched(self) -> None:
        try:
            self.watched.update(p for p, _pp in procfs.descendants_of(self.spec.pid, self.spec.root))
        except Exception:  # noqa: BLE001 - the target exited: keep the PIDs already known
            pass

    # -- every poll -----------------------------------------------------------------------------
    def _samples(self, g: dict[str, Any], h: Any) -> None:
        for key, kind in (("gpu_util", GPU_UTILIZATION_SAMPLES), ("mem_util", MEMORY_UTILIZATION_SAMPLES)):
            const = self.nv.const("NVML_GPU_UTILIZATION_SAMPLES" if kind == 1 else "NVML_MEMORY_UTILIZATION_SAMPLES",
                                  kind)
            last = self.last_seen.get((g["index"], key), 0)
            got = self.nv.call("nvmlDeviceGetSamples", h, const, last)
            if is_na(got):
                if got.reason not in NO_NEW_SAMPLES:
                    self._err(g, key, got)
                continue
            vtype, samples = got
            for s in samples:
                ts = int(s.timeStamp)
                if ts > last:
                    g[key].append([ts, _sample_value(s.sampleValue, vtype)])
                    self.last_seen[(g["index"], key)] = max(self.last_seen.get((g["index"], key), 0), ts)
        if not self._shared(g):
            return
        last = self.last_seen.get((g["index"], "proc_util"), 0)
        got = self.nv.call("nvmlDeviceGetProcessUtilization", h, last)
        if is_na(got):
            if got.reason not in NO_NEW_SAMPLES:
                self._err(g, "proc_util", got)
            return
        for s in got:
            ts = int(s.timeStamp)
            if ts > last:
                g["proc_util"].append([ts, int(s.pid), int(s.smUtil), int(s.memUtil)])
                self.last_seen[(g["index"], "proc_util")] = max(self.last_seen.get((g["index"], "proc_util"), 0), ts)

    def _shared(self, g: dict[str, Any]) -> bool:
        """Whether a process outside the job holds a context on this GPU (then per-process
        utilization is needed to tell the job's share); unknown lists count as shared."""
        if not g["processes"]:
            return "compute_processes" in g["errors"]
        return any(pid not in self.watched for _ts, pid, _k, _m in g["processes"])

    def _poll(self, g: dict[str, Any], h: Any) -> None:
        ts = _us()
        rates = self._val(g, "utilization_rates", "nvmlDeviceGetUtilizationRates", h)
        g["polls"].append([ts, getattr(rates, "gpu", None), getattr(rates, "memory", None)])
        g["pcie_tx_kbs"].append(self._val(g, "pcie_tx", "nvmlDeviceGetPcieThroughput", h,
                                          self.nv.const("NVML_PCIE_UTIL_TX_BYTES", PCIE_TX)))
        g["pcie_rx_kbs"].append(self._val(g, "pcie_rx", "nvmlDeviceGetPcieThroughput", h,
                                          self.nv.const("NVML_PCIE_UTIL_RX_BYTES", PCIE_RX)))
        mem = self._val(g, "memory", "nvmlDeviceGetMemoryInfo", h)
        g["mem_used"].append(getattr(mem, "used", None) if mem is not None else None)
        g["power_mw"].append(self._val(g, "power", "nvmlDeviceGetPowerUsage", h))
        g["temp_c"].append(self._val(g, "temperature", "nvmlDeviceGetTemperature", h,
                                     self.nv.const("NVML_TEMPERATURE_GPU", TEMPERATURE_GPU)))
        reasons = self.nv.call("nvmlDeviceGetCurrentClocksEventReasons", h)
        if is_na(reasons):   # drivers before the rename only have the older name
            reasons = self.nv.call("nvmlDeviceGetCurrentClocksThrottleReasons", h)
        if is_na(reasons):
            self._err(g, "clocks_event_reasons", reasons)
            reasons = None
        g["clocks_event_reasons"].append(reasons)
        g["sm_clock_mhz"].append(read_sm_clock(lambda what, name, *a: self._val(g, what, name, *a), self.nv.const, h))

    def _process_lists(self, g: dict[str, Any], h: Any) -> None:
        ts = _us()
        for kind, name in (("compute", "nvmlDeviceGetComputeRunningProcesses"),
                           ("graphics", "nvmlDeviceGetGraphicsRunningProcesses")):
            procs = self._val(g, f"{kind}_processes", name, h)
            for p in procs or []:
                used = getattr(p, "usedGpuMemory", None)
                g["processes"].append([ts, int(p.pid), kind, int(used) if used is not None else None])


def _text(v: Any) -> str | None:
    if v is None:
        return None
    if isinstance(v, bytes):
        return v.decode(errors="replace")
    return str(v)


_VALUE_FIELDS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}


def _sample_value(value: Any, vtype: int) -> float | int:
    v = getattr(value, _VALUE_FIELDS.get(int(vtype), "uiVal"))
    return float(v) if int(vtype) == 0 else int(v)


# -- parsing (pure) ------------------------------------------------------------------------------

def capture_from_nvml_json(text: str) -> Capture:
    """A Capture from an nvml.json written elsewhere (an archived capture, or the H200 fixtures)."""
    d = json.loads(text)
    started = float(d.get("started_unix_us") or 0) / 1e6
    cap = Capture("gpu", started_unix=started)
    cap.artifacts["nvml.json"] = text
    cap.meta["imported"] = True
    return cap


@parser("NVML values normalise")
def normalise(d: dict[str, Any]) -> dict[str, Any]:
    """Either layout -> the multi-GPU layout. The older single-GPU capture keeps one GPU's fields at
    the top level and records neither the end of its window nor the process lists."""
    if "gpus" in d:
        return d
    g = {k: d[k] for k in PER_GPU_KEYS if k in d}
    g["index"] = 0
    g.setdefault("errors", {})
    dev = dict(g.get("device") or {})
    if not isinstance(dev.get("cpu_affinity_words"), list):
        dev["cpu_affinity_words"] = None     # that capture stored the ctypes array's repr, not its words
    g["device"] = dev
    return {"format": "single-gpu", "pid": d.get("pid"), "watched_pids": [d.get("pid")],
            "target_maps_cuda": None, "started_unix_us": d.get("started_unix_us"),
            "ended_unix_us": d.get("ended_unix_us"), "system": {"driver": dev.get("driver")}, "gpus": [g]}


cpulist_from_words = parser("NVML values cpulist_from_words")(cpulist_from_nvml_words)
decode_clock_reasons = parser("NVML values decode_clock_reasons")(clock_event_keys)


@parser("NVML values pcie_link_gbps")
def pcie_link_gbps(gen: Any, width: Any) -> float | None:
    """One direction's ceiling of a PCIe link in GB/s, to the report's precision (Gen5 x16: 63.02)."""
    gbps = link_gbps(gen, width)
    return None if gbps is None else round(gbps, 2)


def sample_period_s(samples: list[list[Any]]) -> float | None:
    """NVML's sample period: the median spacing of the utilization samples, to the millisecond."""
    import statistics  # noqa: PLC0415 - only where GPU evidence is read
    ts = sorted({int(t) for t, _v in samples})
    if len(ts) < 3:
        return None
    return round(statistics.median(b - a for a, b in zip(ts, ts[1:])) / 1e6, 3)


def _window(d: dict[str, Any]) -> tuple[float, float]:
    start = float(d.get("started_unix_us") or 0) / 1e6
    end = d.get("ended_unix_us")
    if end:
        return start, float(end) / 1e6
    # No recorded end: the last thing the capture did (its last poll or process-utilization read).
    last = [t for g in d["gpus"] for key in ("polls", "proc_util") for t, *_ in (g.get(key) or [])]
    return start, (max(last) / 1e6 if last else start)


def periods(samples: list[list[Any]], period_s: float, start: float, end: float) -> list[tuple[float, float, float]]:
    """In-window samples as (t0_unix, t1_unix, value): each NVML sample describes the period that
    ends at its timestamp. A sample counts when the middle of its period lies in the window."""
    out = []
    prev = None
    for ts, v in sorted(samples, key=lambda s: s[0]):
        t1 = float(ts) / 1e6
        span = period_s if prev is None or t1 - prev > 1.5 * period_s else t1 - prev
        prev = t1
        if v is None:
            continue
        t0 = t1 - span
        mid = (t0 + t1) / 2.0
        if start <= mid <= end:
            out.append((t0, t1, float(v)))
    return out


def idle_runs(pers: list[tuple[float, float, float]], period_s: float) -> list[list[float]]:
    """Runs of consecutive sample periods in which the GPU ran no kernel at all (0%)."""
    runs: list[list[float]] = []
    for t0, t1, v in pers:
        if v > 0:
            continue
        if runs and t0 - runs[-1][1] <= 0.5 * period_s:
            runs[-1][1] = t1
        else:
            runs.append([t0, t1])
    return [[round(a, 4), round(b, 4)] for a, b in runs]


def intersect(a: list[list[float]], b: list[list[float]]) -> list[list[float]]:
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if hi > lo:
            out.append([lo, hi])
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


UTIL_BINS = ((0, 0, "0"), (1, 24, "1-24"), (25, 49, "25-49"), (50, 74, "50-74"), (75, 94, "75-94"),
             (95, 100, "95-100"))


def utilization_series(g: dict[str, Any]) -> tuple[list[list[Any]], list[list[Any]], str]:
    """(GPU, memory) utilization samples and where they came from. Where NVML keeps no sample
    buffer (nvmlDeviceGetSamples unsupported), the polls' nvmlDeviceGetUtilizationRates readings
    stand in: one reading per poll, each about NVML's last sample period only."""
    if len(g.get("gpu_util") or []) >= 3:
        return g["gpu_util"], g.get("mem_util") or [], "nvmlDeviceGetSamples"
    polls = [p for p in g.get("polls") or [] if p[1] is not None]
    if len(polls) >= 3:
        return ([[p[0], p[1]] for p in polls], [[p[0], p[2]] for p in polls if p[2] is not None],
                "nvmlDeviceGetUtilizationRates (polls)")
    return [], [], "none"


def _gpu_stats(g: dict[str, Any], start: float, end: float) -> dict[str, Any]:
    import statistics  # noqa: PLC0415 - only where GPU evidence is read
    util, mem_util, source = utilization_series(g)
    period = sample_period_s(util)
    st: dict[str, Any] = {"sample_period_s": period, "samples": 0, "busy_fraction": None,
                          "memory_busy_fraction": None, "utilization_source": source}
    if period:
        pers = periods(util, period, start, end)
        total = sum(t1 - t0 for t0, t1, _ in pers)
        if pers and total > 0:
            busy_s = sum((t1 - t0) * v / 100.0 for t0, t1, v in pers)
            runs = idle_runs(pers, period)
            resolved = sum(b - a for a, b in runs)
            lengths = sorted(b - a for a, b in runs)
            st.update({
                "samples": len(pers), "observed_seconds": round(total, 3),
                "busy_fraction": round(busy_s / total, 4), "idle_fraction": round(1 - busy_s / total, 4),
                "busy_seconds": round(busy_s, 3), "idle_seconds": round(total - busy_s, 3),
                "idle_intervals": runs,
                # Idle time inside periods that were partly busy: gaps shorter than one period,
                # which NVML cannot place within the period.
                "idle_seconds_unresolved": round(total - busy_s - resolved, 3),
                "idle_seconds_in_idle_periods": round(resolved, 3),
                "idle_interval_seconds": {
                    "count": len(lengths), "longest": round(lengths[-1], 3) if lengths else 0.0,
                    "median": round(statistics.median(lengths), 3) if lengths else 0.0,
                    "total": round(resolved, 3)},
                "utilization_histogram": {label: sum(1 for _a, _b, v in pers if lo <= v <= hi)
                                          for lo, hi, label in UTIL_BINS},
                "utilization": [[round(t1, 4), v] for _t0, t1, v in pers],
            })
        mpers = periods(mem_util, period, start, end)
        mtotal = sum(t1 - t0 for t0, t1, _ in mpers)
        if mtotal > 0:
            st["memory_busy_fraction"] = round(sum((t1 - t0) * v / 100.0 for t0, t1, v in mpers) / mtotal, 4)
    dev = g.get("device") or {}
    polls = g.get("polls") or []
    in_poll = [i for i, p in enumerate(polls) if start <= p[0] / 1e6 <= end + 1.0]

    def at_polls(key: str) -> list[Any]:
        vals = g.get(key)
        if not isinstance(vals, list):
            return []
        return [vals[i] for i in in_poll if i < len(vals) and vals[i] is not None]

    rx, tx = at_polls("pcie_rx_kbs"), at_polls("pcie_tx_kbs")
    st["pcie"] = {"rx_kbs_mean": round(statistics.fmean(rx)) if rx else None,
                  "tx_kbs_mean": round(statistics.fmean(tx)) if tx else None,
                  "rx_gbps_mean": round(statistics.fmean(rx) * 1e3 / 1e9, 3) if rx else None,
                  "tx_gbps_mean": round(statistics.fmean(tx) * 1e3 / 1e9, 3) if tx else None,
                  "rx_kbs_max": max(rx) if rx else None, "readings": len(rx),
                  "link_gbps": pcie_link_gbps(dev.get("pcie_gen"), dev.get("pcie_width"))}
    used = at_polls("mem_used") or ([dev["mem_used"]] if dev.get("mem_used") else [])
    power = at_polls("power_mw") or ([dev["power_mw"]] if dev.get("power_mw") else [])
    temp = at_polls("temp_c") or ([dev["temp_c"]] if dev.get("temp_c") is not None else [])
    reasons = at_polls("clocks_event_reasons")
    if not reasons and isinstance(dev.get("clocks_event_reasons"), int):
        reasons = [dev["clocks_event_reasons"]]
    seen: dict[str, int] = {}
    for m in reasons:
        for name in decode_clock_reasons(m):
            seen[name] = seen.get(name, 0) + 1
    clocks = [c for c in at_polls("sm_clock_mhz") if isinstance(c, (int, float)) and not isinstance(c, bool)]
    st.update({
        "sm_clock_mhz_mean": round(statistics.fmean(clocks), 1) if clocks else None,
        "sm_clock_mhz_min": min(clocks) if clocks else None,
        "max_sm_clock_mhz": dev.get("max_sm_clock_mhz") if isinstance(dev.get("max_sm_clock_mhz"), int) else None,
        **_counter_deltas(g),
        "memory_used_mb": round(max(used) / 2**20, 1) if used else None,
        "power_w_mean": round(statistics.fmean(power) / 1e3, 1) if power else None,
        "power_limit_w": round(dev["power_limit_mw"] / 1e3, 1) if dev.get("power_limit_mw") else None,
        "temperature_c_max": max(temp) if temp else None,
        # Reason -> share of the readings that showed it (gpu_idle and sw_power_cap are common).
        "clocks_event_reasons": {k: round(v / len(reasons), 3) for k, v in seen.items()} if reasons else {},
        "polls": len(in_poll),
    })
    return st


def _counter_deltas(g: dict[str, Any]) -> dict[str, Any]:
    """PCIe replays and ECC errors counted over the window (end - start), and the uncorrected total."""
    a, b = g.get("counters_start") or {}, g.get("counters_end") or {}

    def delta(k: str) -> int | None:
        x, y = a.get(k), b.get(k)
        ok = all(isinstance(v, int) and not isinstance(v, bool) for v in (x, y))
        return max(0, y - x) if ok else None
    total = b.get("ecc_uncorrected") if isinstance(b.get("ecc_uncorrected"), int) else None
    return {"pcie_replays": delta("pcie_replays"), "ecc_corrected": delta("ecc_corrected"),
            "ecc_uncorrected": delta("ecc_uncorrected"), "ecc_uncorrected_total": total}


@parser("NVML values analyse")
def analyse(raw: dict[str, Any]) -> dict[str, Any]:
    """Pure: nvml.json (either layout) -> the `gpu` evidence."""
    import statistics  # noqa: PLC0415 - only where GPU evidence is read
    d = normalise(raw)
    start, end = _window(d)
    target_pids = {int(p) for p in (d.get("watched_pids") or []) if p is not None}
    main_pid = d.get("pid")
    gpus, processes, per_gpu, util, mem_util, proc_rows = [], [], {}, {}, {}, []
    notes: list[str] = []
    uses_of: dict[int, set[int]] = {}
    for g in d["gpus"]:
        idx = int(g["index"])
        dev = g.get("device") or {}
        numa = dev.get("numa_node")
        gpus.append({
            "index": idx, "name": dev.get("name"), "uuid": dev.get("uuid"), "bus_id": dev.get("bus_id", dev.get("busid")),
            "pcie": {"gen": dev.get("pcie_gen"), "width": dev.get("pcie_width"),
                     "max_gen": dev.get("pcie_max_gen"), "max_width": dev.get("pcie_max_width"),
                     "link_gbps": pcie_link_gbps(dev.get("pcie_gen"), dev.get("pcie_width")),
                     "max_link_gbps": pcie_link_gbps(dev.get("pcie_max_gen"), dev.get("pcie_max_width"))},
            "cpu_affinity": cpulist_from_words(dev.get("cpu_affinity_words")),
            "numa_node": numa if isinstance(numa, int) and numa >= 0 else None,
            "memory_total_mb": round(dev["mem_total"] / 2**20) if dev.get("mem_total") else None,
            "errors": dict(g.get("errors") or {}),
        })
        stats = _gpu_stats(g, start, end)
        util[idx] = stats.pop("utilization", [])
        period = stats.get("sample_period_s")
        mem_util[idx] = [[t1, v] for _t0, t1, v in periods(utilization_series(g)[1], period, start, end)] if period else []
        per_gpu[idx] = stats
        # Which PIDs hold a context on this GPU (process lists) or used it (per-process samples).
        pids: dict[int, dict[str, Any]] = {}
        for ts, pid, kind, used in g.get("processes") or []:
            row = pids.setdefault(int(pid), {"pid": int(pid), "gpu_index": idx, "kind": kind, "used_memory_mb": None})
            if used is not None:
                row["used_memory_mb"] = round(used / 2**20, 1)
        by_pid: dict[int, list[tuple[int, int]]] = {}
        for ts, pid, sm, mem in g.get("proc_util") or []:
            pids.setdefault(int(pid), {"pid": int(pid), "gpu_index": idx, "kind": "sampled", "used_memory_mb": None})
            if start - 1.0 <= ts / 1e6 <= end + 1.0:
                by_pid.setdefault(int(pid), []).append((sm, mem))
        for pid, vals in sorted(by_pid.items()):
            proc_rows.append({"pid": pid, "gpu_index": idx, "samples": len(vals),
                              "sm_pct_mean": round(statistics.fmean(v[0] for v in vals), 1),
                              "memory_pct_mean": round(statistics.fmean(v[1] for v in vals), 1),
                              "target": pid in target_pids})
        processes.extend(sorted(pids.values(), key=lambda r: r["pid"]))
        uses_of[idx] = set(pids)
    target_gpus = sorted(i for i, pids in uses_of.items() if pids & target_pids)
    maps_cuda = d.get("target_maps_cuda")
    devices = d.get("target_gpu_devices")       # None: not read (older capture, or not permitted)
    how = "the target's PIDs in NVML's process lists" if target_gpus else None
    if not target_gpus:
        if maps_cuda and devices is not None and not any(x[len("/dev/nvidia"):][:1].isdigit() for x in devices):
            # A CUDA build of torch maps libcudart in every process that imports it; a process that
            # computes on a GPU holds /dev/nvidiaN open. None open: it used no GPU in this window.
            notes.append(f"PID {main_pid} has CUDA libraries loaded but no GPU device open "
                         "(no /dev/nvidiaN among its files): it does not use a GPU, so no GPU time is attributed")
        elif maps_cuda and len(gpus) == 1:
            target_gpus = [gpus[0]["index"]]
            how = "assumed: the only GPU, and the target has CUDA loaded"
            notes.append(f"PID {main_pid} is in no NVML process list (another PID namespace, e.g. a container?); "
                         "assuming it uses the host's only GPU")
        elif maps_cuda:
            notes.append(f"PID {main_pid} has CUDA loaded but is in no NVML process list (another PID namespace?); "
                         "which of the GPUs it uses is unknown, so GPU idle time is not attributed")
        else:
            notes.append(f"PID {main_pid} and its children use no GPU (no NVML context, no CUDA library mapped)")
    busy = [per_gpu[i]["busy_fraction"] for i in target_gpus if per_gpu[i].get("busy_fraction") is not None]
    busy_fraction = round(statistics.fmean(busy), 4) if busy else None
    periods_s = [per_gpu[i]["sample_period_s"] for i in (target_gpus or list(per_gpu)) if per_gpu[i]["sample_period_s"]]
    period = max(periods_s) if periods_s else None
    intervals: list[list[float]] | None = None
    for i in target_gpus:
        runs = per_gpu[i].get("idle_intervals") or []
        intervals = runs if intervals is None else intersect(intervals, runs)
    if period:
        names = sorted({g["name"] for g in gpus if g.get("name")})
        notes.append(f"NVML samples GPU utilization every {period * 1000:.0f} ms"
                     + (f" on this {', '.join(names)}" if names else "")
                     + f": idle gaps shorter than {period * 1000:.0f} ms cannot be resolved from NVML alone; "
                       "within a sample period only the idle share is known")
    for i in target_gpus:
        if per_gpu[i].get("utilization_source", "").startswith("nvmlDeviceGetUtilizationRates"):
            notes.append(f"GPU {i} keeps no NVML utilization sample buffer here "
                         f"({gpus[[x['index'] for x in gpus].index(i)]['errors'].get('gpu_util', 'no samples')}); "
                         "busy shares come from one reading per poll")
    others = [r for r in proc_rows if not r["target"] and r["gpu_index"] in target_gpus and r["sm_pct_mean"] >= 5]
    if others:
        notes.append("other processes also use the target's GPU: " + ", ".join(
            f"PID {r['pid']} ({r['sm_pct_mean']:.0f}% SM)" for r in others[:4]))
    return {
        "driver": (d.get("system") or {}).get("driver"),
        "nvml_version": (d.get("system") or {}).get("nvml_version"),
        "cuda_driver_version": (d.get("system") or {}).get("cuda_driver_version"),
        "gpus": gpus,
        "processes": processes,
        "process_utilization": proc_rows,
        "target_pid": main_pid,
        "target_gpus": target_gpus,
        "target_gpus_from": how,
        "window": {"start_unix": round(start, 4), "end_unix": round(end, 4), "seconds": round(end - start, 3)},
        "sample_period_s": period,
        "busy_fraction": busy_fraction,
        "idle_fraction": round(1 - busy_fraction, 4) if busy_fraction is not None else None,
        "idle_intervals": intervals or [],
        "utilization": util,
        "memory_utilization": mem_util,
        "per_gpu": per_gpu,
        "errors": dict(d.get("errors") or {}),
        "notes": notes,
    }
