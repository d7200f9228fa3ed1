"""The one door to NVML (pynvml from the nvidia-ml-py distribution).

Every NVML call goes through `Nvml.call`, which turns NVML errors into an NA value with a reason
("not supported on this GPU", "no NVIDIA driver") instead of an exception, and bounds each call with
a timeout so a hung driver cannot hang trainprobe. pynvml is imported only here, and only when a
session opens.
"""
from __future__ import annotations

import queue
import os
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

from trainprobe.probes.errors import Unavailable


@dataclass(frozen=True)
class NA:
    """A metric that could not be read, and why. Falsy, so `value or default` works."""

    reason: str

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return f"NA({self.reason!r})"


def is_na(v: Any) -> bool:
    return isinstance(v, NA)


def _nvml_thread(jobs: "queue.Queue[Any]") -> None:
    while True:
        job = jobs.get()
        if job is None:
            return
        fn, args, box, done = job
        c0 = time.thread_time()
        try:
            box["v"] = fn(*args)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            box["e"] = exc
        box["cpu"] = time.thread_time() - c0
        done.set()


def _device_nodes() -> bool:
    return any(os.path.exists(p) for p in ("/dev/nvidiactl", "/dev/nvidia0", "/proc/driver/nvidia"))


def _driver_library_loads() -> bool:
    """Whether the NVML library pynvml loads on Linux (`libnvidia-ml.so.1`, found the way the
    dynamic loader finds it) can be loaded."""
    # Without the driver's device nodes NVML cannot work, whatever library is installed: say so
    # without loading ctypes (a diagnose on a CPU host pays nothing for the GPU probe's check).
    if not _device_nodes():
        return False
    import ctypes  # noqa: PLC0415

    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


def _reason(exc: BaseException, pynvml: Any) -> str:
    code = getattr(exc, "value", None)
    if pynvml is not None and code is not None:
        for name, text in _REASONS.items():
            if getattr(pynvml, name, object()) == code:
                return text
    msg = str(exc) or type(exc).__name__
    return msg


_REASONS = {
    "NVML_ERROR_NOT_SUPPORTED": "not supported on this GPU or driver",
    "NVML_ERROR_NO_PERMISSION": "permission denied (needs root)",
    "NVML_ERROR_DRIVER_NOT_LOADED": "no NVIDIA driver loaded",
    "NVML_ERROR_LIBRARY_NOT_FOUND": "no NVIDIA driver: libnvidia-ml.so not found",
    "NVML_ERROR_GPU_IS_LOST": "the GPU has fallen off the bus",
    "NVML_ERROR_NOT_FOUND": "not found",
    "NVML_ERROR_FUNCTION_NOT_FOUND": "this driver lacks the function",
    "NVML_ERROR_TIMEOUT": "timed out",
    "NVML_ERROR_INVALID_ARGUMENT": "invalid argument",
    "NVML_ERROR_UNINITIALIZED": "NVML not initialised",
}


class Nvml:
    """An NVML session: `with Nvml() as n: n.call("nvmlDeviceGetCount")`.

    Opening raises Unavailable with one actionable line when there is no pynvml, no driver or no
    GPU; every later call returns a value or an NA.
    """

    def __init__(self, timeout_s: float = 5.0):
        self.timeout_s = timeout_s
        self.pynvml: Any = None
        self._jobs: "queue.Queue[Any] | None" = None
        self._last_cpu_s = 0.0
        # Every call, by NVML function: count, wall seconds, CPU seconds of the calling thread.
        self.calls_by_name: dict[str, list[float]] = {}

    def __enter__(self) -> "Nvml":
        self.open()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def open(self) -> None:
        if "pynvml" not in sys.modules and sys.platform.startswith("linux") and not _driver_library_loads():
            # pynvml's import (about 10 ms of CPU) is not worth paying for the answer "no driver".
            raise Unavailable(_REASONS["NVML_ERROR_LIBRARY_NOT_FOUND"] if _device_nodes() else
                              "no NVIDIA driver: no /dev/nvidiactl, /dev/nvidia0 or /proc/driver/nvidia "
                              "(libnvidia-ml.so not loaded)")
        try:
            import pynvml  # noqa: PLC0415 - heavy and optional: only when a GPU probe runs
        except ImportError:
            raise Unavailable("pynvml not installed: `pip install nvidia-ml-py`") from None
        self.pynvml = pynvml
        try:
            self._bounded(pynvml.nvmlInit)
        except Unavailable:
            raise
        except Exception as exc:  # noqa: BLE001 - NVMLError and OSError alike
            reason = _reason(exc, pynvml)
            if reason.startswith("no NVIDIA driver"):
                raise Unavailable(reason) from None
            if "not found" in reason.lower() or "shared library" in str(exc).lower():
                raise Unavailable(f"no NVIDIA driver ({reason})") from None
            raise Unavailable(f"NVML initialisation failed: {reason}") from None

    def close(self) -> None:
        if self._jobs is not None:
            self._jobs.put(None)
            self._jobs = None
        if self.pynvml is not None:
            try:
                self.pynvml.nvmlShutdown()
            except Exception:  # noqa: BLE001
                pass
            self.pynvml = None

    def _bounded(self, fn: Any, *args: Any) -> Any:
        """Run fn on the session's one NVML thread, waiting at most timeout_s. A thread per call
        cost more CPU than most calls; a hung call leaves its thread behind and the next call
        starts a fresh one."""
        if self._jobs is None:
            self._jobs = queue.Queue()
            threading.Thread(target=_nvml_thread, args=(self._jobs,), daemon=True, name="nvml-calls").start()
        box: dict[str, Any] = {}
        done = threading.Event()
        self._jobs.put((fn, args, box, done))
        if not done.wait(self.timeout_s):
            self._jobs = None           # abandon the hung thread (it exits if the call ever returns)
            raise Unavailable(f"NVML call {getattr(fn, '__name__', fn)} did not return within {self.timeout_s:g} s")
        self._last_cpu_s = box.get("cpu", 0.0)
        if "e" in box:
            raise box["e"]
        return box.get("v")

    def _count(self, name: str, wall_s: float, cpu_s: float) -> None:
        c = self.calls_by_name.setdefault(name, [0, 0.0, 0.0])
        c[0] += 1
        c[1] += wall_s
        c[2] += cpu_s

    def accounting(self) -> dict[str, Any]:
        """Every NVML call this session made: how many, their wall time and the CPU they used."""
        by = {k: {"calls": int(v[0]), "seconds": round(v[1], 4), "cpu_seconds": round(v[2], 4)}
              for k, v in sorted(self.calls_by_name.items())}
        return {"nvml_calls": sum(d["calls"] for d in by.values()),
                "nvml_call_seconds": round(sum(d["seconds"] for d in by.values()), 4),
                "nvml_call_cpu_seconds": round(sum(d["cpu_seconds"] for d in by.values()), 4),
                "nvml_calls_by_name": by}

    def call(self, name: str, *args: Any) -> Any:
        """Call pynvml.<name>(*args); return its value, or NA(reason) on any NVML error."""
        if self.pynvml is None:
            return NA("NVML not initialised")
        fn = getattr(self.pynvml, name, None)
        if fn is None:
            return NA(f"{name} not in this pynvml")
        m0 = time.monotonic()
        self._last_cpu_s = 0.0
        try:
            return self._bounded(fn, *args)
        except Unavailable as exc:
            return NA(str(exc))
        except Exception as exc:  # noqa: BLE001 - NVMLError subclasses, ctypes errors
            return NA(_reason(exc, self.pynvml))
        finally:
            self._count(name, time.monotonic() - m0, self._last_cpu_s)

    def const(self, name: str, default: Any = None) -> Any:
        return getattr(self.pynvml, name, default) if self.pynvml is not None else default


# -- the device facts diagnose's gpu probe and preflight's gpuhealth reader both read ----------------

def read_device_identity(call: Any, handle: Any) -> dict[str, Any]:
    """A GPU's name, UUID and PCI bus id (NVML's form, '00000000:18:00.0'; probes.parsers.hw.canonical_bdf
    gives sysfs'). `call(what, nvml_function, *args)` is the caller's bounded call: it returns the
    value, or an NA (or None) when NVML could not say."""
    name = call("name", "nvmlDeviceGetName", handle)
    uuid = call("uuid", "nvmlDeviceGetUUID", handle)
    pci = call("pci", "nvmlDeviceGetPciInfo", handle)
    return {"name": name, "uuid": uuid,
            "bus_id": pci if pci is None or is_na(pci) else getattr(pci, "busId", pci)}


def read_pcie_link(call: Any, handle: Any) -> dict[str, Any]:
    """A GPU's current and maximum PCIe generation and width, as NVML reports them."""
    return {"gen": call("pcie_gen", "nvmlDeviceGetCurrPcieLinkGeneration", handle),
            "width": call("pcie_width", "nvmlDeviceGetCurrPcieLinkWidth", handle),
            "max_gen": call("pcie_max_gen", "nvmlDeviceGetMaxPcieLinkGeneration", handle),
            "max_width": call("pcie_max_width", "nvmlDeviceGetMaxPcieLinkWidth", handle)}


# NVML's clock and error-counter enums (the values nvml.h defines; used where pynvml lacks a name).
CLOCK_SM = 1                      # NVML_CLOCK_SM
MEMORY_ERROR_UNCORRECTED = 1      # NVML_MEMORY_ERROR_TYPE_UNCORRECTED
MEMORY_ERROR_CORRECTED = 0        # NVML_MEMORY_ERROR_TYPE_CORRECTED
VOLATILE_ECC = 0                  # NVML_VOLATILE_ECC: counts since the driver loaded


def read_max_sm_clock(call: Any, const: Any, handle: Any) -> Any:
    """The GPU's maximum SM clock in MHz (nvmlDeviceGetMaxClockInfo)."""
    return call("max_sm_clock", "nvmlDeviceGetMaxClockInfo", handle, const("NVML_CLOCK_SM", CLOCK_SM))


def read_sm_clock(call: Any, const: Any, handle: Any) -> Any:
    """The GPU's current SM clock in MHz (nvmlDeviceGetClockInfo)."""
    return call("sm_clock", "nvmlDeviceGetClockInfo", handle, const("NVML_CLOCK_SM", CLOCK_SM))


def read_error_counters(call: Any, const: Any, handle: Any) -> dict[str, Any]:
    """PCIe replays (nvmlDeviceGetPcieReplayCounter) and volatile ECC error counts (corrected and
    uncorrected, nvmlDeviceGetTotalEccErrors): counters, read at both ends of a window."""
    vol = const("NVML_VOLATILE_ECC", VOLATILE_ECC)
    return {"pcie_replays": call("pcie_replays", "nvmlDeviceGetPcieReplayCounter", handle),
            "ecc_corrected": call("ecc", "nvmlDeviceGetTotalEccErrors", handle,
                                  const("NVML_MEMORY_ERROR_TYPE_CORRECTED", MEMORY_ERROR_CORRECTED), vol),
            "ecc_uncorrected": call("ecc", "nvmlDeviceGetTotalEccErrors", handle,
                                    const("NVML_MEMORY_ERROR_TYPE_UNCORRECTED", MEMORY_ERROR_UNCORRECTED), vol)}
