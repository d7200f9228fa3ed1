"""The gpuhealth probe (preflight): passive GPU health reads through NVML, one JSON-able dict per node.

Reads, for every GPU NVML sees: identity, persistence/compute/MIG mode, ECC mode and error counts
(total, DRAM, SRAM; volatile and aggregate), row remapping, retired pages, GPU recovery action,
clock-event reasons, temperature and its thresholds, power and its limits, PCIe link (current,
maximum, replays), NVLink state and error counters where present, processes and memory already on
the GPU, CPU affinity and NUMA node. Every call goes through probes.support.nvml.Nvml.call (bounded by a
timeout, NVML errors become NA). After one call hangs, the rest are skipped rather than each
waiting out its own timeout. Nothing is changed on the GPU. Cost: a few hundred NVML calls,
typically well under a second for 8 GPUs.

The result is plain JSON (an unreadable value is {"na": "why"}), recorded as the capture's
`nvml.json` artifact, so it can be saved with `trainprobe preflight --save` and judged again with
`--replay`.
"""
from __future__ import annotations

import os
import time
from contextlib import contextmanager
from typing import Any, Callable, ClassVar, Iterator

from trainprobe.probes.base import Availability, ReadingProbe, Recorder, WatchSpec, reads_schema
from trainprobe.probes.errors import Unavailable
from trainprobe.probes.support.nvml import NA, Nvml, is_na, read_device_identity, read_pcie_link
from trainprobe.probes.parsers.hw import cpus_from_nvml_words, format_cpulist, nvml_affinity_words

SCHEMA = "trainprobe.gpuhealth/1"
# A captured tree (--root / TRAINPROBE_ROOT) holds files, not a driver: NVML and torch would read
# this machine's devices instead, so under a tree the device reads say so and read nothing.
TREE_NO_DEVICES = "no NVIDIA driver in a captured tree (NVML and CUDA read only the live host)"


def na(value: Any) -> bool:
    """True for an unreadable value, live (NA) or replayed ({'na': reason})."""
    return is_na(value) or (isinstance(value, dict) and set(value) == {"na"})


def na_reason(value: Any) -> str | None:
    if is_na(value):
        return value.reason
    if isinstance(value, dict) and set(value) == {"na"}:
        return value["na"]
    return None


def _plain(v: Any) -> Any:
    """NVML return values -> JSON: NA -> {'na': reason}, bytes -> str, ctypes arrays -> lists."""
    if is_na(v):
        return {"na": v.reason}
    if isinstance(v, bytes):
        return v.decode(errors="replace")
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    try:
        return [int(x) for x in v]  # a ctypes array
    except TypeError:
        return str(v)


class _Reader:
    def __init__(self, nv: Nvml):
        self.nv = nv
        self.hung: str | None = None
        self.calls = 0
        self.timing: dict[str, float] = {}

    def call(self, name: str, *args: Any) -> Any:
        if self.hung:
            return NA(f"skipped: an earlier NVML call hung ({self.hung})")
        self.calls += 1
        v = self.nv.call(name, *args)
        if is_na(v) and "did not return within" in v.reason:
            self.hung = name
        return v

    def call_what(self, what: str, name: str, *args: Any) -> Any:
        """`call` in the shape the shared device readers of probes.support.nvml use."""
        return self.call(name, *args)

    @contextmanager
    def timed(self, group: str) -> Iterator[None]:
        t0 = time.monotonic()
        try:
            yield
        finally:
            self.timing[group] = round(self.timing.get(group, 0.0) + time.monotonic() - t0, 6)

    def c(self, name: str, default: Any = None) -> Any:
        return self.nv.const(name, default)


def _field_value(fv: Any) -> Any:
    """One c_nvmlFieldValue_t -> its number, or {'na': ...} when NVML returned an error for it."""
    if getattr(fv, "nvmlReturn", 0) != 0:
        return {"na": f"field {getattr(fv, 'fieldId', '?')}: NVML error {fv.nvmlReturn}"}
    vt = getattr(fv, "valueType", 1)
    val = fv.value
    return {0: lambda: val.dVal, 1: lambda: val.uiVal, 2: lambda: val.ulVal, 3: lambda: val.ullVal,
            4: lambda: val.sllVal, 5: lambda: val.siVal, 6: lambda: val.usVal}.get(vt, lambda: val.ullVal)()


def _read_device(r: _Reader, index: int, ncpu_words: int) -> dict[str, Any]:
    h = r.call("nvmlDeviceGetHandleByIndex", index)
    if is_na(h):
        return {"index": index, "handle": {"na": h.reason}}
    d: dict[str, Any] = {"index": index}
    with r.timed("identity"):
        d.update({k: _plain(v) for k, v in read_device_identity(r.call_what, h).items()})
        d["vbios"] = _plain(r.call("nvmlDeviceGetVbiosVersion", h))
    with r.timed("modes"):
        d["persistence_mode"] = _plain(r.call("nvmlDeviceGetPersistenceMode", h))
        d["compute_mode"] = _plain(r.call("nvmlDeviceGetComputeMode", h))
        d["mig_mode"] = _plain(r.call("nvmlDeviceGetMigMode", h))
    with r.timed("ecc"):
        d["ecc_mode"] = _plain(r.call("nvmlDeviceGetEccMode", h))
        unc, cor = r.c("NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1), r.c("NVML_MEMORY_ERROR_TYPE_CORRECTED", 0)
        vol, agg = r.c("NVML_VOLATILE_ECC", 0), r.c("NVML_AGGREGATE_ECC", 1)
        ecc: dict[str, Any] = {}
        for cname, counter in (("volatile", vol), ("aggregate", agg)):
            ecc[cname] = {
                "uncorrected": _plain(r.call("nvmlDeviceGetTotalEccErrors", h, unc, counter)),
                "corrected": _plain(r.call("nvmlDeviceGetTotalEccErrors", h, cor, counter)),
            }
            for loc in ("DRAM", "SRAM"):
                lc = r.c(f"NVML_MEMORY_LOCATION_{loc}")
                if lc is None:
                    continue
                ecc[cname][f"{loc.lower()}_uncorrected"] = _plain(
                    r.call("nvmlDeviceGetMemoryErrorCounter", h, unc, counter, lc))
                ecc[cname][f"{loc.lower()}_corrected"] = _plain(
                    r.call("nvmlDeviceGetMemoryErrorCounter", h, cor, counter, lc))
        d["ecc"] = ecc
    with r.timed("remap"):
        rows = r.call("nvmlDeviceGetRemappedRows", h)
        if is_na(rows):
            d["remapped_rows"] = {"na": rows.reason}
        else:
            corr, uncorr, pending, failure = rows
            d["remapped_rows"] = {"correctable": int(corr), "uncorrectable": int(uncorr),
                                  "pending": bool(pending), "failure": bool(failure)}
        sbe = r.call("nvmlDeviceGetRetiredPages", h, r.c("NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS", 0))
        dbe = r.call("nvmlDeviceGetRetiredPages", h, r.c("NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR", 1))
        pend = r.call("nvmlDeviceGetRetiredPagesPendingStatus", h)
        d["retired_pages"] = {
            "single_bit": len(sbe) if not is_na(sbe) else {"na": sbe.reason},
            "double_bit": len(dbe) if not is_na(dbe) else {"na": dbe.reason},
            "pending": _plain(pend) if is_na(pend) else bool(pend),
        }
        fid = r.c("NVML_FI_DEV_GET_GPU_RECOVERY_ACTION")
        if fid is None:
            d["recovery_action"] = {"na": "this pynvml lacks NVML_FI_DEV_GET_GPU_RECOVERY_ACTION"}
        else:
            fv = r.call("nvmlDeviceGetFieldValues", h, [fid])
            d["recovery_action"] = {"na": fv.reason} if is_na(fv) else _field_value(fv[0])
    with r.timed("clocks"):
        reasons = r.call("nvmlDeviceGetCurrentClocksEventReasons", h)
        if is_na(reasons):
            reasons = r.call("nvmlDeviceGetCurrentClocksThrottleReasons", h)
        d["clocks_event_reasons"] = _plain(reasons)
        d["sm_clock_mhz"] = _plain(r.call("nvmlDeviceGetClockInfo", h, r.c("NVML_CLOCK_SM", 1)))
        d["sm_clock_max_mhz"] = _plain(r.call("nvmlDeviceGetMaxClockInfo", h, r.c("NVML_CLOCK_SM", 1)))
    with r.timed("thermal_power"):
        d["temperature_c"] = _plain(r.call("nvmlDeviceGetTemperature", h, r.c("NVML_TEMPERATURE_GPU", 0)))
        d["temperature_slowdown_c"] = _plain(r.call(
            "nvmlDeviceGetTemperatureThreshold", h, r.c("NVML_TEMPERATURE_THRESHOLD_SLOWDOWN", 1)))
        d["temperature_shutdown_c"] = _plain(r.call(
            "nvmlDeviceGetTemperatureThreshold", h, r.c("NVML_TEMPERATURE_THRESHOLD_SHUTDOWN", 0)))
        d["power_mw"] = _plain(r.call("nvmlDeviceGetPowerUsage", h))
        d["power_limit_mw"] = _plain(r.call("nvmlDeviceGetEnforcedPowerLimit", h))
        d["power_default_limit_mw"] = _plain(r.call("nvmlDeviceGetPowerManagementDefaultLimit", h))
    with r.timed("pcie"):
        d["pcie"] = {
            **{k: _plain(v) for k, v in read_pcie_link(r.call_what, h).items()},
            "gpu_max_gen": _plain(r.call("nvmlDeviceGetGpuMaxPcieLinkGeneration", h)),
            "replay_counter": _plain(r.call("nvmlDeviceGetPcieReplayCounter", h)),
        }
    with r.timed("nvlink"):
        d["nvlink"] = _read_nvlink(r, h)
    with r.timed("processes"):
        procs: list[dict[str, Any]] = []
        errors: dict[str, str] = {}
        for kind, fn in (("compute", "nvmlDeviceGetComputeRunningProcesses"),
                         ("graphics", "nvmlDeviceGetGraphicsRunningProcesses")):
            ps = r.call(fn, h)
            if is_na(ps):
                errors[kind] = ps.reason
                continue
            for p in ps:
                used = getattr(p, "usedGpuMemory", None)
                procs.append({"pid": int(p.pid), "type": kind,
                              "used_memory_bytes": int(used) if isinstance(used, int) else None})
        d["processes"] = procs
        if errors:
            d["processes_errors"] = errors
        mem = r.call("nvmlDeviceGetMemoryInfo", h, r.c("nvmlMemory_v2"))
        if is_na(mem):
            mem = r.call("nvmlDeviceGetMemoryInfo", h)
        d["memory"] = {"na": mem.reason} if is_na(mem) else {
            "total": int(mem.total), "used": int(mem.used), "free": int(mem.free),
            "reserved": int(getattr(mem, "reserved", 0)) if hasattr(mem, "reserved") else None}
    with r.timed("affinity"):
        words = r.call("nvmlDeviceGetCpuAffinity", h, ncpu_words)
        if is_na(words):
            d["cpu_affinity"] = {"na": words.reason}
        else:
            w = [int(x) for x in words]
            d["cpu_affinity"] = {"words": w, "cpulist": format_cpulist(cpus_from_nvml_words(w))}
        d["numa_node"] = _plain(r.call("nvmlDeviceGetNumaNodeId", h))
    return d


def _read_nvlink(r: _Reader, h: Any) -> dict[str, Any]:
    links: list[dict[str, Any]] = []
    max_links = r.c("NVML_NVLINK_MAX_LINKS", 18)
    counters = {"replay": r.c("NVML_NVLINK_ERROR_DL_REPLAY", 0), "recovery": r.c("NVML_NVLINK_ERROR_DL_RECOVERY", 1),
                "crc_flit": r.c("NVML_NVLINK_ERROR_DL_CRC_FLIT", 2), "crc_data": r.c("NVML_NVLINK_ERROR_DL_CRC_DATA", 3)}
    first_reason = None
    for link in range(max_links):
        st = r.call("nvmlDeviceGetNvLinkState", h, link)
        if is_na(st):
            if link == 0:
                first_reason = st.reason
            break  # links are numbered from 0: the first unsupported one ends the list
        rec: dict[str, Any] = {"link": link, "active": bool(st)}
        if st:
            rec["errors"] = {k: _plain(r.call("nvmlDeviceGetNvLinkErrorCounter", h, link, c))
                             for k, c in counters.items()}
        links.append(rec)
    if not links:
        return {"supported": False, "reason": first_reason or "no NVLink"}
    return {"supported": True, "links": links}


def read_gpus(indices: list[int] | None = None, call_timeout_s: float = 5.0,
              nvml_factory: Callable[[float], Nvml] = Nvml) -> dict[str, Any]:
    """All passive NVML reads for the node. NVML that cannot start is a value ({'error': ...})."""
    t0 = time.time()
    out: dict[str, Any] = {"schema": SCHEMA, "read_unix": round(t0, 3), "error": None, "driver": None,
                           "count": None, "gpus": [], "timing": {}}
    nv = nvml_factory(call_timeout_s)
    try:
        nv.open()
    except Unavailable as exc:
        out["error"] = str(exc)
        return out
    r = _Reader(nv)
    try:
        with r.timed("system"):
            out["driver"] = _plain(r.call("nvmlSystemGetDriverVersion"))
            out["cuda_driver_version"] = _plain(r.call("nvmlSystemGetCudaDriverVersion"))
            out["nvml_version"] = _plain(r.call("nvmlSystemGetNVMLVersion"))
            count = r.call("nvmlDeviceGetCount")
        out["count"] = _plain(count)
        if not is_na(count):
            ncpu_words = nvml_affinity_words(os.cpu_count() or 1)
            for i in range(int(count)):
                if indices is not None and i not in indices:
                    continue
                out["gpus"].append(_read_device(r, i, ncpu_words))
        out["nvml_calls"] = r.calls
        if r.hung:
            out["hung_call"] = r.hung
    finally:
        out["timing"] = r.timing
        out["seconds"] = round(time.time() - t0, 6)
        if r.hung:
            # A driver that hung once may hang shutdown too: bound it like any other call.
            nv.call("nvmlShutdown")
            nv.pynvml = None
        else:
            nv.close()
    return out


class GpuHealthProbe(ReadingProbe):
    """Every GPU's passive health through NVML: one read, bounded call by call."""

    name = "gpuhealth"
    description = "GPU health through NVML: ECC, remapped rows, clocks, PCIe and NVLink, processes"
    needs = ("NVIDIA driver (NVML)",)
    cost = "a few hundred NVML calls, well under a second for 8 GPUs; nothing is changed on the GPU"
    timeout_s = 30.0
    reads = {"nvml": "NVML"}
    evidence_schema = reads_schema("GpuHealthReads", reads)
    nvml_factory: ClassVar[Callable[[float], Nvml]] = Nvml     # the one door to NVML

    def check(self, spec: WatchSpec) -> Availability:
        # NVML that cannot start is a value of the read, not a skip: the GPU checks compare it
        # with the GPUs on the PCI bus and fail closed.
        return Availability.yes()

    def read(self, name: str, spec: WatchSpec, rec: Recorder) -> Any:
        if spec.root != "/":
            return {"schema": SCHEMA, "error": TREE_NO_DEVICES, "count": None, "gpus": [], "timing": {}}
        out = read_gpus(spec.options.get("gpus"), float(spec.options.get("nvml_call_s", 5.0)),
                        type(self).nvml_factory)
        rec.note("nvml", f"{out.get('nvml_calls', 0)} NVML calls", 0 if out["error"] is None else -1,
                 out["read_unix"], out.get("seconds", 0.0))
        return out
